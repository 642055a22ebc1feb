"""Fixtures for the dashboard's pages: a receiver on the `database` fixture (SQLite and PostgreSQL)
driven in-process, empty (`dashboard`) or over a small realistic world (`seeded`).

The world is written by the writers the service itself uses: occurrences by the intake (with its
clock set to each day), statuses and verdicts by `flaketriage.records.transitions` with evidence
from the workers' own `TriageResult.to_json()`, runners by `record_replay`, the quarantine by
`RecordsQuarantine`, CI history by `record_upload` and the history step's `add_totals` (and
`roll_up` for old results). Replay rows are written as a worker writes them (`TriageProgress`
does the same insert). Every case name, id, run and figure a test may assert on is in `World`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from flaketriage.orchestrator.app import create_app
from flaketriage.orchestrator.intake import Intake, Sighting
from flaketriage.orchestrator.service import Service
from flaketriage.quarantine import FailureRate, QuarantineEvidence
from flaketriage.records import Case, Database, ReplayRow, Work
from flaketriage.records.history import add_totals, record_upload, roll_up
from flaketriage.records.models import TestRow, utc_now
from flaketriage.records.transitions import (
    case_decided,
    case_failed,
    case_fixed,
    case_reported,
    case_suspected,
    case_triaging,
    work_row_done,
)
from flaketriage.results import Attempt, ResultsUpload, TestResult
from flaketriage.settings import load_settings
from flaketriage.work.dispatch import MemorySender
from flaketriage.workers.attribution import GPUIdentity, RunnerIdentity
from flaketriage.workers.cost import PhaseCost, TriageCost
from flaketriage.workers.minimize.minimizer import MinimizeResult
from flaketriage.workers.quarantine.records import RecordsQuarantine
from flaketriage.workers.report import ReportRef
from flaketriage.workers.runners import record_replay
from flaketriage.workers.triage import TriageResult
from flaketriage.workers.verdict import RateInterval, Verdict, VerdictResult

STORE = "s3://acme-bundles/flaketriage"
HOSTILE_TEST = 'tests/test_x.py::test_<script>alert("x")</script>&amp;'
GPU_RUNNER = RunnerIdentity("gpu-1", (GPUIdentity("NVIDIA H100", "GPU-0f1e"),), "550.54")
CPU_RUNNER = RunnerIdentity("cpu-1")


@dataclass
class Dashboard:
    """A receiver's app over one database, and a client for it."""

    service: Service
    client: TestClient

    @property
    def database(self) -> Database:
        return self.service.database


def _dashboard(database: Database, tmp_path: Path) -> Dashboard:
    settings = load_settings(store=str(tmp_path / "store"), webhook_secret="dashboard-secret")
    service = Service.assemble(settings, database, MemorySender())
    return Dashboard(service, TestClient(create_app(service)))


@pytest.fixture
def dashboard(database: Database, tmp_path: Path) -> Iterator[Dashboard]:
    """The dashboard over an empty database."""
    made = _dashboard(database, tmp_path)
    yield made
    made.client.close()


# -- the world ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CaseSpec:
    """A case of the world: its occurrences' days (days ago, oldest first) and where it ran."""

    key: str
    repository: str
    test_id: str | None
    days: tuple[int, ...]
    kind: str = "bundle"
    first_run: int = 0
    """The number of its first CI run (one run per occurrence); 0: no CI run."""

    def run_url(self, i: int) -> str | None:
        return (
            f"https://github.com/{self.repository}/actions/runs/{self.first_run + i}"
            if self.first_run
            else None
        )

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(f"fingerprint:{self.key}".encode()).hexdigest()[:32]

    @property
    def bundle(self) -> str | None:
        return hashlib.sha256(f"bundle:{self.key}".encode()).hexdigest() if self.kind == "bundle" else None


APP, LIB = "acme/app", "acme/lib"
SPECS = (
    CaseSpec(
        "deterministic", APP, "tests/test_db.py::test_migrate", (4, 3, 2, 1, 0), first_run=1001
    ),
    CaseSpec(
        "flaky", APP, "tests/test_net.py::test_retry", (10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0),
        first_run=2001,
    ),
    CaseSpec("flaky_lib", LIB, "tests/test_sched.py::test_timer", (0,), first_run=2101),
    CaseSpec("order_dependent", LIB, "tests/test_cache.py::test_lookup", (6, 2), first_run=3001),
    CaseSpec("environment_specific", LIB, "tests/test_gpu.py::test_kernel", (3,), first_run=3101),
    CaseSpec("not_reproduced", APP, "tests/test_io.py::test_read", (20,)),
    CaseSpec("queued", APP, "tests/test_api.py::test_post", (0,), first_run=4001),
    CaseSpec("triaging", APP, "tests/test_api.py::test_get", (1,)),
    CaseSpec("suspected", APP, "tests/test_time.py::test_clock", (2, 1), first_run=1004),
    CaseSpec("failed", LIB, "tests/test_build.py::test_wheel", (5,)),
    CaseSpec("fixed", APP, "tests/test_old.py::test_gone", (40,)),
    CaseSpec("workflow", APP, None, (1,), kind="workflow", first_run=5001),
    CaseSpec("hostile", APP, HOSTILE_TEST, (0,)),
)  # fmt: skip
"""The flaky case's last six runs uploaded their results from ``feature/login``, the others from the
branch named; ``suspected`` shares the deterministic case's last two runs (1004 and 1005)."""
FEATURE_BRANCH = "feature/login"
WORKFLOW_BRANCH = "release/1.0"


@dataclass
class World:
    """What `seeded` wrote, for the tests to assert on."""

    dashboard: Dashboard
    now: datetime
    cases: dict[str, int] = field(default_factory=dict)
    """Case ids by `CaseSpec.key`."""
    tests: dict[str, int] = field(default_factory=dict)
    """`TestRow` ids by test id (one variant each)."""
    specs: dict[str, CaseSpec] = field(default_factory=lambda: {s.key: s for s in SPECS})
    ci_lost_30_days_s: float = 0.0
    """CI seconds lost in the results uploads of the last 30 days (storms left out)."""
    triage_cpu_30_days_s: float = 0.0
    triage_gpu_30_days_s: float = 0.0
    replays_30_days: int = 0

    @property
    def client(self) -> TestClient:
        return self.dashboard.client

    @property
    def database(self) -> Database:
        return self.dashboard.database

    def at(self, days_ago: int) -> datetime:
        return self.now - timedelta(days=days_ago)

    def verdict(self, key: str) -> str | None:
        with self.database.session() as session:
            return session.get_one(Case, self.cases[key]).verdict


def _evidence(
    spec: CaseSpec,
    verdict: Verdict,
    *,
    replays: int,
    failures: int,
    rate: tuple[float, float, float],
    minimized: MinimizeResult | None = None,
    report: ReportRef | None = None,
) -> dict[str, Any]:
    """The evidence a triage records: `TriageResult.to_json()`."""
    assert spec.bundle is not None
    low, estimate, high = rate
    cost = TriageCost(
        phases={
            "verdict": PhaseCost(
                runs=replays, cpu_s=replays * 12.5, gpu_s=replays * 30.0, wall_s=replays * 40.0
            )
        },
        gpus=1,
        budget_s=3600.0,
    )
    return TriageResult(
        bundle_id=spec.bundle,
        verdict=VerdictResult(
            verdict=verdict,
            decided=True,
            replays=replays,
            reproductions=failures,
            passes=replays - failures,
            different=0,
            rate=RateInterval(estimate=estimate, low=low, high=high),
        ),
        minimized=minimized,
        report=report,
        cost=cost,
    ).to_json()


def _sightings(spec: CaseSpec, i: int) -> Sighting:
    run = spec.run_url(i)
    if spec.kind == "workflow":
        provenance = {
            "ci_provider": "github-actions",
            "workflow": "CI",
            "head_branch": WORKFLOW_BRANCH,
            "run_url": run,
        }
        return Sighting(
            fingerprint=spec.fingerprint,
            kind="workflow",
            title=f"{spec.repository}: workflow CI failed",
            job="CI",
            repository=spec.repository,
            provenance=provenance,
            trigger="never",
        )
    provenance: dict[str, Any] = {"ci_provider": "github-actions", "job": "test", "host": "runner-7"}
    if run:
        provenance["run_url"] = run
    return Sighting(
        fingerprint=spec.fingerprint,
        kind="bundle",
        title=f"{spec.test_id}: AssertionError",
        test_id=spec.test_id,
        job="test",
        repository=spec.repository,
        bundle_id=spec.bundle,
        store_url=STORE,
        provenance=provenance,
    )


def _record_occurrences(world: World) -> None:
    """Every occurrence through the intake, oldest first, its clock set to the occurrence's time."""
    service = world.dashboard.service
    clock = [world.now]
    intake = Intake(
        service.database, service.dispatcher, retriage_after_s=10**9, storm_window_s=0, clock=lambda: clock[0]
    )
    sightings = [(days, n, spec, i) for n, spec in enumerate(SPECS) for i, days in enumerate(spec.days)]
    for days, n, spec, i in sorted(sightings, key=lambda s: (-s[0], s[1], s[3])):
        clock[0] = world.at(days) + timedelta(seconds=n * 10 + i)
        result = intake.record(
            "events", f"delivery-{spec.key}-{i}", "failure.captured", [_sightings(spec, i)]
        )
        world.cases[spec.key] = result.cases[0]


def _decide(world: World) -> None:
    specs = world.specs
    quarantine_of_flaky = ReportRef(
        kind="quarantine", location=f"quarantine:{specs['flaky'].fingerprint}", created=True
    )
    issue = ReportRef(kind="github", location="https://github.com/acme/app/issues/7", created=True)
    minimized = MinimizeResult(
        bundle_id=hashlib.sha256(b"minimal").hexdigest(),
        data={"data/batch.csv": (3, 1000), "data/labels.jsonl": (1, 250)},
        args={"--epochs": ("10", "1")},
        oracle_calls=14,
        replays=21,
    )
    with world.database.session() as session:
        cases = {key: session.get_one(Case, ident) for key, ident in world.cases.items()}
        det = _evidence(
            specs["deterministic"], Verdict.DETERMINISTIC, replays=5, failures=5, rate=(0.478, 1.0, 1.0),
            minimized=minimized, report=issue,
        )  # fmt: skip
        case_decided(cases["deterministic"], verdict="deterministic", evidence=det)
        case_reported(session, cases["deterministic"], evidence=det, report=("github", issue.location))
        flaky = _evidence(
            specs["flaky"], Verdict.FLAKY, replays=8, failures=3, rate=(0.085, 0.375, 0.755),
            report=quarantine_of_flaky,
        )  # fmt: skip
        case_decided(cases["flaky"], verdict="flaky", evidence=flaky)
        case_reported(
            session, cases["flaky"], evidence=flaky, report=("quarantine", quarantine_of_flaky.location)
        )
        lib = _evidence(specs["flaky_lib"], Verdict.FLAKY, replays=20, failures=4, rate=(0.057, 0.2, 0.437))
        case_decided(cases["flaky_lib"], verdict="flaky", evidence=lib)
        order = _evidence(
            specs["order_dependent"], Verdict.ORDER_DEPENDENT, replays=5, failures=0, rate=(0, 0, 0.52)
        )
        order |= {"polluters": ["tests/test_cache.py::test_fill"], "order_cause": "a module-level cache"}
        case_decided(cases["order_dependent"], verdict="order_dependent", evidence=order)
        env = _evidence(
            specs["environment_specific"],
            Verdict.ENVIRONMENT_SPECIFIC,
            replays=10,
            failures=4,
            rate=(0.12, 0.4, 0.74),
        )
        case_decided(cases["environment_specific"], verdict="environment_specific", evidence=env)
        case_reported(
            session, cases["environment_specific"], evidence=env, report=("github", issue.location[:-1] + "9")
        )
        none = _evidence(
            specs["not_reproduced"], Verdict.NOT_REPRODUCED, replays=59, failures=0, rate=(0, 0, 0.05)
        )
        case_decided(cases["not_reproduced"], verdict="not_reproduced", evidence=none)
        gone = _evidence(specs["fixed"], Verdict.DETERMINISTIC, replays=5, failures=5, rate=(0.478, 1.0, 1.0))
        case_decided(cases["fixed"], verdict="deterministic", evidence=gone)
        case_fixed(cases["fixed"], verdict="deterministic")
        case_suspected(cases["suspected"])
        case_failed(cases["failed"], error="sandbox: docker is not running")
        session.flush()
        case_triaging(session, world.cases["triaging"])
    RecordsQuarantine(world.database, world.cases["flaky"]).add(
        specs["flaky"].fingerprint,
        test_id=specs["flaky"].test_id,
        command="pytest tests/test_net.py::test_retry",
        bundle_id=str(specs["flaky"].bundle),
        evidence=QuarantineEvidence(
            verdict="flaky",
            replays=8,
            reproductions=3,
            rate=FailureRate(estimate=0.375, low=0.085, high=0.755),
        ),
        reason="flaky: failed 3 of 8 replays",
    )


def _replay(
    world: World, key: str, outcomes: str, *, days: int, runner: RunnerIdentity, cpu: float, gpu: float
) -> None:
    """The replays of a case's triage as its workers record them (``R``: reproduced, ``P``: passed),
    its work done, and their runner."""
    with world.database.session() as session:
        work = session.scalars(
            select(Work).where(Work.case_id == world.cases[key], Work.step == "triage")
        ).first()
        assert work is not None
        when = world.at(days)
        for idx, letter in enumerate(outcomes):
            session.add(
                ReplayRow(
                    work_id=work.id,
                    idx=idx,
                    outcome="reproduced" if letter == "R" else "passed",
                    duration_s=40.0,
                    cpu_s=cpu,
                    gpu_s=gpu,
                    runner=runner.id,
                    worker=f"{runner.host}:4242",
                    created_at=when,
                    sent_at=when,
                    finished_at=when,
                )
            )
        work_row_done(work, result={"replays": len(outcomes)})
        record_replay(session, runner, replays=len(outcomes))
    if days < 30:
        world.replays_30_days += len(outcomes)
        world.triage_cpu_30_days_s += cpu * len(outcomes)
        world.triage_gpu_30_days_s += gpu * len(outcomes)


def _upload(world: World, n: int, days: int, tests: list[TestResult], **fields: Any) -> None:
    upload = ResultsUpload(
        upload_id=f"upload-{n:06d}",
        repository=fields.pop("repository", APP),
        branch=fields.pop("branch", "main"),
        commit=f"{n:07x}",
        job="test",
        variant={"os": "linux", "python": "3.12"},
        tests=tuple(tests),
        **fields,
    )
    with world.database.session() as session:
        recorded = record_upload(session, upload, storm_share=0.5, storm_min_tests=4, now=world.at(days))
    assert recorded.upload_pk is not None
    with world.database.session() as session:
        assert add_totals(session, recorded.upload_pk)  # the upload's history step
    if days < 30 and not recorded.storm:
        world.ci_lost_30_days_s += sum(t.lost_s for t in tests)


def _ci_history(world: World) -> None:
    det, flaky = world.specs["deterministic"], world.specs["flaky"]
    passed = TestResult(test_id="tests/test_db.py::test_connect", outcome="passed", duration_s=1.0)

    def failing(test_id: str, seconds: float) -> TestResult:
        return TestResult(test_id=test_id, outcome="failed", duration_s=seconds, message="AssertionError")

    def retried(test_id: str, seconds: float) -> TestResult:
        return TestResult(
            test_id=test_id,
            outcome="passed",
            duration_s=seconds,
            attempts=(Attempt(outcome="failed", duration_s=seconds),),
        )

    _upload(world, 45, 45, [failing(str(det.test_id), 10.0), passed])  # outside the 30 days
    _upload(world, 25, 25, [failing(str(det.test_id), 10.0), passed])  # rolled up below
    for i, days in enumerate(det.days):
        tests = [failing(str(det.test_id), 10.0), passed]
        if i >= 3:  # runs 1004 and 1005: the suspected test passed on retry there
            tests.append(retried("tests/test_time.py::test_clock", 2.0))
        _upload(world, det.first_run + i, days, tests, run_url=det.run_url(i))
    for i, days in enumerate(flaky.days):
        branch = "main" if i < 6 else FEATURE_BRANCH
        _upload(
            world,
            flaky.first_run + i,
            days,
            [retried(str(flaky.test_id), 3.0)],
            branch=branch,
            run_url=flaky.run_url(i),
        )
    storm = [failing(f"tests/test_all.py::test_{k}", 5.0) for k in range(4)]
    _upload(world, 9999, 1, storm)  # an outage: its time is not counted
    with world.database.session() as session:
        roll_up(session, keep_days=20, now=world.now)
        world.tests = {t.test_id: t.id for t in session.scalars(select(TestRow))}


def seed(dashboard: Dashboard) -> World:
    world = World(dashboard, now=utc_now())
    _record_occurrences(world)
    _decide(world)
    _replay(world, "flaky", "RPPRPPRP", days=1, runner=GPU_RUNNER, cpu=12.5, gpu=30.0)
    _replay(world, "deterministic", "RRRRR", days=2, runner=CPU_RUNNER, cpu=4.0, gpu=0.0)
    _replay(world, "fixed", "RRRRR", days=40, runner=CPU_RUNNER, cpu=100.0, gpu=0.0)
    _ci_history(world)
    return world


@pytest.fixture
def seeded(dashboard: Dashboard) -> World:
    """The dashboard over a small world: cases of every verdict and status in two repositories,
    occurrences over 40 days and several CI runs and branches, triage work with replays on two
    runners, a quarantined case, and CI history (uploads on ``main`` and ``feature/login``, a
    storm, results rolled up into days)."""
    return seed(dashboard)
