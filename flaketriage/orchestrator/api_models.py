"""The HTTP API's response bodies (pydantic), so the OpenAPI document says what each route returns."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


class Problem(BaseModel):
    """Every error: what was wrong and what to do."""

    detail: str


class Accepted(BaseModel):
    """A delivery's fate: ``accepted`` (work started), ``recorded``, ``duplicate`` or ``ignored``."""

    outcome: str
    cases: list[int] = Field(default_factory=list)
    work: list[int] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class CaseVerdict(StrEnum):
    """The verdicts a case is recorded with, as ``/v1/cases?verdict=`` accepts them: the values of
    `flaketriage.workers.verdict.Verdict` (the service does not import the workers; a test keeps
    the two equal)."""

    DETERMINISTIC = "deterministic"
    FLAKY = "flaky"
    NOT_REPRODUCED = "not_reproduced"
    DIFFERENT_FAILURE = "different_failure"
    ORDER_DEPENDENT = "order_dependent"
    ENVIRONMENT = "environment"
    ENVIRONMENT_SPECIFIC = "environment_specific"


class CaseSummary(BaseModel):
    id: int
    fingerprint: str
    kind: str
    title: str
    status: str
    verdict: str | None
    test_id: str | None
    job: str | None
    repository: str | None
    occurrences: int
    first_seen: datetime
    last_seen: datetime
    bundles: list[str]
    report_kind: str | None
    report_url: str | None
    storm_of: int | None
    error: str | None


class ReplayView(BaseModel):
    index: int
    outcome: str | None
    fingerprint: str | None
    summary: str | None
    duration_s: float | None
    cpu_s: float | None = None
    """CPU seconds of its process tree (None: not measured, as in a container)."""
    gpu_s: float | None = None
    """Its wall time times the GPUs it was given."""
    runner: str | None
    """The machine (host and GPUs) it ran on."""
    worker: str | None = None
    """The worker process (``host:pid``) that ran it."""


class WorkView(BaseModel):
    id: int
    step: str
    status: str
    bundle_id: str | None
    queue: str
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    result: dict[str, Any] | None
    error: str | None
    replays: list[ReplayView]


class OccurrenceView(BaseModel):
    source: str
    delivery_id: str
    """The delivery's key: an event's ``event_id``; for GitHub and Sentry what the body is about
    (``workflow_run:<id>:<attempt>``, ``event_alert:<event id>`` ...), else ``delivery:`` and the
    sender's delivery id."""
    bundle_id: str | None
    test_id: str | None
    provenance: dict[str, Any]
    received_at: datetime


class PhaseCostView(BaseModel):
    """The replays of one phase of a triage (``verdict``, ``order``, ``minimize``), added up."""

    runs: int
    cpu_s: float
    gpu_s: float
    wall_s: float
    unmeasured: int = 0
    """Runs whose CPU seconds the sandbox could not measure (counted as 0)."""


class TriageCostView(PhaseCostView):
    """What a case's triage cost, as its result records it (``flaketriage triage --json``'s ``cost``)."""

    gpus: int
    """GPUs each replay was given (0: none)."""
    budget_s: float | None
    """``FLAKETRIAGE_TRIAGE_BUDGET_S``: CPU plus GPU seconds the triage might use (None: no cap)."""
    budget_spent: bool
    """The budget stopped the triage: its verdict is undecided."""
    phases: dict[str, PhaseCostView]


class ProgressView(BaseModel):
    """How far the case's work under way is (None on a case with none under way)."""

    step: str
    """``verdict`` (the sequential test's replays), ``order search`` (looking for the tests that
    make it fail), ``minimize``, ``report``, ``telemetry`` or ``rerun``."""
    replays_done: int
    """Replays of its latest triage that have ended."""
    replays_planned: int
    """Replays sent so far (a batch in flight), or, for a triage that runs in one task (an
    order-dependent test's), the most its sequential test may run; never below ``replays_done``."""
    work_id: int
    """The work row (``triage_runs[].id``) the step is."""


class CaseLink(BaseModel):
    """Another case about the same CI run: a failed workflow run or check and the failures captured in it."""

    id: int
    kind: str
    title: str
    run_url: str
    """The run (``https://<host>/<owner>/<repo>/actions/runs/<id>``) both name."""


class CaseImpact(BaseModel):
    """What a case cost: CI time its test lost, the runs it blocked, and the replays spent on it."""

    ci_lost_s: float
    """CI seconds its test lost in every variant (failing attempts, and the reruns they caused)."""
    blocked_runs: int
    """CI runs its test failed without a quarantine to forgive it."""
    replay_cpu_s: float
    """CPU seconds of every replay of the case (every triage, rerun and telemetry run)."""
    replay_gpu_s: float
    replays: int


class CaseDetail(CaseSummary):
    evidence: dict[str, Any] | None
    cost: TriageCostView | None = None
    """What its latest triage cost: CPU, GPU and wall seconds of the replays, by phase."""
    impact: CaseImpact | None = None
    """Its cost to CI and to triage, all told."""
    progress: ProgressView | None = None
    """While work on it runs: the step and the replays done and planned."""
    linked_cases: list[CaseLink] = Field(default_factory=list)
    """Cases about the same CI run: for a failed run, the failures captured in it; for a captured
    failure, the run (workflow run, check run) it failed in and the other failures captured in it."""
    occurrence_list: list[OccurrenceView]
    triage_runs: list[WorkView]


class ResultsAccepted(BaseModel):
    """An upload of CI results: ``accepted`` (recorded; what it says is being looked at) or
    ``duplicate`` (its ``upload_id`` was recorded before: nothing changed)."""

    outcome: str
    upload: int | None
    tests: int
    failures: int
    passed_on_retry: int
    storm: bool
    """More than ``FLAKETRIAGE_STORM_SHARE`` of its tests failed: an outage, not flakiness."""
    work: list[int] = Field(default_factory=list)


class TestSummary(BaseModel):
    """A test in one variant of one repository, with its totals and what its recent results say."""

    __test__ = False

    id: int
    repository: str
    test_id: str
    variant: str
    first_seen: datetime
    last_seen: datetime
    runs: int
    failures: int
    passed_on_retry: int
    """Runs in which it failed, then passed when run again in the same job."""
    skipped: int
    blocked_runs: int
    mean_duration_s: float
    ci_lost_s: float
    """CI seconds lost: its failing attempts, and the reruns they caused."""
    last_outcome: str | None
    suspected_flaky: bool
    quarantined: bool
    case_id: int | None


class TestResultView(BaseModel):
    __test__ = False

    outcome: str
    attempts: int
    failed_attempts: int
    duration_s: float
    commit: str | None
    branch: str | None
    job: str | None
    run_url: str | None
    quarantined: bool
    storm: bool
    received_at: datetime


class TestDetail(TestSummary):
    """A test's page: its recent results, newest first, and what they say."""

    flaky_commits: int
    """Commits on which it both failed and passed (in its recent results)."""
    flip_rate: float
    """The share of its recent consecutive results whose outcome changed between pass and fail."""
    recent: list[TestResultView]
    cases: list[int]
    """Cases about this test (any source), newest first."""
    replay_cpu_s: float
    replay_gpu_s: float


class GPUView(BaseModel):
    name: str
    uuid: str | None


class RunnerSummary(BaseModel):
    """A machine replays ran on; ``suspect`` once environment-specific failures keep reproducing on it."""

    id: str
    host: str
    gpus: list[GPUView]
    driver: str | None
    first_seen: datetime
    last_seen: datetime
    replays: int
    environment_specific: int
    suspect: bool
    last_case_id: int | None


class Health(BaseModel):
    status: str
    database: str | None = None
    broker: str | None = None
