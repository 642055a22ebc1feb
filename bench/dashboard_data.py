"""The database bench/dashboard.py serves: cases of every status and verdict over several
repositories and branches, their occurrences over ~90 days with the provenance CI gives them, the
work and replays of the decided ones, runners, a quarantine, and the CI history beside them
(`seed.History`), written by SQL in a few minutes.

The database (``bench_dashboard`` by default) is the benchmark's own, never the admin one: it is
made, migrated by the real migrations and seeded once, and its comment records what it was seeded
with (`Scale`, `SEED_VERSION` and the newest migration); a later run at the same scale, seeder and
schema reuses it, anything else seeds it again.

Rows are realistic where a page's cost depends on them: occurrences are spread over cases as
failures are (a few cases gather thousands, most a few dozen), come from CI runs that uploaded
results (so ``run_url`` and ``branch`` join them to ``result_uploads``), from runs that did not, and
from machines outside CI; a case triaged again has a triage per generation, each with the replays
its verdict takes (5 for deterministic, 20 for flaky, 30 not reproduced ...), on the runners of its
queue.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

from seed import SEEDED, TEST_ID_SQL, History, seed_history, without_indexes

SEED_VERSION = 4
"""Raised when the seeder writes different rows: a database seeded by an older one is seeded again."""

STATUS_VERDICTS: tuple[tuple[str, str | None, int], ...] = (
    ("decided", "flaky", 20),
    ("decided", "deterministic", 10),
    ("decided", "not_reproduced", 8),
    ("decided", "different_failure", 3),
    ("decided", "order_dependent", 3),
    ("decided", "environment", 2),
    ("decided", "environment_specific", 2),
    ("reported", "flaky", 12),
    ("reported", "deterministic", 8),
    ("reported", "order_dependent", 2),
    ("fixed", "flaky", 8),
    ("fixed", "deterministic", 3),
    ("open", None, 5),
    ("suspected_flaky", None, 5),
    ("queued", None, 4),
    ("triaging", None, 3),
    ("failed", None, 2),
)
"""(status, verdict, share in %) of the cases. The first 17 cases take one of each, so even a tiny
seed has every status and verdict."""

REPLAYS = {
    "deterministic": 5,
    "flaky": 20,
    "not_reproduced": 30,
    "different_failure": 10,
    "order_dependent": 25,
    "environment": 3,
    "environment_specific": 16,
}
"""Replays a triage of each verdict ran (a triage still running: 8)."""

FROM_UPLOADED_RUNS = 0.12
"""The share of occurrences from CI runs that uploaded their results: about as many as the failed
results those uploads hold (~133,000 of 10,000,000 at the full scale, 1,000,000 occurrences), so
an uploaded run has a few dozen occurrences, as many as its failures. The other occurrences of CI
come from runs that uploaded nothing (most runs, where CI history is not set up)."""


@dataclass(frozen=True)
class Scale:
    """How much is seeded."""

    cases: int = 10_000
    occurrences: int = 1_000_000
    results: int = 10_000_000
    quarantined: int = 300
    runners: int = 24
    """A third of them with GPUs."""
    days: float = 89.0
    """Everything lies in the last `days` days (CI history keeps 90 before rolling results up)."""
    repositories: tuple[str, ...] = ("acme/app", "acme/api", "acme/ml", "acme/web")
    variants: tuple[str, ...] = ("os=linux,python=3.12", "gpu=NVIDIA H100,os=linux,python=3.12")
    branches: tuple[str, ...] = field(
        default=("main", *(f"release/2.{i}" for i in range(3)), *(f"feature/change-{i}" for i in range(27)))
    )

    def history(self) -> History:
        """CI history of about `results` results: each repository's suite ran up to 500 times, and
        has 25 tests at least where `results` allows."""
        suites = len(self.repositories) * len(self.variants)
        runs = max(1, min(500, self.results // (suites * 25)))
        return History(
            repositories=self.repositories,
            variants=self.variants,
            tests=max(1, self.results // (suites * runs)),
            runs=runs,
            days=self.days,
            branches=self.branches,
        )

    def marker(self, schema: str) -> str:
        """What the seeded database's comment says."""
        return json.dumps({"seed": SEED_VERSION, "schema": schema, "scale": asdict(self)}, sort_keys=True)


def schema_version() -> str:
    """The newest migration and a digest of every migration's text: a seeded database is reused
    only while both are what it was migrated with (migrations 0006 and 0007 were filled in after
    they were first reserved, empty, under the same names)."""
    import hashlib

    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from flaketriage.records.database import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    digest = hashlib.sha256()
    for path in sorted(Path(MIGRATIONS).glob("versions/*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"{head} {digest.hexdigest()[:16]}"


def database_url(admin: str, name: str) -> str:
    """The URL of database `name` on the server of the admin URL `admin`."""
    from sqlalchemy.engine import make_url

    from flaketriage.records.database import database_url as normalized

    return make_url(normalized(admin)).set(database=name).render_as_string(hide_password=False)


def libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def ensure_seeded(
    admin: str, name: str, scale: Scale, *, reseed: bool, say: Callable[[str], None] = print
) -> str:
    """The URL of database `name` seeded at `scale`: reused when its comment says it already is
    (unless `reseed`), else dropped, made, migrated and seeded afresh."""
    import psycopg
    from psycopg import sql

    if name == "postgres" or name.startswith("template"):
        raise SystemExit(f"refusing to seed {name!r}: the benchmark seeds a database of its own")
    marker = scale.marker(schema_version())
    with psycopg.connect(libpq(admin), autocommit=True) as conn:
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s", (name,)
        ).fetchone()
        reuse = row is not None and row[0] == marker and not reseed
        if reuse:
            say(f"reusing database {name}, already seeded at this scale (--reseed to seed it again)")
        else:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    url = database_url(admin, name)
    if not reuse:
        seed(url, scale, say)
        with psycopg.connect(libpq(admin), autocommit=True) as conn:
            conn.execute(f'COMMENT ON DATABASE "{name}" IS {sql.quote(marker)}')
    upkeep(url, say)
    return url


def upkeep(url: str, say: Callable[[str], None] = print) -> None:
    """What beat keeps up to date for the pages, done now as beat would have done it by the time
    anyone looks (a database seeded on an earlier day included): the overview's failures of each
    complete day (`flaketriage.records.failure_days.roll_up_failures`)."""
    from datetime import datetime

    from flaketriage.records import Database
    from flaketriage.records.failure_days import roll_up_failures

    database = Database(url)
    try:
        with database.session() as session:
            rows = roll_up_failures(session, now=datetime.now(UTC))
    finally:
        database.dispose()
    say(f"  beat's upkeep: {rows} rows of failures per day rolled up")


def drop(admin: str, name: str) -> None:
    import psycopg

    with psycopg.connect(libpq(admin), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def seed(url: str, scale: Scale, say: Callable[[str], None] = print) -> dict[str, int]:
    """Migrate the empty database at `url` and seed it at `scale`; returns each table's rows."""
    import psycopg

    from flaketriage.records import Database

    started = time.perf_counter()
    database = Database(url)
    database.upgrade()
    database.dispose()
    say(
        f"seeding {url.rsplit('/', 1)[-1]}: {scale.cases:,} cases, {scale.occurrences:,} occurrences,"
        f" {scale.history().results:,} test results"
    )
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        runners = _runners(conn, scale)
        seed_history(conn, scale.history(), say)
        step = time.perf_counter()
        with without_indexes(conn, ["cases", "occurrences", "work", "replays"], say):
            _cases(conn, scale)
            _occurrences(conn, scale)
            _work(conn)
            _replays(conn, runners)
            say(f"  wrote cases, occurrences, work and replays in {time.perf_counter() - step:.0f} s")
        _afterwards(conn, scale)
        step = time.perf_counter()
        conn.execute("VACUUM ANALYZE")
        say(f"  vacuumed and analyzed in {time.perf_counter() - step:.0f} s")
        counts = {
            table: int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
            for table in ("cases", "occurrences", "work", "replays", "quarantine", "runners",
                          "result_uploads", "tests", "test_results")
        }  # fmt: skip
    say(
        f"seeded in {time.perf_counter() - started:.0f} s: "
        + ", ".join(f"{n:,} {table}" for table, n in counts.items())
    )
    return counts


def _runners(conn: Any, scale: Scale) -> dict[str, list[str]]:
    """The runners (a third with GPUs, ids as `RunnerIdentity` makes them); their ids by queue."""
    from flaketriage.workers.attribution import GPUIdentity, RunnerIdentity

    gpu_count = max(1, scale.runners // 3)
    made: dict[str, list[str]] = {"cpu": [], "gpu": []}
    rows = []
    for i in range(scale.runners):
        if i < scale.runners - gpu_count:
            runner = RunnerIdentity(host=f"ci-cpu-{i + 1:02d}")
            queue = "cpu"
        else:
            gpus = tuple(
                GPUIdentity("NVIDIA H100 80GB HBM3", f"GPU-{i:04x}{g:04x}-5e1d-4b0a-9f3c-{i * 8 + g:012x}")
                for g in range(1 + i % 4)
            )
            runner = RunnerIdentity(host=f"gpu-node-{i + 1:02d}", gpus=gpus, driver="550.54.15")
            queue = "gpu"
        made[queue].append(runner.id)
        gpus_json = [{"name": g.name, "uuid": g.uuid} for g in runner.gpus]
        rows.append((runner.id, runner.host, json.dumps(gpus_json), runner.driver))
    with conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO runners (id, host, gpus, driver, first_seen, last_seen, replays,"
            " environment_specific, suspect) VALUES (%s, %s, %s::json, %s, now(), now(), 0, 0, false)",
            rows,
        )
    return made


def evidence_templates() -> dict[str, dict[str, Any]]:
    """A triage's evidence (`TriageResult.to_json()`) for each verdict, from the real sequential
    test fed the outcomes such a failure gives (the verdicts it never gives itself, which triage
    sets afterwards, from a flaky one's replays)."""
    from flaketriage.workers.triage import TriageResult
    from flaketriage.workers.verdict import Outcome, SequentialTest

    def triaged(*outcomes: Outcome) -> dict[str, Any]:
        test = SequentialTest()
        for outcome in itertools.islice(itertools.cycle(outcomes), 200):
            if test.done:
                break
            test.add(outcome)
        return TriageResult(bundle_id="0" * 64, verdict=test.result()).to_json()

    flaky = triaged(Outcome.REPRODUCED, Outcome.PASSED, Outcome.PASSED, Outcome.PASSED)
    made = {
        "flaky": flaky,
        "deterministic": triaged(Outcome.REPRODUCED),
        "not_reproduced": triaged(Outcome.PASSED),
        "different_failure": triaged(Outcome.DIFFERENT),
        "environment": triaged(Outcome.ENVIRONMENT),
    }
    for verdict in ("order_dependent", "environment_specific"):
        made[verdict] = {**flaky, "verdict": verdict}
    made["order_dependent"] |= {
        "polluters": ["tests/test_m0.py::test_case_3"],
        "order_cause": "fails after tests/test_m0.py::test_case_3 (shared state left behind)",
    }
    return made


def _slots() -> tuple[list[str], list[str | None]]:
    """100 (status, verdict) slots: one of each first, then one more of each still short of its share."""
    statuses: list[str] = []
    verdicts: list[str | None] = []
    for round_ in range(100):
        for status, verdict, share in STATUS_VERDICTS:
            if round_ < share:
                statuses.append(status)
                verdicts.append(verdict)
    return statuses, verdicts


_HASH = "abs(hashint4({}))"


def _cases(conn: Any, scale: Scale) -> None:
    """The cases, ids 1 to `scale.cases`; their occurrences and times are filled in from their
    occurrences afterwards (`_afterwards`)."""
    from psycopg.types.json import Jsonb

    statuses, verdicts = _slots()
    tests = scale.history().tests
    h = _HASH.format("g")
    conn.execute(
        "INSERT INTO cases (id, fingerprint, identity, cause_key, kind, title, test_id, job, repository,"
        " status, verdict, error, first_seen, last_seen, occurrences, report_kind, report_url,"
        " last_triage_at, evidence, generation, storm_of)"
        " SELECT g, fp,"
        " CASE WHEN kind = 'bundle' THEN encode(sha256(('identity' || g)::bytea), 'hex') ELSE fp END,"
        " cause, kind,"
        " CASE kind WHEN 'workflow' THEN repository || ': workflow ' || workflow || ' failed'"
        "  WHEN 'sentry' THEN exc || ': ' || message || ' (Sentry, ' || repository || ')'"
        "  WHEN 'history' THEN test_id || ' failed and passed without a change'"
        "  ELSE exc || ': ' || message || ' in ' || test_id END,"
        " CASE WHEN kind IN ('bundle', 'history') THEN test_id END,"
        " CASE WHEN kind = 'workflow' THEN workflow ELSE job END, repository, status, verdict,"
        " CASE WHEN status = 'failed'"
        "  THEN 'StoreError: the bundle ' || left(fp, 12) || ' is not in the store' END,"
        " now(), now(), 0,"
        " CASE WHEN status = 'reported' THEN 'github' END,"
        " CASE WHEN status = 'reported' THEN 'https://github.com/' || repository || '/issues/' || g END,"
        " CASE WHEN verdict IS NOT NULL THEN now() END,"
        " CASE WHEN verdict IS NOT NULL THEN (jsonb_set((%(evidence)s::jsonb) -> verdict, '{bundle}',"
        "  to_jsonb(encode(sha256(('bundle' || g)::bytea), 'hex')))"
        "  || CASE WHEN status = 'reported' THEN jsonb_build_object('report', jsonb_build_object("
        "   'kind', 'github', 'location', 'https://github.com/' || repository || '/issues/' || g,"
        "   'created', true)) ELSE '{}'::jsonb END)::json END,"
        " 0, CASE WHEN mod(g, 97) = 13 AND g > 200 THEN g - 100 END"
        " FROM (SELECT g, encode(sha256(('case' || g)::bytea), 'hex') AS fp,"
        "  (%(statuses)s::text[])[1 + mod(g - 1, 100)] AS status,"
        "  (%(verdicts)s::text[])[1 + mod(g - 1, 100)] AS verdict,"
        "  (%(repos)s::text[])[1 + mod(" + h + ", %(r)s)] AS repository,"
        "  CASE WHEN (%(statuses)s::text[])[1 + mod(g - 1, 100)] = 'suspected_flaky' THEN 'history'"
        "   WHEN (%(statuses)s::text[])[1 + mod(g - 1, 100)] = 'open' THEN 'workflow'"
        "   WHEN mod(" + h + ", 100) < 8 THEN 'sentry' ELSE 'bundle' END AS kind,"
        f"  {TEST_ID_SQL.format(k='(1 + mod(' + h + ', %(tests)s))')} AS test_id,"
        "  'tests (' || (%(variants)s::text[])[1 + mod(g, %(v)s)] || ')' AS job,"
        "  (ARRAY['CI', 'nightly', 'release'])[1 + mod(g, 3)] AS workflow,"
        "  md5('cause' || mod(g, 800)) AS cause,"
        "  (ARRAY['AssertionError', 'RuntimeError', 'TimeoutError', 'KeyError', 'ConnectionResetError',"
        "   'torch.OutOfMemoryError'])[1 + mod(g, 6)] AS exc,"
        "  'expected ' || mod(g, 13) || ', got ' || (13 + mod(g, 17)) AS message"
        "  FROM generate_series(1, %(cases)s) g) c",
        {
            "evidence": Jsonb(evidence_templates()),
            "statuses": statuses,
            "verdicts": verdicts,
            "repos": list(scale.repositories),
            "r": len(scale.repositories),
            "variants": list(scale.variants),
            "v": len(scale.variants),
            "tests": tests,
            "cases": scale.cases,
        },
    )
    conn.execute("SELECT setval(pg_get_serial_sequence('cases', 'id'), %s)", (scale.cases,))


def _occurrence_columns(conn: Any) -> dict[str, str]:
    """Each column of ``occurrences`` and the SQL that fills it (over the `_occurrences` source
    ``o``), for the columns this schema has: the migrations may add more (the provenance's run URL
    and branch). A column the seeder cannot fill stops it, by name."""
    known = {
        "case_id": "o.case_id",
        "source": "o.source",
        "delivery_id": "'seed-' || o.g",
        "bundle_id": "CASE WHEN o.source = 'event' THEN encode(sha256(('bundle' || o.g)::bytea), 'hex') END",
        "store_url": "CASE WHEN o.source = 'event' THEN 's3://acme-flaketriage/store' END",
        "test_id": "o.test_id",
        "provenance": "o.provenance",
        "received_at": "o.received_at",
        "run_url": "o.run_url",
        "branch": "o.branch",
    }
    rows = conn.execute(
        "SELECT column_name, is_nullable = 'YES' OR column_default IS NOT NULL"
        " FROM information_schema.columns WHERE table_name = 'occurrences' AND column_name <> 'id'"
    ).fetchall()
    unknown = [name for name, optional in rows if name not in known and not optional]
    if unknown:
        raise SystemExit(
            f"occurrences has required columns the seeder does not fill: {', '.join(unknown)};"
            " add them to bench/dashboard_data.py's _occurrence_columns"
        )
    return {name: known[name] for name, _ in rows if name in known}


def _occurrences(conn: Any, scale: Scale) -> None:
    """`scale.occurrences` occurrences, oldest first: one for each case, the rest over cases as
    failures gather (the square of a uniform draw, scattered over the ids by a stride prime to
    their number). `FROM_UPLOADED_RUNS` of them (and every one of a CI history case) come from a
    run that uploaded results, the other CI ones from runs that did not; a bundle captured outside
    CI (a fifth) names no run at all."""
    columns = _occurrence_columns(conn)
    n = scale.cases
    stride = next(p for p in range(n // 2 + 1, 10 * n + 3) if math.gcd(p, n) == 1)
    conn.execute(
        "CREATE TEMP TABLE seed_repo_runs AS SELECT repository,"
        " row_number() OVER (PARTITION BY repository ORDER BY id) AS k, run_id, run_url, branch, commit,"
        " received_at FROM result_uploads WHERE upload_id LIKE %s",
        (f"{SEEDED}%-1",),
    )
    conn.execute("CREATE INDEX ON seed_repo_runs (repository, k)")
    runs = scale.history().runs
    conn.execute(
        f"INSERT INTO occurrences ({', '.join(columns)}) SELECT {', '.join(columns.values())} FROM ("
        " SELECT o.g, o.case_id, src.source, c.test_id, run.url AS run_url, run.branch,"
        "  run.at AS received_at,"
        "  CASE src.source"
        "  WHEN 'event' THEN jsonb_strip_nulls(jsonb_build_object('ci_provider',"
        "   CASE WHEN run.url IS NOT NULL THEN 'github-actions' END, 'run_url', run.url, 'job', c.job,"
        "   'attempt', CASE WHEN run.url IS NOT NULL THEN '1' END, 'branch', run.branch,"
        "   'runner', CASE WHEN run.url IS NOT NULL THEN 'GitHub Actions ' || mod(o.g, 40) END,"
        "   'host', CASE WHEN run.url IS NOT NULL THEN 'fv-az' || mod(o.g, 900)"
        "    ELSE 'dev-laptop-' || mod(o.g, 30) END))"
        "  WHEN 'github' THEN jsonb_build_object('ci_provider', 'github-actions', 'repository', c.repository,"
        "   'workflow', c.job, 'head_sha', run.commit, 'head_branch', run.branch, 'run_url', run.url,"
        "   'run_id', run.id, 'attempt', '1', 'event', 'push')"
        "  WHEN 'sentry' THEN jsonb_build_object('sentry_issue', (4000000 + o.case_id)::text,"
        "   'environment', 'production', 'url', 'https://acme.sentry.io/issues/' || (4000000 + o.case_id))"
        "  ELSE jsonb_build_object('repository', c.repository, 'branch', run.branch, 'commit', run.commit,"
        "   'run_url', run.url, 'job', c.job, 'variant', '') END::json AS provenance"
        " FROM (SELECT g, CASE WHEN g <= %(n)s THEN g"
        "   ELSE 1 + mod(floor(%(n)s * random() ^ 2)::int * %(stride)s::bigint, %(n)s)::int END AS case_id,"
        "   random() AS x, random() AS y FROM generate_series(1, %(total)s) g) o"
        " JOIN cases c ON c.id = o.case_id"
        " CROSS JOIN LATERAL (SELECT CASE c.kind WHEN 'bundle' THEN 'event' WHEN 'workflow' THEN 'github'"
        "  WHEN 'sentry' THEN 'sentry' ELSE 'results' END AS source) src"
        " LEFT JOIN seed_repo_runs r ON r.repository = c.repository"
        "  AND r.k = 1 + floor(o.y * %(runs)s)::int AND c.kind <> 'sentry'"
        "  AND (o.x < %(uploaded)s OR c.kind = 'history')"
        " CROSS JOIN LATERAL (SELECT"
        "  CASE WHEN r.k IS NOT NULL THEN r.run_url WHEN c.kind IN ('sentry') OR (c.kind = 'bundle'"
        "   AND o.x > 0.8) THEN NULL"
        "   ELSE 'https://github.com/' || c.repository || '/actions/runs/' || (20000000 + o.g) END AS url,"
        "  coalesce(r.run_id::bigint, 20000000 + o.g) AS id, r.commit AS commit,"
        "  CASE WHEN r.k IS NOT NULL THEN r.branch"
        "   WHEN c.kind = 'sentry' OR (c.kind = 'bundle' AND o.x > 0.8) THEN NULL"
        "   WHEN o.y < 0.5 THEN %(main)s ELSE (%(branches)s::text[])[1 + mod(o.g, %(b)s)] END"
        "   AS branch,"
        "  coalesce(r.received_at + make_interval(secs => 30 + mod(o.g, 600)),"
        "   now() - make_interval(secs => o.y * %(span)s)) AS at) run"
        " ) o ORDER BY o.received_at, o.g",
        {
            "n": n,
            "uploaded": FROM_UPLOADED_RUNS,
            "stride": stride,
            "total": scale.occurrences,
            "runs": runs,
            "main": scale.branches[0],
            "branches": list(scale.branches),
            "b": len(scale.branches),
            "span": scale.days * 86400,
        },
    )
    conn.execute("DROP TABLE seed_repo_runs")
    conn.execute(
        "UPDATE cases c SET occurrences = a.n, first_seen = a.first, last_seen = a.last,"
        " generation = least(4, a.n / 500),"
        " last_triage_at = CASE WHEN c.verdict IS NOT NULL THEN a.last - interval '1 hour' END"
        " FROM (SELECT case_id, count(*) AS n, min(received_at) AS first, max(received_at) AS last"
        "  FROM occurrences GROUP BY case_id) a WHERE a.case_id = c.id"
    )


def _work(conn: Any) -> None:
    """A triage per generation of each case triaged (or being triaged), spread between its first
    and last occurrence; a minimization of a decided deterministic bundle case; a report of each
    reported case."""
    conn.execute(
        "INSERT INTO work (key, case_id, bundle_id, store_url, step, queue, status, attempts, batch, options,"
        " result, created_at, sent_at, started_at, heartbeat_at, finished_at)"
        " SELECT 'triage:' || c.id || ':' || gen, c.id, encode(sha256(('bundle' || c.id)::bytea), 'hex'),"
        " 's3://acme-flaketriage/store', 'triage', CASE WHEN mod(c.id, 7) = 0 THEN 'gpu' ELSE 'cpu' END,"
        " CASE WHEN c.status = 'triaging' AND gen = c.generation THEN 'waiting' ELSE 'done' END, 1,"
        " 1 + coalesce((%(replays)s::jsonb ->> c.verdict)::int, 8) / 5, '{}'::json,"
        " CASE WHEN c.verdict IS NOT NULL THEN json_build_object('verdict', c.verdict) END, at, at, at,"
        " at + interval '20 minutes', CASE WHEN c.status = 'triaging' AND gen = c.generation THEN NULL"
        "  ELSE at + interval '20 minutes' END"
        " FROM cases c CROSS JOIN LATERAL generate_series(0, c.generation) gen"
        " CROSS JOIN LATERAL (SELECT c.first_seen + (c.last_seen - c.first_seen) * gen / (c.generation + 1)"
        "  + interval '2 minutes' AS at) t"
        " WHERE c.verdict IS NOT NULL OR c.status = 'triaging'"
        " UNION ALL"
        " SELECT step || ':' || c.id, c.id, encode(sha256(('bundle' || c.id)::bytea), 'hex'),"
        " 's3://acme-flaketriage/store', step, CASE step WHEN 'report' THEN 'report' ELSE 'cpu' END,"
        " 'done', 1, 0, '{}'::json, NULL, c.last_triage_at, c.last_triage_at, c.last_triage_at,"
        " c.last_triage_at + interval '5 minutes', c.last_triage_at + interval '5 minutes'"
        " FROM cases c CROSS JOIN LATERAL (SELECT CASE WHEN c.status = 'reported' THEN 'report'"
        "  ELSE 'minimize' END AS step) s"
        " WHERE c.status = 'reported' OR (c.verdict = 'deterministic' AND c.kind = 'bundle')",
        {"replays": json.dumps(REPLAYS)},
    )


def _replays(conn: Any, runners: dict[str, list[str]]) -> None:
    """The replays of each triage, as many as its verdict takes, on the runners of its queue; a
    running triage's last three replays have no outcome yet."""
    conn.execute(
        "INSERT INTO replays (work_id, idx, batch, outcome, fingerprint, summary, duration_s, cpu_s, gpu_s,"
        " runner, worker, created_at, sent_at, finished_at)"
        " SELECT w.id, i, i / 5, outcome, CASE WHEN outcome = 'reproduced' THEN c.fingerprint END,"
        " CASE outcome WHEN 'reproduced' THEN 'failed the same way' WHEN 'different_failure'"
        "  THEN 'failed differently: RuntimeError: CUDA error' WHEN 'environment'"
        "  THEN 'could not install torch==2.5.1' ELSE NULL END,"
        " d, d * 0.9, CASE WHEN w.queue = 'gpu' THEN d ELSE 0 END, runner,"
        " split_part(runner, '/', 1) || ':' || (1000 + mod(w.id, 5000)),"
        " w.created_at + make_interval(secs => i * 20), w.created_at + make_interval(secs => i * 20),"
        " CASE WHEN outcome IS NOT NULL THEN w.created_at + make_interval(secs => i * 20 + d) END"
        " FROM work w JOIN cases c ON c.id = w.case_id"
        " CROSS JOIN LATERAL generate_series(0, coalesce((%(replays)s::jsonb ->> c.verdict)::int, 8) - 1) i"
        " CROSS JOIN LATERAL (SELECT 2 + mod(abs(hashint4(w.id * 64 + i)), 5800) / 100.0 AS d,"
        "  CASE WHEN w.queue = 'gpu' THEN (%(gpu)s::text[])[1 + mod(w.id + i, %(g)s)]"
        "   ELSE (%(cpu)s::text[])[1 + mod(w.id + i, %(c)s)] END AS runner,"
        "  CASE WHEN w.status = 'waiting' AND i >= 5 THEN NULL"
        "   WHEN c.verdict = 'deterministic' THEN 'reproduced'"
        "   WHEN c.verdict = 'not_reproduced' THEN 'passed'"
        "   WHEN c.verdict = 'different_failure' THEN CASE WHEN mod(i, 2) = 0 THEN 'different_failure'"
        "    ELSE 'passed' END"
        "   WHEN c.verdict = 'environment' THEN 'environment'"
        "   WHEN c.verdict = 'environment_specific' THEN CASE WHEN mod(w.id + i, 2) = 0 THEN 'reproduced'"
        "    ELSE 'passed' END"
        "   WHEN mod(i * 7 + c.id, 4) = 0 THEN 'reproduced' ELSE 'passed' END AS outcome) r"
        " WHERE w.step = 'triage'"
        " ORDER BY w.id, i",
        {
            "replays": json.dumps(REPLAYS),
            "gpu": runners["gpu"],
            "g": len(runners["gpu"]),
            "cpu": runners["cpu"],
            "c": len(runners["cpu"]),
        },
    )


def _afterwards(conn: Any, scale: Scale) -> None:
    """What the rows written say about the rest: each runner's replays and environment-specific
    verdicts (the two most named are suspect), the quarantine of the latest flaky cases, and the
    tests CI history opened a case for."""
    conn.execute(
        "UPDATE runners u SET replays = a.n, first_seen = a.first, last_seen = a.last,"
        " environment_specific = a.specific, last_case_id = a.last_case"
        " FROM (SELECT r.runner, count(*) AS n, min(r.created_at) AS first, max(r.created_at) AS last,"
        "  count(DISTINCT c.id) FILTER (WHERE c.verdict = 'environment_specific') AS specific,"
        "  max(c.id) FILTER (WHERE c.verdict = 'environment_specific') AS last_case"
        "  FROM replays r JOIN work w ON w.id = r.work_id JOIN cases c ON c.id = w.case_id"
        "  GROUP BY r.runner) a"
        " WHERE a.runner = u.id"
    )
    conn.execute(
        "UPDATE runners SET suspect = true WHERE id IN"
        " (SELECT id FROM runners WHERE environment_specific > 0"
        "  ORDER BY environment_specific DESC, id LIMIT 2)"
    )
    _quarantine(conn, scale)
    conn.execute(
        "UPDATE tests t SET case_id = c.id, suspected_flaky = true FROM cases c"
        " WHERE c.kind = 'history' AND t.repository = c.repository AND t.test_id = c.test_id"
    )


def _quarantine(conn: Any, scale: Scale) -> None:
    """`scale.quarantined` entries, made as the service makes them (`refreshed_entry`), for the
    flaky cases last seen."""
    from psycopg.types.json import Json

    from flaketriage.quarantine import FailureRate, QuarantineEvidence, refreshed_entry

    cases = conn.execute(
        "SELECT id, fingerprint, test_id, repository, last_seen, occurrences FROM cases"
        " WHERE verdict = 'flaky' AND status IN ('decided', 'reported') AND test_id IS NOT NULL"
        " ORDER BY last_seen DESC LIMIT %s",
        (scale.quarantined,),
    ).fetchall()
    rows = []
    for ident, fingerprint, test_id, repository, last_seen, occurrences in cases:
        evidence = QuarantineEvidence(
            verdict="flaky",
            replays=20,
            reproductions=5,
            rate=FailureRate(estimate=0.25, low=0.09, high=0.49),
        )
        entry = refreshed_entry(
            None,
            fingerprint=fingerprint,
            test_id=test_id,
            command=f"python -m pytest {test_id}",
            bundle_id=f"{ident:064x}",
            evidence=evidence,
            reason=f"flaky: reproduced 5 of 20 replays ({occurrences} occurrences)",
            issue_url=f"https://github.com/{repository}/issues/{ident}",
            now=last_seen if last_seen.tzinfo else last_seen.replace(tzinfo=UTC),
        )
        rows.append((fingerprint, ident, Json(entry.model_dump(mode="json")), ident % 4, last_seen))
    with conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO quarantine (fingerprint, case_id, entry, clean_reruns, updated_at)"
            " VALUES (%s, %s, %s, %s, %s)",
            rows,
        )
    # Their isolation reruns, one every 6 hours as beat schedules them, from 10 days before each
    # entry began (an earlier quarantine of the case: the page leaves those out) until now.
    conn.execute(
        "INSERT INTO work (key, case_id, bundle_id, store_url, step, queue, status, attempts, batch,"
        " options, result, created_at, sent_at, started_at, heartbeat_at, finished_at)"
        " SELECT 'rerun:' || q.fingerprint || ':' || n, q.case_id, q.entry ->> 'bundle_id',"
        " 's3://acme-flaketriage/store', 'rerun', 'cpu', 'done', 1, 0,"
        " json_build_object('fingerprint', q.fingerprint),"
        " json_build_object('verdict', 'flaky', 'decided', true, 'replays', 40, 'failures', 1 + mod(n, 4),"
        "  'state', 'still flaky'),"
        " t.at, t.at, t.at, t.at + interval '5 minutes', t.at + interval '5 minutes'"
        " FROM quarantine q CROSS JOIN LATERAL generate_series(0, 400) n"
        " CROSS JOIN LATERAL (SELECT (q.entry ->> 'quarantined_at')::timestamptz - interval '10 days'"
        "  + n * interval '6 hours' AS at) t"
        " WHERE t.at <= now()"
    )
