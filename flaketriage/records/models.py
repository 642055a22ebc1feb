"""The tables: what arrived (deliveries, occurrences), what it is about (cases), what was done (work,
replays), what stands (quarantine) and the machines replays ran on (runners).

A case is one failure, keyed by its identity (the same exception through the same code path, from
any source); its fingerprint is what its replays are matched against. An occurrence is one report
of it (an event, a GitHub run, a Sentry alert). Work is one step of the pipeline for a case and a
bundle (triage, minimize, report, telemetry, rerun), keyed so that the same step is never done
twice; a triage's replays are rows of their own, so replays running on several workers add up to
one verdict.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from enum import StrEnum
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator


def utc_now() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend (SQLite keeps no zone; PostgreSQL does)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
        list[Any]: JSON(),
    }


class CaseStatus(StrEnum):
    """Where a case stands: ``queued → triaging → decided → reported``, or ``failed`` with the error.

    ``open`` is a case with nothing to replay yet (a failed workflow run that named no bundle);
    ``suspected_flaky`` one that CI history calls flaky (it failed and passed on one commit, or its
    outcome flips) before any replay confirmed it; ``fixed`` a case closed as fixed (its quarantine
    lifted, or its test passing on its branch), which a new occurrence reopens and triages again.
    """

    OPEN = "open"
    SUSPECTED_FLAKY = "suspected_flaky"
    QUEUED = "queued"
    TRIAGING = "triaging"
    DECIDED = "decided"
    REPORTED = "reported"
    FAILED = "failed"
    FIXED = "fixed"


class WorkStatus(StrEnum):
    """Where a step stands: ``queued → running → done``, or ``failed`` with the error; a triage
    whose replays are out is ``waiting`` (the last replay to finish sends it on)."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"


def _fingerprint_of_row(context: Any) -> str | None:
    """A case written without an identity is keyed by its fingerprint."""
    value = context.get_current_parameters().get("fingerprint")
    return value if isinstance(value, str) else None


class Case(Base):
    __tablename__ = "cases"
    __table_args__ = (
        # The dashboard's cases list, newest first or by occurrences (migration 0006).
        Index("ix_cases_last_seen", "last_seen", "id"),
        Index("ix_cases_occurrences", "occurrences", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(128), unique=True)
    """What the replays of its first bundle are matched against."""
    identity: Mapped[str | None] = mapped_column(
        String(128), unique=True, index=True, default=_fingerprint_of_row
    )
    """What the case is found by, whatever the source: the failure's exception through its code
    path for a pytest test (`flaketriage.bundle.manifest.Failure.identity`), else its fingerprint. Cases
    recorded before it have their fingerprint (migration 0004) until a sighting of theirs that has
    an identity is recorded: then they adopt it (`flaketriage.orchestrator.case_batch`)."""
    cause_key: Mapped[str | None] = mapped_column(String(64), index=True)
    """The failure without the test that hit it: many tests failing of one cause share it."""
    kind: Mapped[str] = mapped_column(String(16))
    """``bundle`` (a captured failure), ``workflow`` (a failed GitHub run), ``sentry``, or
    ``history`` (a test CI history suspects of flakiness, before any bundle of it was triaged)."""
    title: Mapped[str] = mapped_column(Text, default="")
    test_id: Mapped[str | None] = mapped_column(Text)
    job: Mapped[str | None] = mapped_column(Text)
    repository: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default=CaseStatus.QUEUED.value, index=True)
    verdict: Mapped[str | None] = mapped_column(String(32), index=True)
    error: Mapped[str | None] = mapped_column(Text)
    first_seen: Mapped[datetime] = mapped_column(default=utc_now)
    last_seen: Mapped[datetime] = mapped_column(default=utc_now)
    occurrences: Mapped[int] = mapped_column(Integer, default=0)
    report_kind: Mapped[str | None] = mapped_column(String(16))
    report_url: Mapped[str | None] = mapped_column(Text)
    last_triage_at: Mapped[datetime | None] = mapped_column()
    evidence: Mapped[dict[str, Any] | None] = mapped_column()
    """The last triage's result (`TriageResult.to_json()`)."""
    generation: Mapped[int] = mapped_column(Integer, default=0)
    """Counts the times the case was triaged afresh (reopened, or its last triage grew old)."""
    storm_of: Mapped[int | None] = mapped_column(ForeignKey("cases.id"))
    """The case whose triage stands for this one: same cause, reported while that one ran."""

    occurrence_rows: Mapped[list[Occurrence]] = relationship(
        back_populates="case", order_by="Occurrence.id", cascade="all, delete-orphan"
    )
    work_rows: Mapped[list[Work]] = relationship(back_populates="case", order_by="Work.id")


class Occurrence(Base):
    __tablename__ = "occurrences"
    __table_args__ = (
        UniqueConstraint("source", "delivery_id", "case_id", name="uq_occurrence_delivery"),
        # The dashboard (migration 0006): a case's latest occurrences, the failures of each day,
        # the cases of a CI run and of a branch.
        # (``case_id, id`` stands for the index on ``case_id`` alone that it replaced.) The two
        # columns most occurrences leave empty (a bundle captured outside CI names no run, only a
        # workflow run names its branch) are indexed where they are filled.
        Index("ix_occurrences_case_latest", "case_id", "id"),
        Index("ix_occurrences_received", "received_at", "case_id"),
        Index(
            "ix_occurrences_run_url",
            "run_url",
            "case_id",
            sqlite_where=text("run_url IS NOT NULL"),
            postgresql_where=text("run_url IS NOT NULL"),
        ),
        Index(
            "ix_occurrences_branch",
            "branch",
            "id",
            sqlite_where=text("branch IS NOT NULL"),
            postgresql_where=text("branch IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    case_id: Mapped[int] = mapped_column(ForeignKey("cases.id"))
    source: Mapped[str] = mapped_column(String(16))
    delivery_id: Mapped[str] = mapped_column(String(128))
    bundle_id: Mapped[str | None] = mapped_column(String(64))
    store_url: Mapped[str | None] = mapped_column(Text)
    test_id: Mapped[str | None] = mapped_column(Text)
    provenance: Mapped[dict[str, Any]] = mapped_column(default=dict)
    run_url: Mapped[str | None] = mapped_column(String(1000))
    """The CI run it came from, as its provenance names it (`flaketriage.records.provenance`): what
    finds it again from the run's results upload (``result_uploads.run_url``)."""
    branch: Mapped[str | None] = mapped_column(String(255))
    """The branch its provenance names (a failed workflow run's ``head_branch``), when it does."""
    received_at: Mapped[datetime] = mapped_column(default=utc_now)

    case: Mapped[Case] = relationship(back_populates="occurrence_rows")


class Delivery(Base):
    """One delivery, by its key (an event's ``event_id``; what a GitHub or Sentry body is about, else
    ``delivery:`` and the sender's delivery id: `flaketriage.orchestrator.payloads.Parsed.subject`):
    a repeat is acknowledged and writes nothing."""

    __tablename__ = "deliveries"
    __table_args__ = (UniqueConstraint("source", "delivery_id", name="uq_delivery"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    source: Mapped[str] = mapped_column(String(16))
    delivery_id: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(32))
    received_at: Mapped[datetime] = mapped_column(default=utc_now)


class Work(Base):
    """One step for one case and bundle; ``key`` makes a repeated request the same row."""

    __tablename__ = "work"
    __table_args__ = (Index("ix_work_status_sent", "status", "sent_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(200), unique=True)
    case_id: Mapped[int | None] = mapped_column(ForeignKey("cases.id"), index=True)
    bundle_id: Mapped[str | None] = mapped_column(String(64))
    store_url: Mapped[str | None] = mapped_column(Text)
    step: Mapped[str] = mapped_column(String(16))
    queue: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default=WorkStatus.QUEUED.value)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    batch: Mapped[int] = mapped_column(Integer, default=0)
    """For a triage: the number of replay batches sent so far."""
    options: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """What the step was asked for: minimize, a reply target, a longer budget ..."""
    result: Mapped[dict[str, Any] | None] = mapped_column()
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utc_now)
    sent_at: Mapped[datetime | None] = mapped_column()
    """When its task was last handed to the broker; the sweep re-sends what waits too long."""
    started_at: Mapped[datetime | None] = mapped_column()
    heartbeat_at: Mapped[datetime | None] = mapped_column()
    """Refreshed while a worker runs it: a running step whose heartbeat stops was lost with its worker."""
    finished_at: Mapped[datetime | None] = mapped_column()

    case: Mapped[Case | None] = relationship(back_populates="work_rows")
    replays: Mapped[list[ReplayRow]] = relationship(back_populates="work", order_by="ReplayRow.idx")


class ReplayRow(Base):
    """One replay of a triage, run by whichever worker took it."""

    __tablename__ = "replays"
    __table_args__ = (
        UniqueConstraint("work_id", "idx", name="uq_replay_index"),
        # The dashboard's triage time of the last days, read from the index alone (migration 0006).
        Index("ix_replays_finished", "finished_at", "cpu_s", "gpu_s"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    work_id: Mapped[int] = mapped_column(ForeignKey("work.id"), index=True)
    idx: Mapped[int] = mapped_column(Integer)
    batch: Mapped[int] = mapped_column(Integer, default=0)
    outcome: Mapped[str | None] = mapped_column(String(32))
    """None while it runs; then an `Outcome` value."""
    fingerprint: Mapped[str | None] = mapped_column(String(128))
    summary: Mapped[str | None] = mapped_column(Text)
    duration_s: Mapped[float | None] = mapped_column(Float)
    cpu_s: Mapped[float | None] = mapped_column(Float)
    """CPU seconds of its process tree; None where the sandbox could not measure them (a container)."""
    gpu_s: Mapped[float | None] = mapped_column(Float)
    """Its wall time times the GPUs it was given (0 for a bundle captured without GPUs)."""
    runner: Mapped[str | None] = mapped_column(String(200))
    """The machine it ran on (`RunnerRow.id`: host and GPUs), what hardware attribution compares."""
    worker: Mapped[str | None] = mapped_column(String(200))
    """The worker process that ran it (``host:pid``)."""
    created_at: Mapped[datetime] = mapped_column(default=utc_now)
    sent_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()

    work: Mapped[Work] = relationship(back_populates="replays")


class QuarantineRow(Base):
    """A quarantined failure: the service's copy of a `flaketriage.quarantine.QuarantineEntry`."""

    __tablename__ = "quarantine"

    fingerprint: Mapped[str] = mapped_column(String(128), primary_key=True)
    case_id: Mapped[int | None] = mapped_column(ForeignKey("cases.id"))
    entry: Mapped[dict[str, Any]] = mapped_column()
    """The entry as `QuarantineEntry.model_dump(mode="json")`."""
    clean_reruns: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(default=utc_now)


class RunnerRow(Base):
    """A machine replays ran on, by its runner id (`flaketriage.workers.attribution.RunnerIdentity`).

    A runner named in environment-specific verdicts (the failure reproduced there and not on other
    hardware) counts them; past ``FLAKETRIAGE_RUNNER_SUSPECT_AFTER`` it is flagged as suspect, to be
    drained and checked.
    """

    __tablename__ = "runners"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    gpus: Mapped[list[Any]] = mapped_column(default=list)
    """``[{"name": ..., "uuid": ...}]``, by index."""
    driver: Mapped[str | None] = mapped_column(String(64))
    first_seen: Mapped[datetime] = mapped_column(default=utc_now)
    last_seen: Mapped[datetime] = mapped_column(default=utc_now)
    replays: Mapped[int] = mapped_column(Integer, default=0)
    environment_specific: Mapped[int] = mapped_column(Integer, default=0)
    """Environment-specific verdicts in which a failure reproduced here and not elsewhere."""
    suspect: Mapped[bool] = mapped_column(Boolean, default=False, index=True)
    last_case_id: Mapped[int | None] = mapped_column(ForeignKey("cases.id"))
    """The case of the latest such verdict."""


BigId = BigInteger().with_variant(Integer, "sqlite")
"""A 64-bit key (SQLite's rowid is one already, and autoincrements only as ``INTEGER``)."""


class UploadRow(Base):
    """One job's results as uploaded (`flaketriage.results.ResultsUpload`), by its ``upload_id``:
    an upload sent again is the same row and records nothing. A run in which more than
    ``FLAKETRIAGE_STORM_SHARE`` of its tests failed is a ``storm`` (an outage, not flakiness)."""

    __tablename__ = "result_uploads"
    __table_args__ = (
        Index("ix_result_uploads_commit", "repository", "commit"),
        # The dashboard (migration 0006): the latest runs of a branch, the CI time lost each day,
        # the upload of a case's CI run (a hash index on PostgreSQL: a run URL may be 2,000
        # characters, more than a B-tree entry holds).
        Index("ix_result_uploads_branch", "branch", "id"),
        Index("ix_result_uploads_received", "received_at", "storm", "lost_s"),
        Index("ix_result_uploads_run_url", "run_url", postgresql_using="hash"),
        # The commit grid and the tests' branch filter (migration 0007): a repository's branch's
        # latest uploads, where "main" is a branch of every repository.
        Index("ix_result_uploads_repository_branch", "repository", "branch", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    upload_id: Mapped[str] = mapped_column(String(128), unique=True)
    source: Mapped[str] = mapped_column(String(16))
    repository: Mapped[str] = mapped_column(String(200))
    branch: Mapped[str | None] = mapped_column(String(255))
    commit: Mapped[str | None] = mapped_column(String(64))
    pull_request: Mapped[int | None] = mapped_column(Integer)
    run_id: Mapped[str | None] = mapped_column(String(200))
    run_url: Mapped[str | None] = mapped_column(Text)
    job: Mapped[str | None] = mapped_column(String(200))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    variant_key: Mapped[str] = mapped_column(Text, default="")
    tests: Mapped[int] = mapped_column(Integer, default=0)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    """Tests whose final outcome failed."""
    passed_on_retry: Mapped[int] = mapped_column(Integer, default=0)
    skipped: Mapped[int] = mapped_column(Integer, default=0)
    duration_s: Mapped[float] = mapped_column(Float, default=0.0)
    lost_s: Mapped[float] = mapped_column(Float, default=0.0)
    storm: Mapped[bool] = mapped_column(Boolean, default=False)
    totals_added: Mapped[bool] = mapped_column(Boolean, default=False)
    """Its results were added to its tests' totals (by its ``history`` step, once)."""
    received_at: Mapped[datetime] = mapped_column(default=utc_now)


class TestRow(Base):
    """A test in one variant (`flaketriage.variant`) of one repository, with running totals.

    Totals leave out storm runs (an outage says nothing about a test); the results themselves are
    rows of `ResultRow`, rolled up into `TestDayRow` when they grow old."""

    __test__ = False  # not a pytest test class
    __tablename__ = "tests"
    __table_args__ = (
        Index("ix_tests_repository_seen", "repository", "last_seen"),
        # A case's test in CI history, by its id (migration 0006). A hash index on PostgreSQL: a test
        # id may be longer than a B-tree entry can be, and it is only ever looked up by equality.
        Index("ix_tests_test_id", "test_id", postgresql_using="hash"),
        # The dashboard's tests list in its three orders (migration 0007).
        Index("ix_tests_last_seen", "last_seen", "id"),
        Index("ix_tests_lost", "lost_s", "id"),
        Index("ix_tests_failures", "failures", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    """`flaketriage.records.history.test_key` of repository, test id and variant key."""
    repository: Mapped[str] = mapped_column(String(200))
    test_id: Mapped[str] = mapped_column(Text)
    variant_key: Mapped[str] = mapped_column(Text, default="")
    first_seen: Mapped[datetime] = mapped_column(default=utc_now)
    last_seen: Mapped[datetime] = mapped_column(default=utc_now)
    runs: Mapped[int] = mapped_column(Integer, default=0)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    """Runs whose final outcome failed (quarantined ones included: they still count)."""
    passed_on_retry: Mapped[int] = mapped_column(Integer, default=0)
    skipped: Mapped[int] = mapped_column(Integer, default=0)
    blocked_runs: Mapped[int] = mapped_column(Integer, default=0)
    """Runs it failed without a quarantine to forgive it: the job went red because of it."""
    duration_s: Mapped[float] = mapped_column(Float, default=0.0)
    """The total of its final attempts' durations (the mean is this over ``runs``)."""
    lost_s: Mapped[float] = mapped_column(Float, default=0.0)
    """CI seconds lost: its failing attempts and the reruns they caused."""
    last_outcome: Mapped[str | None] = mapped_column(String(8))
    suspected_flaky: Mapped[bool] = mapped_column(Boolean, default=False)
    case_id: Mapped[int | None] = mapped_column(ForeignKey("cases.id"))
    """The case history opened for it (``suspected_flaky``), when it did."""


class ResultRow(Base):
    """One test's result in one upload."""

    __tablename__ = "test_results"
    __table_args__ = (
        Index("ix_test_results_test", "test_pk", "id"),
        Index("ix_test_results_commit", "test_pk", "commit"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    """Increases with arrival: the roll-up walks the oldest first by it."""
    # No foreign keys: checking two per row doubled the time of writing a 50,000-test upload
    # (`flaketriage.records.history` writes both ids itself, in the transaction that makes them).
    test_pk: Mapped[int] = mapped_column(Integer)
    upload_pk: Mapped[int] = mapped_column(Integer, index=True)
    commit: Mapped[str | None] = mapped_column(String(64))
    branch: Mapped[str | None] = mapped_column(String(255))
    outcome: Mapped[str] = mapped_column(String(8))
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    failed_attempts: Mapped[int] = mapped_column(Integer, default=0)
    duration_s: Mapped[float] = mapped_column(Float, default=0.0)
    lost_s: Mapped[float] = mapped_column(Float, default=0.0)
    signature: Mapped[str | None] = mapped_column(String(128))
    quarantined: Mapped[bool] = mapped_column(Boolean, default=False)
    storm: Mapped[bool] = mapped_column(Boolean, default=False)
    received_at: Mapped[datetime] = mapped_column(default=utc_now)


class TestDayRow(Base):
    """A test's results of one day, once its rows are rolled up (``FLAKETRIAGE_RESULTS_KEEP_DAYS``)."""

    __test__ = False
    __tablename__ = "test_days"

    test_pk: Mapped[int] = mapped_column(ForeignKey("tests.id"), primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    runs: Mapped[int] = mapped_column(Integer, default=0)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    passed_on_retry: Mapped[int] = mapped_column(Integer, default=0)
    storm_runs: Mapped[int] = mapped_column(Integer, default=0)
    duration_s: Mapped[float] = mapped_column(Float, default=0.0)
    lost_s: Mapped[float] = mapped_column(Float, default=0.0)


class CheckRunRow(Base):
    """The pull request check run of one commit: where it was published, to update it in place."""

    __tablename__ = "check_runs"
    __table_args__ = (UniqueConstraint("repository", "head_sha", name="uq_check_run_commit"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repository: Mapped[str] = mapped_column(String(200))
    head_sha: Mapped[str] = mapped_column(String(64))
    pull_request: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str | None] = mapped_column(String(16))
    """``github`` or ``markdown``; None until first published."""
    location: Mapped[str | None] = mapped_column(Text)
    """The check run's id, or the Markdown file's path."""
    url: Mapped[str | None] = mapped_column(Text)
    conclusion: Mapped[str | None] = mapped_column(String(16))
    updated_at: Mapped[datetime] = mapped_column(default=utc_now)


class FailureDayRow(Base):
    """The failures (occurrences) of one complete UTC day by the verdict their case had when the day
    was last rolled up (`flaketriage.records.failure_days`): what the overview's chart reads."""

    __tablename__ = "failure_days"

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    verdict: Mapped[str] = mapped_column(String(32), primary_key=True)
    """The case's verdict; ``""`` for a case without one yet."""
    failures: Mapped[int] = mapped_column(Integer, default=0)
    rolled_at: Mapped[datetime] = mapped_column(default=utc_now)
