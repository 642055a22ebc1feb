"""CI history in SQL: recording an upload's results, reading a test's recent results, rolling old
ones up, and what a test's results say (`HistoryStats`).

An upload is recorded in one transaction: its row, one `TestRow` per test and variant (created or
its totals advanced), one `ResultRow` per result. Statements go out in batches (SQLAlchemy's
``insertmanyvalues``), so a 50,000-test upload is a few dozen round trips, not 100,000.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from flaketriage.records.models import ResultRow, TestDayRow, TestRow, UploadRow, utc_now
from flaketriage.results.model import Outcome, ResultsUpload
from flaketriage.variant import variant_key

RECENT = 50
"""Results a test's page and its flip rate look at, newest first."""


def test_key(repository: str, test_id: str, variant: str) -> str:
    """The key of a test in one variant of one repository (its id may be longer than an index holds)."""
    raw = "\x00".join((repository, test_id, variant)).encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).hexdigest()[:64]


test_key.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


@dataclass(frozen=True)
class Recorded:
    """What recording an upload did: its row id (None for a repeated upload), whether it was a storm,
    and the tests that failed in it (by `TestRow` id) and those that passed."""

    upload_pk: int | None
    storm: bool
    failed: tuple[int, ...] = ()
    passed: tuple[int, ...] = ()


def is_storm(tests: int, failures: int, *, share: float, min_tests: int) -> bool:
    """Whether a run failed so widely that it says something about the run (an outage, a broken
    runner), not about its tests: at least `min_tests` ran and more than `share` of them failed."""
    return tests >= min_tests and failures > share * tests


@dataclass(frozen=True, slots=True)
class _Line:
    """One result, as the statements write it (each property of the model read once)."""

    key: str
    outcome: str
    failing: bool
    retried: bool
    attempts: int
    failed_attempts: int
    duration_s: float
    lost_s: float
    signature: str | None
    quarantined: bool


def _lines(upload: ResultsUpload, variant: str) -> list[_Line]:
    out = []
    for t in upload.tests:
        failing = t.outcome.failing
        out.append(
            _Line(
                key=test_key(upload.repository, t.test_id, variant),
                outcome=t.outcome.value,
                failing=failing,
                retried=not failing
                and t.outcome is Outcome.PASSED
                and bool(t.attempts)
                and t.passed_on_retry,
                attempts=len(t.attempts) + 1,
                failed_attempts=t.failed_attempts,
                duration_s=t.duration_s,
                lost_s=t.lost_s if (failing or t.attempts) else 0.0,
                signature=t.signature,
                quarantined=t.quarantined,
            )
        )
    return out


def record_upload(
    session: Session,
    upload: ResultsUpload,
    *,
    storm_share: float,
    storm_min_tests: int,
    now: datetime | None = None,
) -> Recorded:
    """Record `upload` (nothing when its ``upload_id`` is already recorded)."""
    if session.scalars(select(UploadRow.id).where(UploadRow.upload_id == upload.upload_id)).first():
        return Recorded(upload_pk=None, storm=False)
    now = now or utc_now()
    variant = variant_key(upload.variant)
    lines = _lines(upload, variant)
    failures = sum(1 for line in lines if line.failing)
    storm = is_storm(len(lines), failures, share=storm_share, min_tests=storm_min_tests)
    row = UploadRow(
        upload_id=upload.upload_id,
        source=upload.source,
        repository=upload.repository,
        branch=upload.branch,
        commit=upload.commit,
        pull_request=upload.pull_request,
        run_id=upload.run_id,
        run_url=upload.run_url,
        job=upload.job,
        attempt=upload.attempt,
        variant_key=variant,
        tests=len(lines),
        failures=failures,
        passed_on_retry=sum(1 for line in lines if line.retried),
        skipped=sum(1 for line in lines if line.outcome == Outcome.SKIPPED.value),
        duration_s=sum(line.duration_s for line in lines),
        lost_s=sum(line.lost_s for line in lines),
        storm=storm,
        received_at=now,
    )
    session.add(row)
    session.flush()
    if not lines:
        return Recorded(upload_pk=row.id, storm=storm)
    names = {line.key: t.test_id for line, t in zip(lines, upload.tests, strict=True)}
    writer = _PostgresWriter if session.connection().dialect.name == "postgresql" else _SQLiteWriter
    ids = writer(session.connection(), now).write(upload, variant, names, lines, row.id, storm)
    failed = sorted({ids[line.key] for line in lines if line.failing or line.retried})
    passed = sorted({ids[line.key] for line in lines if line.outcome == Outcome.PASSED.value})
    return Recorded(upload_pk=row.id, storm=storm, failed=tuple(failed), passed=tuple(passed))


def _totals(lines: Iterable[_Line], storm: bool) -> tuple[int, int, int, int, int, float, float, str]:
    """The increments one upload makes to a test's totals (a test named twice in it adds up), in
    `_COUNTERS` order, and its last outcome."""
    runs = failures = retried = skipped = blocked = 0
    duration = lost = 0.0
    last = ""
    for line in lines:
        last = line.outcome
        if storm:
            continue  # an outage says nothing about the test: its totals stay as they were
        runs += 1
        failures += line.failing
        retried += line.retried
        skipped += line.outcome == Outcome.SKIPPED.value
        blocked += line.failing and not line.quarantined
        duration += line.duration_s
        lost += line.lost_s
    return runs, failures, retried, skipped, blocked, duration, lost, last


_COUNTERS = ("runs", "failures", "passed_on_retry", "skipped", "blocked_runs", "duration_s", "lost_s")
_TEST_COLUMNS = ("key", "repository", "test_id", "variant_key", "first_seen", "last_seen", "suspected_flaky",
                 *_COUNTERS, "last_outcome")  # fmt: skip
_RESULT_COLUMNS = ("test_pk", "upload_pk", "\"commit\"", "branch", "outcome", "attempts", "failed_attempts",
                   "duration_s", "lost_s", "signature", "quarantined", "storm", "received_at")  # fmt: skip
_UPSERT_SET = ", ".join(f"{c} = tests.{c} + excluded.{c}" for c in _COUNTERS)


class _Writer:
    """Writes an upload's tests and results with the driver's fastest bulk statement. SQLAlchemy's
    per-row parameter processing costs more than the database itself at this size, so rows go to
    the driver as plain tuples, their one timestamp converted once."""

    def __init__(self, connection: Any, now: datetime) -> None:
        self.connection = connection
        dialect = connection.dialect
        process = ResultRow.__table__.c.received_at.type.dialect_impl(dialect).bind_processor(dialect)
        self.now: Any = process(now) if process else now

    def write(
        self,
        upload: ResultsUpload,
        variant: str,
        names: dict[str, str],
        lines: list[_Line],
        upload_pk: int,
        storm: bool,
    ) -> dict[str, int]:
        grouped: dict[str, list[_Line]] = {}
        for line in lines:
            grouped.setdefault(line.key, []).append(line)
        tests = [
            (key, upload.repository, names[key], variant, self.now, self.now, False, *_totals(group, storm))
            for key, group in grouped.items()
        ]
        ids = self.upsert_tests(tests)
        results = [
            (ids[line.key], upload_pk, upload.commit, upload.branch, line.outcome, line.attempts,
             line.failed_attempts, line.duration_s, line.lost_s, line.signature, line.quarantined, storm,
             self.now)
            for line in lines
        ]  # fmt: skip
        self.insert_results(results)
        return ids

    def upsert_tests(self, rows: list[tuple[Any, ...]]) -> dict[str, int]:
        raise NotImplementedError

    def insert_results(self, rows: list[tuple[Any, ...]]) -> None:
        raise NotImplementedError


class _SQLiteWriter(_Writer):
    def upsert_tests(self, rows: list[tuple[Any, ...]]) -> dict[str, int]:
        marks = ", ".join("?" for _ in _TEST_COLUMNS)
        self.connection.exec_driver_sql(
            f"INSERT INTO tests ({', '.join(_TEST_COLUMNS)}) VALUES ({marks}) ON CONFLICT (key) DO UPDATE "
            f"SET {_UPSERT_SET}, last_seen = excluded.last_seen, last_outcome = excluded.last_outcome",
            rows,
        )
        ids: dict[str, int] = {}
        keys = [row[0] for row in rows]
        for start in range(0, len(keys), 5000):
            chunk = keys[start : start + 5000]
            found = self.connection.exec_driver_sql(
                f"SELECT id, key FROM tests WHERE key IN ({', '.join('?' for _ in chunk)})", tuple(chunk)
            )
            ids.update({key: test_pk for test_pk, key in found})
        return ids

    def insert_results(self, rows: list[tuple[Any, ...]]) -> None:
        marks = ", ".join("?" for _ in _RESULT_COLUMNS)
        self.connection.exec_driver_sql(
            f"INSERT INTO test_results ({', '.join(_RESULT_COLUMNS)}) VALUES ({marks})", rows
        )


class _PostgresWriter(_Writer):
    """COPY into a temporary table, then one upsert that returns every id; results by COPY."""

    def upsert_tests(self, rows: list[tuple[Any, ...]]) -> dict[str, int]:
        cursor = self.connection.connection.driver_connection.cursor()
        cursor.execute(
            "CREATE TEMPORARY TABLE IF NOT EXISTS incoming_tests (LIKE tests INCLUDING DEFAULTS) "
            "ON COMMIT DELETE ROWS"
        )
        cursor.execute("TRUNCATE incoming_tests")
        columns = ", ".join(_TEST_COLUMNS)
        with cursor.copy(f"COPY incoming_tests ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cursor.execute(
            f"INSERT INTO tests ({columns}) SELECT {columns} FROM incoming_tests ON CONFLICT (key) DO UPDATE "
            f"SET {_UPSERT_SET}, last_seen = excluded.last_seen, last_outcome = excluded.last_outcome "
            "RETURNING id, key"
        )
        return {key: test_pk for test_pk, key in cursor.fetchall()}

    def insert_results(self, rows: list[tuple[Any, ...]]) -> None:
        cursor = self.connection.connection.driver_connection.cursor()
        with cursor.copy(f"COPY test_results ({', '.join(_RESULT_COLUMNS)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


# -- reading ----------------------------------------------------------------------------------------
def recent_results(session: Session, test_pk: int, limit: int = RECENT) -> list[ResultRow]:
    """A test's latest results, newest first (one index range scan: ``ix_test_results_test``)."""
    return list(
        session.scalars(
            select(ResultRow).where(ResultRow.test_pk == test_pk).order_by(ResultRow.id.desc()).limit(limit)
        )
    )


@dataclass(frozen=True)
class HistoryStats:
    """What a test's recent results say, storm runs left out.

    ``flaky_commits`` counts the commits on which it both failed and passed (a pass on retry in one
    job included): the definition of flaky most CI tools share, since the code did not change.
    ``flip_rate`` is the share of consecutive results, oldest to newest, whose outcome changed
    between pass and fail (skips left out): a test that fails for good flips once.
    """

    runs: int
    failures: int
    passed_on_retry: int
    flaky_commits: int
    flip_rate: float
    mean_duration_s: float

    @classmethod
    def of(cls, results: Sequence[ResultRow]) -> HistoryStats:
        """From results in any order (sorted by id here)."""
        ordered = sorted((r for r in results if not r.storm), key=lambda r: r.id)
        counted = [r for r in ordered if r.outcome != Outcome.SKIPPED.value]
        failing = [Outcome(r.outcome).failing for r in counted]
        flips = sum(1 for a, b in itertools.pairwise(failing) if a != b)
        by_commit: dict[str, set[bool]] = {}
        for r in counted:
            if r.commit:
                seen = by_commit.setdefault(r.commit, set())
                seen.add(Outcome(r.outcome).failing)
                if r.failed_attempts and not Outcome(r.outcome).failing:
                    seen.add(True)
        return cls(
            runs=len(counted),
            failures=sum(failing),
            passed_on_retry=sum(
                1 for r in counted if r.failed_attempts and r.outcome == Outcome.PASSED.value
            ),
            flaky_commits=sum(1 for seen in by_commit.values() if len(seen) == 2),
            flip_rate=flips / (len(counted) - 1) if len(counted) > 1 else 0.0,
            mean_duration_s=(sum(r.duration_s for r in counted) / len(counted)) if counted else 0.0,
        )

    def suspects_flaky(self, flip_threshold: float, min_runs: int) -> bool:
        """Failed and passed on one commit, or passed on retry, or flips past `flip_threshold`
        over at least `min_runs` results."""
        return (
            self.flaky_commits > 0
            or self.passed_on_retry > 0
            or (self.runs >= min_runs and self.flip_rate >= flip_threshold)
        )


def same_commit_results(session: Session, test_pk: int, commit: str) -> list[ResultRow]:
    """Every result of a test on one commit (``ix_test_results_commit``)."""
    return list(
        session.scalars(select(ResultRow).where(ResultRow.test_pk == test_pk, ResultRow.commit == commit))
    )


# -- rolling up ---------------------------------------------------------------------------------------
def roll_up(session: Session, *, keep_days: float, now: datetime | None = None, batch: int = 50_000) -> int:
    """Fold results older than `keep_days` into per-test daily rows (`TestDayRow`) and delete them;
    the number of results rolled up. A test's totals do not change (they were counted on arrival)."""
    cutoff = (now or utc_now()) - timedelta(days=keep_days)
    old = select(ResultRow).where(ResultRow.received_at < cutoff).order_by(ResultRow.id).limit(batch)
    rows = list(session.scalars(old))
    if not rows:
        return 0
    days: dict[tuple[int, Any], dict[str, Any]] = {}
    for r in rows:
        key = (r.test_pk, r.received_at.date())
        day = days.setdefault(
            key,
            {
                "runs": 0,
                "failures": 0,
                "passed_on_retry": 0,
                "storm_runs": 0,
                "duration_s": 0.0,
                "lost_s": 0.0,
            },
        )
        if r.storm:
            day["storm_runs"] += 1
            continue
        day["runs"] += 1
        day["failures"] += Outcome(r.outcome).failing
        day["passed_on_retry"] += bool(r.failed_attempts) and r.outcome == Outcome.PASSED.value
        day["duration_s"] += r.duration_s
        day["lost_s"] += r.lost_s
    for (test_pk, day_date), totals in days.items():
        existing = session.get(TestDayRow, (test_pk, day_date))
        if existing is None:
            session.add(TestDayRow(test_pk=test_pk, day=day_date, **totals))
        else:
            for name, value in totals.items():
                setattr(existing, name, getattr(existing, name) + value)
    session.execute(delete(ResultRow).where(ResultRow.id.in_([r.id for r in rows])))
    return len(rows)


def mark_suspected(session: Session, test_pk: int, case_id: int | None) -> None:
    """A test CI history suspects of flakiness, and the case opened for it."""
    session.execute(
        update(TestRow).where(TestRow.id == test_pk).values(suspected_flaky=True, case_id=case_id)
    )


def count_results(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(ResultRow)) or 0)
