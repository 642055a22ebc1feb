"""Rows written in bulk for the benchmarks that need a big PostgreSQL database: CI history (runs,
uploads, tests and their results) made by SQL inside the server, and a load run with a table's
secondary indexes and constraints dropped first and built again after (kept, every row would
update every index: most of a bulk load's time).

The schema is the real migrations' (`flaketriage.records.Database.upgrade`), and what is rebuilt is
read back from the catalog before it is dropped (``pg_get_indexdef``, ``pg_get_constraintdef``), so
a migration that adds an index is seeded with it, unchanged. Rows are made by ``INSERT ... SELECT``
over ``generate_series``: nothing goes through Python row by row.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

SEEDED = "seed-"
"""What the upload ids of seeded runs start with."""


@contextmanager
def without_indexes(conn: Any, tables: Sequence[str], say: Any = print) -> Iterator[None]:
    """`tables` loaded with their secondary indexes, unique and foreign key constraints dropped
    (primary keys are kept); all of them built again, as the migrations made them, after the
    block. On an error they stay dropped: the database is half-seeded and must be seeded again."""
    from psycopg import sql

    constraints = conn.execute(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), contype FROM pg_constraint"
        " WHERE conrelid = ANY(%s::regclass[]) AND contype IN ('u', 'f') ORDER BY contype DESC",
        (list(tables),),
    ).fetchall()
    indexes = conn.execute(
        "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index i"
        " WHERE i.indrelid = ANY(%s::regclass[]) AND NOT i.indisprimary AND NOT EXISTS ("
        "  SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid AND c.conrelid = i.indrelid"
        "  AND c.contype IN ('p', 'u', 'x'))",
        (list(tables),),
    ).fetchall()
    for table, name, _, _ in constraints:  # foreign keys first: 'f' sorts after 'u', descending
        conn.execute(
            sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(sql.SQL(table), sql.Identifier(name))
        )
    for name, _ in indexes:
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.SQL(name)))
    yield
    started = time.perf_counter()
    conn.execute("SET maintenance_work_mem = '512MB'")
    for _, definition in indexes:
        conn.execute(definition)
    for table, name, definition, _ in reversed(constraints):  # unique ones before the keys that need them
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                sql.SQL(table), sql.Identifier(name), sql.SQL(definition)
            )
        )
    conn.execute("RESET maintenance_work_mem")
    say(
        f"  rebuilt {len(indexes)} indexes and {len(constraints)} constraints"
        f" in {time.perf_counter() - started:.0f} s"
    )


@dataclass(frozen=True)
class History:
    """The shape of seeded CI history: every repository's suite of `tests` tests runs `runs` times
    over the last `days` days, in every variant (a job each, one upload per job); each upload holds
    one result per test. Test ids are ``tests/test_m<k // 50>.py::test_case_<k>`` (`test_id`).

    Tests behave by their id, the same way on every run: about 1% skipped, 7% flaky (failing 2% to
    20% of their runs, and as often passing on a retry), 1% broken (failing half their runs), the
    rest failing one run in 5,000. A share of the runs (`storms`) are storms: 60% of their tests fail."""

    repositories: tuple[str, ...] = ("acme/big",)
    variants: tuple[str, ...] = ("",)
    tests: int = 100
    runs: int = 100
    days: float = 1.0
    branches: tuple[str, ...] = ("main",)
    """Each run's branch: the first for half of the runs, the others in turn for the rest."""
    storms: float = 0.005
    """The share of runs that are storms."""

    @property
    def suites(self) -> int:
        return len(self.repositories) * len(self.variants)

    @property
    def uploads(self) -> int:
        return self.suites * self.runs

    @property
    def test_rows(self) -> int:
        return self.suites * self.tests

    @property
    def results(self) -> int:
        return self.uploads * self.tests

    @staticmethod
    def test_id(k: int) -> str:
        """The id of the `k`-th test (from 1) of a suite, as the seeded rows name it."""
        return f"tests/test_m{k // 50}.py::test_case_{k}"


TEST_ID_SQL = "'tests/test_m' || ({k} / 50) || '.py::test_case_' || {k}"
"""`History.test_id` in SQL, of an integer expression ``{k}``."""

# What a test does, by a hash of its row id (0 to 999): skipped, broken, flaky or stable.
_BEHAVIOUR = "mod(abs(hashint4(t.id)), 1000)"
_RATE = (
    f"CASE WHEN {_BEHAVIOUR} < 10 THEN 0.5"
    f" WHEN {_BEHAVIOUR} < 80 THEN 0.02 + mod({_BEHAVIOUR}, 10) * 0.02"
    " ELSE 0.0002 END"
)


def seed_history(conn: Any, history: History, say: Any = print) -> dict[str, int]:
    """Write `history` into the migrated database of `conn` (autocommit). Returns the row counts
    written: ``result_uploads``, ``tests``, ``test_results``."""
    started = time.perf_counter()
    conn.execute("SELECT setseed(0.26)")
    conn.execute("SET synchronous_commit = off")
    _runs(conn, history)
    _tests(conn, history)
    with without_indexes(conn, ["test_results"], say):
        _results(conn, history)
        say(f"  wrote {history.results:,} test results in {time.perf_counter() - started:.0f} s")
    _totals(conn)
    conn.execute("DROP TABLE seed_runs, seed_suites")
    counts = {
        table: int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
        for table in ("result_uploads", "tests", "test_results")
    }
    say(
        f"  seeded {counts['test_results']:,} results of {counts['tests']:,} tests in"
        f" {counts['result_uploads']:,} uploads in {time.perf_counter() - started:.0f} s"
    )
    return counts


def _runs(conn: Any, history: History) -> None:
    """One row per CI run (``seed_runs``), oldest first, the repositories in turn; then an upload
    per run and variant, in the order they arrived."""
    conn.execute(
        "CREATE TEMP TABLE seed_runs AS SELECT n, (%(repos)s::text[])[1 + mod(n, %(r)s)] AS repository,"
        " CASE WHEN random() < 0.5 OR %(b)s = 1 THEN (%(branches)s::text[])[1]"
        "  ELSE (%(branches)s::text[])[2 + mod(n, greatest(%(b)s - 1, 1))] END AS branch,"
        " md5('commit' || n) || substr(md5('c' || n), 1, 8) AS commit, 9000000 + n AS run_id,"
        " now() - make_interval(secs => %(span)s * (1 - n::float8 / %(total)s)) AS received_at,"
        " random() < %(storms)s AS storm"
        " FROM generate_series(1, %(total)s) n",
        {
            "repos": list(history.repositories),
            "r": len(history.repositories),
            "branches": list(history.branches),
            "b": len(history.branches),
            "span": history.days * 86400,
            "total": history.runs * len(history.repositories),
            "storms": history.storms,
        },
    )
    conn.execute(
        "INSERT INTO result_uploads (upload_id, source, repository, branch, commit, pull_request, run_id,"
        " run_url, job, attempt, variant_key, tests, failures, passed_on_retry, skipped, duration_s, lost_s,"
        " storm, totals_added, received_at)"
        " SELECT %(prefix)s || r.n || '-' || v.i, 'junit', r.repository, r.branch, r.commit,"
        " CASE WHEN r.branch <> %(main)s THEN 100 + mod(r.n, 700) END, r.run_id::text,"
        " 'https://github.com/' || r.repository || '/actions/runs/' || r.run_id,"
        " 'tests (' || CASE WHEN v.variant = '' THEN 'default' ELSE v.variant END || ')', 1, v.variant,"
        " 0, 0, 0, 0, 0, 0, r.storm, true, r.received_at + make_interval(secs => v.i)"
        " FROM seed_runs r CROSS JOIN unnest(%(variants)s::text[]) WITH ORDINALITY v(variant, i)"
        " ORDER BY r.n, v.i",
        {"prefix": SEEDED, "main": history.branches[0], "variants": list(history.variants)},
    )


def _tests(conn: Any, history: History) -> None:
    """The tests, suite after suite (so each suite's ids are one range: ``seed_suites``), with
    their real keys (`flaketriage.records.history.test_key`)."""
    conn.execute(
        "INSERT INTO tests (key, repository, test_id, variant_key, first_seen, last_seen, runs, failures,"
        " passed_on_retry, skipped, blocked_runs, duration_s, lost_s, suspected_flaky)"
        " SELECT encode(sha256(convert_to(r.repository, 'UTF8') || '\\x00'::bytea"
        "  || convert_to(t.test_id, 'UTF8') || '\\x00'::bytea || convert_to(v.variant, 'UTF8')), 'hex'),"
        " r.repository, t.test_id, v.variant, now(), now(), 0, 0, 0, 0, 0, 0, 0, false"
        " FROM unnest(%(repos)s::text[]) WITH ORDINALITY r(repository, ri)"
        " CROSS JOIN unnest(%(variants)s::text[]) WITH ORDINALITY v(variant, vi)"
        f" CROSS JOIN (SELECT k, {TEST_ID_SQL.format(k='k')} AS test_id"
        "  FROM generate_series(1, %(tests)s) k) t"
        " ORDER BY r.ri, v.vi, t.k",
        {"repos": list(history.repositories), "variants": list(history.variants), "tests": history.tests},
    )
    conn.execute(
        "CREATE TEMP TABLE seed_suites AS SELECT repository, variant_key, min(id) AS base, max(id) AS last,"
        " count(*) AS tests FROM tests GROUP BY repository, variant_key"
    )
    broken = conn.execute("SELECT count(*) FROM seed_suites WHERE last - base + 1 <> tests").fetchone()
    if broken and broken[0]:
        raise SystemExit("the seeded tests' ids are not one range per suite: seed an empty database")


def _results(conn: Any, history: History) -> None:
    """A result per test and upload, in upload order (as the receiver writes them: one test's
    results lie far apart on disk). Each suite's tests are the id range ``base ..``, so no join is
    needed to find them."""
    conn.execute(
        "INSERT INTO test_results (test_pk, upload_pk, commit, branch, outcome, attempts, failed_attempts,"
        " duration_s, lost_s, signature, quarantined, storm, received_at)"
        " SELECT id, upload_pk, commit, branch,"
        "  CASE WHEN skip THEN 'skipped' WHEN x < rate THEN 'failed' ELSE 'passed' END,"
        "  CASE WHEN skip THEN 1 WHEN x < 2 * rate THEN 2 ELSE 1 END,"
        "  CASE WHEN skip THEN 0 WHEN x < rate THEN 2 WHEN x < 2 * rate THEN 1 ELSE 0 END,"
        "  CASE WHEN skip THEN 0 ELSE duration END,"
        "  CASE WHEN skip OR x >= 2 * rate THEN 0 WHEN x < rate THEN 2 * duration ELSE duration END,"
        "  CASE WHEN NOT skip AND x < rate THEN substr(md5(id || '/' || mod((x * 1000)::int, 3)), 1, 16) END,"
        "  false, storm, received_at"
        " FROM (SELECT t.id, u.id AS upload_pk, u.commit, u.branch, u.storm, u.received_at,"
        f"  {_BEHAVIOUR} BETWEEN 990 AND 999 AS skip,"
        f"  CASE WHEN u.storm THEN 0.6 ELSE {_RATE} END AS rate,"
        "  round((0.02 + mod(abs(hashint4(t.id)), 3000) / 1000.0 * (0.8 + random() * 0.4))::numeric, 3)"
        "   ::float8 AS duration,"
        "  random() AS x"
        "  FROM (SELECT u.*, s.base FROM result_uploads u JOIN seed_suites s"
        "   ON s.repository = u.repository AND s.variant_key = u.variant_key"
        "   WHERE u.upload_id LIKE %(seeded)s ORDER BY u.id) u"
        "  CROSS JOIN LATERAL (SELECT u.base + k AS id FROM generate_series(0, %(tests)s - 1) k) t"
        " ) r",
        {"seeded": SEEDED + "%", "tests": history.tests},
    )


def _totals(conn: Any) -> None:
    """Each test's and each upload's totals, from their results (storms left out of a test's, as
    `flaketriage.records.history.add_totals` leaves them out), and each test's latest outcome."""
    conn.execute(
        "UPDATE tests t SET runs = a.runs, failures = a.failures, passed_on_retry = a.retried,"
        " skipped = a.skipped, blocked_runs = a.failures, duration_s = a.duration, lost_s = a.lost,"
        " first_seen = a.first, last_seen = a.last,"
        " suspected_flaky = a.failures * 50 > a.runs AND a.failures < a.runs - a.skipped"
        " FROM (SELECT test_pk, count(*) AS runs, count(*) FILTER (WHERE outcome = 'failed') AS failures,"
        "  count(*) FILTER (WHERE outcome = 'passed' AND failed_attempts > 0) AS retried,"
        "  count(*) FILTER (WHERE outcome = 'skipped') AS skipped, sum(duration_s) AS duration,"
        "  sum(lost_s) AS lost, min(received_at) AS first, max(received_at) AS last"
        "  FROM test_results WHERE NOT storm GROUP BY test_pk) a WHERE a.test_pk = t.id"
    )
    conn.execute(
        "UPDATE result_uploads u SET tests = a.tests, failures = a.failures, passed_on_retry = a.retried,"
        " skipped = a.skipped, duration_s = a.duration, lost_s = a.lost"
        " FROM (SELECT upload_pk, count(*) AS tests, count(*) FILTER (WHERE outcome = 'failed') AS failures,"
        "  count(*) FILTER (WHERE outcome = 'passed' AND failed_attempts > 0) AS retried,"
        "  count(*) FILTER (WHERE outcome = 'skipped') AS skipped, sum(duration_s) AS duration,"
        "  sum(lost_s) AS lost FROM test_results GROUP BY upload_pk) a WHERE a.upload_pk = u.id"
    )
    conn.execute(
        "UPDATE tests t SET last_outcome = r.outcome FROM test_results r"
        " WHERE r.upload_pk IN (SELECT max(id) FROM result_uploads GROUP BY repository, variant_key)"
        " AND r.test_pk = t.id"
    )
