"""CI history in SQL: recording an upload's results, reading a test's recent results, rolling old
ones up, and what a test's results say (`HistoryStats`).

An upload is recorded in one transaction: its row, a `TestRow` for each test and variant not seen
before, one `ResultRow` per result, written as the driver writes fastest (COPY on PostgreSQL, one
``executemany`` on SQLite), so a 50,000-test upload is a handful of round trips. The tests' running
totals are added after, once, by the upload's ``history`` step (`add_totals`): the receiver
answers without updating 50,000 rows.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.orm import Session

from flaketriage.records.models import ResultRow, TestDayRow, TestRow, UploadRow, utc_now
from flaketriage.results.model import Outcome, ResultsUpload
from flaketriage.variant import variant_key

RECENT = 50
"""Results a test's page and its flip rate look at, newest first."""


def test_key(repository: str, test_id: str, variant: str) -> str:
    """The key of a test in one variant of one repository (its id may be longer than an index holds)."""
    prefix, suffix = _key_ends(repository, variant)
    return _key(prefix, test_id, suffix)


def _key_ends(repository: str, variant: str) -> tuple[bytes, bytes]:
    """What every key of one repository and variant starts and ends with (an upload computes it once)."""
    return (repository + "\x00").encode("utf-8", "surrogatepass"), ("\x00" + variant).encode(
        "utf-8", "surrogatepass"
    )


def _key(prefix: bytes, test_id: str, suffix: bytes) -> str:
    return hashlib.sha256(prefix + test_id.encode("utf-8", "surrogatepass") + suffix).hexdigest()


test_key.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


@dataclass(frozen=True)
class Recorded:
    """What recording an upload did: its row id (None for a repeated upload), whether it was a storm,
    the tests that failed in it (by `TestRow` id) and those that passed, and every test's id by key
    (for `TestIds.learn`, once the transaction committed)."""

    upload_pk: int | None
    storm: bool
    failed: tuple[int, ...] = ()
    passed: tuple[int, ...] = ()
    ids: dict[str, int] = field(default_factory=dict, repr=False)


class TestIds:
    """Test ids by key that a receiver has seen committed, so the next upload of the same suite
    does not look its 50,000 tests up again. Sound because a test's row keeps its id for good (tests
    are never deleted or renumbered); learned only after the transaction that made them committed;
    bounded (the oldest learned are dropped first). One per `Database`: another database (a test's
    fresh one, a restored one) starts empty."""

    __test__ = False

    def __init__(self, limit: int = 500_000) -> None:
        self.limit = limit
        self._ids: dict[str, int] = {}
        self._lock = threading.Lock()

    def found(self, keys: Iterable[str]) -> dict[str, int]:
        ids = self._ids
        return {k: ids[k] for k in keys if k in ids}

    def learn(self, ids: dict[str, int]) -> None:
        with self._lock:
            self._ids.update(ids)
            overflow = len(self._ids) - self.limit
            if overflow > 0:
                for key in list(itertools.islice(self._ids, overflow)):
                    del self._ids[key]


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


_FAILING_OUTCOMES = frozenset({Outcome.FAILED, Outcome.ERROR})
_PASSED, _SKIPPED = Outcome.PASSED.value, Outcome.SKIPPED.value


def _lines(upload: ResultsUpload, variant: str) -> list[_Line]:
    out = []
    prefix, suffix = _key_ends(upload.repository, variant)
    for t in upload.tests:
        outcome = t.outcome
        failing = outcome in _FAILING_OUTCOMES
        key = _key(prefix, t.test_id, suffix)
        if t.attempts:  # a rerun: the model's rules
            retried, failed, lost = t.passed_on_retry, t.failed_attempts, t.lost_s
        else:  # ran once, as nearly every test does
            retried, failed, lost = False, int(failing), t.duration_s if failing else 0.0
        out.append(
            _Line(
                key,
                outcome._value_,  # the plain attribute: `.value` is a property, 50,000 calls
                failing,
                retried,
                len(t.attempts) + 1,
                failed,
                t.duration_s,
                lost,
                t.signature,
                t.quarantined,
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
    known: TestIds | None = None,
) -> Recorded:
    """Record `upload` (nothing when its ``upload_id`` is already recorded); `known` spares looking
    up the tests it holds."""
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
        skipped=sum(1 for line in lines if line.outcome == _SKIPPED),
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
    ids = writer(session.connection(), now, known).write(upload, variant, names, lines, row.id, storm)
    failed: set[int] = set()
    passed: set[int] = set()
    for line in lines:
        if line.failing or line.retried:
            failed.add(ids[line.key])
        elif line.outcome == _PASSED:
            passed.add(ids[line.key])
    return Recorded(
        upload_pk=row.id, storm=storm, failed=tuple(sorted(failed)), passed=tuple(sorted(passed)), ids=ids
    )


_TEST_COLUMNS = (
    "key", "repository", "test_id", "variant_key", "first_seen", "last_seen", "suspected_flaky",
    "runs", "failures", "passed_on_retry", "skipped", "blocked_runs", "duration_s", "lost_s",
)  # fmt: skip
_RESULT_COLUMNS = ("test_pk", "upload_pk", "\"commit\"", "branch", "outcome", "attempts", "failed_attempts",
                   "duration_s", "lost_s", "signature", "quarantined", "storm", "received_at")  # fmt: skip


class _Writer(ABC):
    """Writes an upload's tests (the new ones) and its results with the driver's fastest bulk
    statements. SQLAlchemy's per-row parameter processing costs more than the database itself at
    this size, so rows go to the driver as plain tuples, their one timestamp converted once. The
    tests' totals are not touched here: the upload's ``history`` step adds them (`add_totals`)."""

    def __init__(self, connection: Any, now: datetime, known: TestIds | None = None) -> None:
        self.connection = connection
        self.known = known
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
        keys = list(dict.fromkeys(line.key for line in lines))
        ids = self.known.found(keys) if self.known is not None else {}
        unknown = [k for k in keys if k not in ids] if ids else keys
        if unknown:
            ids.update(self.existing(unknown))
        missing = [k for k in unknown if k not in ids]
        if missing:
            self.insert_tests(
                [
                    (
                        k,
                        upload.repository,
                        names[k],
                        variant,
                        self.now,
                        self.now,
                        False,
                        0,
                        0,
                        0,
                        0,
                        0,
                        0.0,
                        0.0,
                    )
                    for k in missing
                ]
            )
            ids.update(self.existing(missing))
        results = [
            (ids[line.key], upload_pk, upload.commit, upload.branch, line.outcome, line.attempts,
             line.failed_attempts, line.duration_s, line.lost_s, line.signature, line.quarantined, storm,
             self.now)
            for line in lines
        ]  # fmt: skip
        self.insert_results(results)
        return ids

    @abstractmethod
    def existing(self, keys: list[str]) -> dict[str, int]:
        """See the subclasses."""

    @abstractmethod
    def insert_tests(self, rows: list[tuple[Any, ...]]) -> None:
        """See the subclasses."""

    @abstractmethod
    def insert_results(self, rows: list[tuple[Any, ...]]) -> None:
        """See the subclasses."""


class _SQLiteWriter(_Writer):
    def existing(self, keys: list[str]) -> dict[str, int]:
        ids: dict[str, int] = {}
        for start in range(0, len(keys), 5000):
            chunk = keys[start : start + 5000]
            found = self.connection.exec_driver_sql(
                f"SELECT key, id FROM tests WHERE key IN ({', '.join('?' for _ in chunk)})", tuple(chunk)
            )
            ids.update(dict(found.all()))
        return ids

    def insert_tests(self, rows: list[tuple[Any, ...]]) -> None:
        marks = ", ".join("?" for _ in _TEST_COLUMNS)
        self.connection.exec_driver_sql(
            f"INSERT INTO tests ({', '.join(_TEST_COLUMNS)}) VALUES ({marks}) ON CONFLICT (key) DO NOTHING",
            rows,
        )

    def insert_results(self, rows: list[tuple[Any, ...]]) -> None:
        marks = ", ".join("?" for _ in _RESULT_COLUMNS)
        self.connection.exec_driver_sql(
            f"INSERT INTO test_results ({', '.join(_RESULT_COLUMNS)}) VALUES ({marks})", rows
        )


class _PostgresWriter(_Writer):
    """One ``= ANY`` lookup of every key; new tests and all results by COPY."""

    def cursor(self) -> Any:
        return self.connection.connection.driver_connection.cursor()

    def existing(self, keys: list[str]) -> dict[str, int]:
        cursor = self.cursor()
        # One text parameter (keys are hex): an array parameter of 50,000 strings costs the driver
        # more than the lookup costs the server.
        cursor.execute(
            "SELECT key, id FROM tests WHERE key = ANY(string_to_array(%s, ','))", (",".join(keys),)
        )
        return dict(cursor.fetchall())

    def insert_tests(self, rows: list[tuple[Any, ...]]) -> None:
        cursor = self.cursor()
        cursor.execute(
            "CREATE TEMPORARY TABLE IF NOT EXISTS incoming_tests (LIKE tests INCLUDING DEFAULTS) "
            "ON COMMIT DELETE ROWS"
        )
        cursor.execute("TRUNCATE incoming_tests")
        columns = ", ".join(_TEST_COLUMNS)
        with cursor.copy(f"COPY incoming_tests ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        # Another upload may add the same tests meanwhile: theirs stand, and ours are read after.
        cursor.execute(
            f"INSERT INTO tests ({columns}) SELECT {columns} FROM incoming_tests ON CONFLICT (key) DO NOTHING"
        )

    def insert_results(self, rows: list[tuple[Any, ...]]) -> None:
        # COPY's text format written whole: psycopg's write_row formats each value in Python, which
        # costs more than the server's whole COPY at 50,000 rows. What every row of one upload
        # shares (its id, commit, branch, storm and time) is formatted once; the rest are numbers,
        # booleans, an outcome and a hex signature, which need no escaping.
        if not rows:
            return
        first = rows[0]
        shared = "\t".join(_copy_text(first[i]) for i in (1, 2, 3))
        tail = _copy_text(first[11]) + "\t" + _copy_text(first[12]) + "\n"
        null, yes, no = "\\N", "t", "f"
        block = "".join(
            f"{r[0]}\t{shared}\t{r[4]}\t{r[5]}\t{r[6]}\t{r[7]!r}\t{r[8]!r}\t{r[9] or null}\t"
            f"{yes if r[10] else no}\t{tail}"
            for r in rows
        )
        with self.cursor().copy(f"COPY test_results ({', '.join(_RESULT_COLUMNS)}) FROM STDIN") as copy:
            copy.write(block.encode("utf-8"))


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(value: Any) -> str:
    """A value in COPY's text format: ``\\N`` for NULL, ``t``/``f``, numbers as Python writes them,
    a time in ISO 8601, text with backslash, tab, newline and carriage return escaped."""
    if value is None:
        return "\\N"
    if value is True:
        return "t"
    if value is False:
        return "f"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value).translate(_COPY_ESCAPES)


_FAILING = "('failed', 'error')"
_ADD_TOTALS = f"""
UPDATE tests SET
    runs = tests.runs + a.runs,
    failures = tests.failures + a.failures,
    passed_on_retry = tests.passed_on_retry + a.passed_on_retry,
    skipped = tests.skipped + a.skipped,
    blocked_runs = tests.blocked_runs + a.blocked_runs,
    duration_s = tests.duration_s + a.duration_s,
    lost_s = tests.lost_s + a.lost_s,
    last_seen = a.received_at,
    last_outcome = l.outcome
FROM (
    SELECT test_pk,
        SUM(CASE WHEN storm THEN 0 ELSE 1 END) AS runs,
        SUM(CASE WHEN storm THEN 0 WHEN outcome IN {_FAILING} THEN 1 ELSE 0 END) AS failures,
        SUM(CASE WHEN storm THEN 0 WHEN outcome = 'passed' AND failed_attempts > 0 THEN 1 ELSE 0 END)
            AS passed_on_retry,
        SUM(CASE WHEN storm THEN 0 WHEN outcome = 'skipped' THEN 1 ELSE 0 END) AS skipped,
        SUM(CASE WHEN storm OR quarantined THEN 0 WHEN outcome IN {_FAILING} THEN 1 ELSE 0 END)
            AS blocked_runs,
        SUM(CASE WHEN storm THEN 0 ELSE duration_s END) AS duration_s,
        SUM(CASE WHEN storm THEN 0 ELSE lost_s END) AS lost_s,
        MAX(received_at) AS received_at,
        MAX(id) AS last_id
    FROM test_results WHERE upload_pk = :upload GROUP BY test_pk
) AS a JOIN test_results AS l ON l.id = a.last_id
WHERE tests.id = a.test_pk
"""


def add_totals(session: Session, upload_pk: int) -> bool:
    """Add an upload's results to its tests' totals, once (the upload remembers it was done):
    False when they were added before. A storm's results change no total but ``last_seen``."""
    done = session.execute(
        update(UploadRow)
        .where(UploadRow.id == upload_pk, UploadRow.totals_added.is_(False))
        .values(totals_added=True)
    )
    if not getattr(done, "rowcount", 0):
        return False
    session.execute(text(_ADD_TOTALS), {"upload": upload_pk})
    return True


# -- reading ----------------------------------------------------------------------------------------
def recent_results(session: Session, test_pk: int, limit: int = RECENT) -> list[ResultRow]:
    """A test's latest results, newest first (one index range scan: ``ix_test_results_test``)."""
    return list(
        session.scalars(
            select(ResultRow).where(ResultRow.test_pk == test_pk).order_by(ResultRow.id.desc()).limit(limit)
        )
    )


class ResultFacts(Protocol):
    """What `HistoryStats.of` reads of a result: a `ResultRow`, or a lighter copy of its columns."""

    @property
    def id(self) -> int: ...
    @property
    def outcome(self) -> str: ...
    @property
    def commit(self) -> str | None: ...
    @property
    def failed_attempts(self) -> int: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def storm(self) -> bool: ...


FAILING = frozenset(o.value for o in Outcome if o.failing)
"""The outcomes that are failures, by value."""


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
    def of(cls, results: Sequence[ResultFacts]) -> HistoryStats:
        """From results in any order (sorted by id here)."""
        ordered = sorted((r for r in results if not r.storm), key=lambda r: r.id)
        counted = [r for r in ordered if r.outcome != Outcome.SKIPPED.value]
        failing = [r.outcome in FAILING for r in counted]
        flips = sum(1 for a, b in itertools.pairwise(failing) if a != b)
        by_commit: dict[str, set[bool]] = {}
        for r, fails in zip(counted, failing, strict=True):
            if r.commit:
                seen = by_commit.setdefault(r.commit, set())
                seen.add(fails)
                if r.failed_attempts and not fails:
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
