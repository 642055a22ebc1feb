"""Hardware attribution: runner identities, the Fisher test in exact numbers, and the service deciding
``environment_specific`` from replays on two (stand-in) runners, flagging the runner, serving it at
``GET /v1/runners`` and in the metrics.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from sqlalchemy import select

from flaketriage.bundle.io import load_manifest
from flaketriage.bundle.manifest import GPU, Hardware
from flaketriage.orchestrator.app import create_app
from flaketriage.orchestrator.metrics import ServiceMetrics
from flaketriage.orchestrator.service import Service
from flaketriage.records import Database, RunnerRow
from flaketriage.records.models import Base
from flaketriage.settings import load_settings
from flaketriage.work.dispatch import MemorySender
from flaketriage.workers.attribution import (
    GPUIdentity,
    RunnerIdentity,
    RunnerTally,
    attribute,
    fisher_one_sided,
    tally,
)
from flaketriage.workers.gpus import RunnerGPUs
from flaketriage.workers.report.render import ENVIRONMENT_LABEL
from flaketriage.workers.runners import record_attribution, record_replay
from flaketriage.workers.triage import TriageResult
from tests.conftest import new_postgres_database
from tests.workers.service_world import World, make_world

H100 = (GPUIdentity("NVIDIA H100 80GB HBM3", "GPU-aaaa"), GPUIdentity("NVIDIA H100 80GB HBM3", "GPU-bbbb"))


# -- identities -----------------------------------------------------------------------------------
def test_a_runner_id_is_the_host_plus_a_digest_of_its_gpus() -> None:
    plain = RunnerIdentity(host="ci-7")
    gpu = RunnerIdentity(host="ci-7", gpus=H100, driver="550.54.15")
    assert plain.id == "ci-7"
    assert gpu.id.startswith("ci-7/gpu-") and len(gpu.id) == len("ci-7/gpu-") + 10
    # The order NVML lists them in does not matter; another board does.
    assert RunnerIdentity(host="ci-7", gpus=H100[::-1]).id == gpu.id
    assert RunnerIdentity(host="ci-7", gpus=(H100[0], GPUIdentity(H100[1].name, "GPU-cccc"))).id != gpu.id
    assert gpu.describe() == "ci-7 (2 × NVIDIA H100 80GB HBM3, driver 550.54.15)"
    assert RunnerIdentity.from_json(gpu.to_json()) == gpu


def test_a_runner_matches_the_original_by_host_or_by_gpu_model_and_driver() -> None:
    original = RunnerIdentity(host="ci-7", gpus=H100, driver="550.54.15")
    assert original.matches(RunnerIdentity(host="ci-7"))
    twin = RunnerIdentity(
        host="ci-9",
        gpus=(GPUIdentity(H100[0].name, "GPU-x"), GPUIdentity(H100[0].name, "GPU-y")),
        driver="550.54.15",
    )
    assert original.matches(twin)
    assert not original.matches(RunnerIdentity(host="ci-9", gpus=twin.gpus, driver="535.104.05"))
    assert not original.matches(
        RunnerIdentity(host="ci-9", gpus=(GPUIdentity("NVIDIA A100-SXM4-80GB"),) * 2, driver="550.54.15")
    )
    assert not RunnerIdentity(host="ci-7").matches(RunnerIdentity(host="ci-9"))


def test_the_original_runner_is_read_from_the_manifest_hardware() -> None:
    hardware = Hardware(
        host="ci-7",
        gpus=(
            GPU(index=1, name=H100[1].name, uuid="GPU-bbbb"),
            GPU(index=0, name=H100[0].name, uuid="GPU-aaaa"),
        ),
        driver_version="550.54.15",
    )
    assert RunnerIdentity.of_hardware(hardware) == RunnerIdentity(host="ci-7", gpus=H100, driver="550.54.15")
    assert RunnerIdentity.of_hardware(Hardware(), "ci-host").host == "ci-host"


def test_this_machine_is_identified_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    handles = ["h0", "h1"]
    for name, fn in {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: handles[i],
        "nvmlDeviceGetName": lambda h: H100[0].name.encode(),
        "nvmlDeviceGetUUID": lambda h: ["GPU-aaaa", "GPU-bbbb"][handles.index(h)],
        "nvmlSystemGetDriverVersion": lambda: "550.54.15",
        "nvmlSystemGetCudaDriverVersion": lambda: 12040,
    }.items():
        monkeypatch.setattr(pynvml, name, fn)
    local = RunnerIdentity.local()
    assert local == RunnerIdentity(host=socket.gethostname(), gpus=H100, driver="550.54.15")
    # Without a GPU (this machine as it is), the id is the host name.
    assert RunnerIdentity.local(RunnerGPUs()).id == socket.gethostname()


# -- the statistics -------------------------------------------------------------------------------
def test_fisher_exact_in_plain_numbers() -> None:
    assert fisher_one_sided(5, 0, 0, 4) == pytest.approx(1 / 126)  # C(9, 5) = 126 ways
    assert fisher_one_sided(3, 3, 0, 4) == pytest.approx(1 / 6)
    assert fisher_one_sided(10, 0, 0, 10) == pytest.approx(1 / 184756)  # C(20, 10)
    assert fisher_one_sided(0, 5, 0, 5) == 1.0


ORIGINAL = RunnerIdentity(host="ci-7")


def _tallies(here: tuple[int, int], away: tuple[int, int]) -> list[RunnerTally]:
    return [RunnerTally("ci-7", True, *here), RunnerTally("ci-9", False, *away)]


@pytest.mark.parametrize(
    ("here", "away", "specific", "side"),
    [
        ((5, 0), (0, 4), True, "original"),  # p = 1/126
        ((10, 0), (0, 10), True, "original"),
        ((0, 10), (10, 0), True, "elsewhere"),  # the reverse: never on the original's hardware
        ((3, 3), (0, 4), False, None),  # a 50% flake that missed 4 times: p = 1/6
        ((1, 0), (0, 3), False, None),  # p = 1/4: too few replays to say
        ((5, 5), (4, 6), False, None),  # reproduces on both
        ((5, 0), (0, 0), False, None),  # no replay elsewhere
    ],
)
def test_environment_specific_needs_a_one_sided_split_unlikely_by_chance(
    here: tuple[int, int], away: tuple[int, int], specific: bool, side: str | None
) -> None:
    found = attribute(ORIGINAL, _tallies(here, away), alpha=0.05)
    assert (found.specific, found.side) == (specific, side)
    if specific:
        reproduced_on = "ci-7" if side == "original" else "ci-9"
        assert found.suspects == [reproduced_on]
    assert type(found).from_json(found.to_json()) == found


def test_tallies_count_reproductions_and_passes_by_runner_only() -> None:
    identities = {"gpu-twin": RunnerIdentity(host="elsewhere", gpus=H100, driver="550")}
    original = RunnerIdentity(host="ci-7", gpus=H100, driver="550")
    pairs = [
        ("ci-7", "reproduced"),
        ("gpu-twin", "reproduced"),
        ("other", "passed"),
        ("other", "different"),  # says nothing about where it fails
        ("other", "sandbox"),
        (None, "passed"),
    ]
    by_runner = {t.runner: t for t in tally(pairs, original, identities)}
    assert by_runner["ci-7"] == RunnerTally("ci-7", False, 1, 0)  # unknown identity, not the original's id
    assert by_runner["gpu-twin"] == RunnerTally("gpu-twin", True, 1, 0)  # same GPUs and driver
    assert by_runner["other"] == RunnerTally("other", False, 0, 1)


# -- the schema -----------------------------------------------------------------------------------
def test_the_runners_migration_builds_what_the_models_describe(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    database.upgrade()
    with database.engine.connect() as conn:
        differences = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert [d for d in differences if "runners" in repr(d)] == []
    database.dispose()


# -- the service ----------------------------------------------------------------------------------
# Fails unless replayed on runner 1 (its workspaces are under runner-1/): so it fails when captured,
# on runner 0, and not on runner 1.
FAILS_BUT_ON_RUNNER_1 = "import os\nif 'runner-1' not in os.getcwd():\n    raise RuntimeError('boom')\n"
# Fails unless replayed on runner 0: when captured, and on runner 1 only.
FAILS_BUT_ON_RUNNER_0 = "import os\nif 'runner-0' not in os.getcwd():\n    raise RuntimeError('boom')\n"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """Runner 0 is this host, where the failures are captured; runner 1 another host, with GPUs."""
    made = make_world(
        tmp_path,
        [
            RunnerIdentity(host=socket.gethostname()),
            RunnerIdentity(host="gpu-node-2", gpus=H100, driver="550.54.15"),
        ],
        runner_suspect_after=2,
    )
    yield made
    made.close()


def alternate(index: int) -> int:
    return index % 2


def test_a_failure_only_on_the_original_runner_is_environment_specific(world: World) -> None:
    bundle = world.capture(FAILS_BUT_ON_RUNNER_1)
    case_id = world.announce(bundle)
    world.drive(route=alternate)
    case = world.case(case_id)
    assert (case.status, case.verdict) == ("reported", "environment_specific"), case.evidence
    triage = world.works(case_id)[0]
    replays = world.replays(triage.id)
    here, away = world.envs[0].runner, world.envs[1].runner
    assert {r.runner for r in replays} == {here, away}
    assert all(r.worker for r in replays)  # the worker process, beside the machine
    assert all((r.outcome == "reproduced") == (r.runner == here) for r in replays)
    # The evidence names the runners, the p-value and where it reproduced.
    result = TriageResult.from_json(case.evidence or {})
    assert result.attribution is not None and result.attribution.side == "original"
    assert result.attribution.p_value < 0.05 and result.attribution.suspects == [here]
    # Reported as an issue with the suspected-environment label and the runners in its body.
    issue = next(iter(world.sink.issues.values()))
    assert ENVIRONMENT_LABEL in issue.labels and "environment_specific" in issue.labels
    assert here in issue.body and away in issue.body and "Suspected environment-specific" in issue.body
    # The runners are on record: runner 0 counted once, not yet suspect (2 needed); runner 1 clean.
    runners = world.runners()
    assert runners[here].environment_specific == 1 and not runners[here].suspect
    assert runners[away].environment_specific == 0 and runners[away].gpus[0]["uuid"] == "GPU-aaaa"
    assert runners[here].replays + runners[away].replays == len(replays)


def test_a_failure_only_away_from_the_original_hardware_is_environment_specific_too(world: World) -> None:
    bundle = world.capture(FAILS_BUT_ON_RUNNER_0)
    case_id = world.announce(bundle)
    world.drive(route=alternate)
    case = world.case(case_id)
    assert case.verdict == "environment_specific", case.evidence
    result = TriageResult.from_json(case.evidence or {})
    away = world.envs[1].runner
    assert result.attribution is not None and result.attribution.side == "elsewhere"
    assert result.attribution.suspects == [away]
    assert world.runners()[away].environment_specific == 1


def test_a_flaky_failure_everywhere_stays_flaky(world: World) -> None:
    # Every other replay on each runner passes (its n-th copy of the workspace, run-n, says which).
    bundle = world.capture(
        "import os, re\n"
        "run = re.search(r'/run-(\\d+)/', os.getcwd() + '/')\n"
        "n = int(run[1]) if run and 'FLAKETRIAGE_REPLAY' in os.environ else 0\n"
        "if n % 2:\n"
        "    raise SystemExit(0)\n"
        "raise RuntimeError('flaky')\n"
    )
    case_id = world.announce(bundle)
    world.drive(route=alternate)
    case = world.case(case_id)
    assert case.verdict == "flaky", case.evidence
    result = TriageResult.from_json(case.evidence or {})
    assert result.attribution is not None and not result.attribution.specific
    assert all(r.environment_specific == 0 for r in world.runners().values())


def test_replays_on_one_runner_say_nothing_about_hardware(world: World) -> None:
    bundle = world.capture(FAILS_BUT_ON_RUNNER_1)
    case_id = world.announce(bundle)
    world.drive(route=lambda index: 0)  # every replay on runner 0
    case = world.case(case_id)
    assert case.verdict == "deterministic"
    assert TriageResult.from_json(case.evidence or {}).attribution is None


def test_a_runner_counted_often_enough_is_flagged_served_and_exported(world: World) -> None:
    for n in range(2):  # two failures that reproduce only on runner 0 (runner_suspect_after=2)
        world.announce(world.capture(FAILS_BUT_ON_RUNNER_1.replace("boom", f"boom {n}"), name=f"job{n}.py"))
        world.drive(route=alternate)
    here, away = world.envs[0].runner, world.envs[1].runner
    runners = world.runners()
    assert runners[here].environment_specific == 2 and runners[here].suspect
    assert not runners[away].suspect

    settings = load_settings(store=str(world.store.root), api_token="t0ken")
    service = Service.assemble(settings, world.database, MemorySender())
    with TestClient(create_app(service)) as client:
        assert client.get("/v1/runners").status_code == 401  # authorized like /v1/cases
        listed = client.get("/v1/runners", headers={"Authorization": "Bearer t0ken"}).json()
        assert [r["id"] for r in listed] == [here, away]  # suspects first
        assert listed[0]["suspect"] and listed[0]["environment_specific"] == 2
        assert listed[1]["gpus"] == [
            {"name": H100[0].name, "uuid": "GPU-aaaa"},
            {"name": H100[1].name, "uuid": "GPU-bbbb"},
        ]
        only = client.get("/v1/runners?suspect=true", headers={"Authorization": "Bearer t0ken"}).json()
        assert [r["id"] for r in only] == [here]
    service.intake_queue.close()
    exported = generate_latest(ServiceMetrics(world.database).registry).decode()
    assert f'flaketriage_runner_suspect{{runner="{here}"}} 1.0' in exported
    assert f'flaketriage_runner_suspect{{runner="{away}"}} 0.0' in exported
    assert f'flaketriage_runner_environment_specific{{runner="{here}"}} 2.0' in exported


def test_the_manifest_records_the_original_runner(world: World) -> None:
    bundle = world.capture("raise SystemExit(1)\n")
    manifest = load_manifest(world.store, bundle)
    assert manifest.hardware.host == socket.gethostname()
    assert RunnerIdentity.of_hardware(manifest.hardware).id == world.envs[0].runner


def test_local_triage_has_no_attribution(tmp_path: Path) -> None:
    """`flaketriage triage` replays on one machine: nothing to compare, so never environment-specific."""
    from flaketriage.capture.record import CaptureRequest, run_and_capture
    from flaketriage.capture.source import SourceLimits
    from flaketriage.store import LocalStore
    from flaketriage.workers.replay import ReplayContext
    from flaketriage.workers.sandbox import ProcessSandbox
    from flaketriage.workers.triage import triage
    from flaketriage.workers.verdict import VerdictPolicy

    store = LocalStore(tmp_path / "store")
    project = tmp_path / "project"
    project.mkdir()
    (project / "job.py").write_text("raise RuntimeError('boom')\n")
    captured = run_and_capture(
        store,
        CaptureRequest(
            argv=[sys.executable, "job.py"], cwd=project, limits=SourceLimits(1 << 20, 1 << 24), echo=False
        ),
    )
    assert captured.bundle_id
    result = triage(
        store,
        captured.bundle_id,
        sandbox=ProcessSandbox(),
        policy=VerdictPolicy(),
        sink=None,
        quarantine=None,
        context=ReplayContext.from_process(),
    )
    assert result.verdict.verdict == "deterministic" and result.attribution is None
    assert result.to_json()["attribution"] is None


# -- the records, on both backends ----------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def records(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """An empty, migrated database of each backend (PostgreSQL: a database of this test's own)."""
    if request.param == "sqlite":
        database = Database(f"sqlite:///{tmp_path / 'service.db'}")
        database.upgrade()
        yield database
        database.dispose()
        return
    with new_postgres_database("ft_runners") as url:
        database = Database(url)
        try:
            database.upgrade()
            yield database
        finally:
            database.dispose()


def test_runner_records_count_replays_and_verdicts_and_flag_suspects(records: Database) -> None:
    original = RunnerIdentity(host="ci-7", gpus=H100, driver="550.54.15")
    other = RunnerIdentity(host="ci-9")
    gpus = tuple(GPU(index=i, name=g.name, uuid=g.uuid) for i, g in enumerate(H100))
    manifest = SimpleNamespace(
        hardware=Hardware(host="ci-7", gpus=gpus, driver_version="550.54.15"),
        provenance=SimpleNamespace(host=None),
    )
    with records.session() as s:
        record_replay(s, original)
        record_replay(s, original, replays=4)
        record_replay(s, other, replays=3)
    found = attribute(
        original, [RunnerTally(original.id, True, 6, 0), RunnerTally(other.id, False, 0, 6)], 0.05
    )
    for expected_suspect in (False, True):  # runner_suspect_after=2: flagged at the second verdict
        with records.session() as s:
            assert record_attribution(s, found, manifest, case_id=None, suspect_after=2) == [original.id]  # type: ignore[arg-type]
        with records.session() as s:
            rows = {row.id: row for row in s.scalars(select(RunnerRow)).all()}
        assert rows[original.id].suspect is expected_suspect
    assert (rows[original.id].replays, rows[original.id].environment_specific) == (5, 2)
    assert (rows[other.id].replays, rows[other.id].environment_specific, rows[other.id].suspect) == (
        3,
        0,
        False,
    )
    assert rows[original.id].gpus == [{"name": g.name, "uuid": g.uuid} for g in H100]
    assert rows[original.id].first_seen <= rows[original.id].last_seen


def test_the_markdown_issue_of_an_environment_specific_failure_carries_the_label(
    world: World, tmp_path: Path
) -> None:
    from flaketriage.workers.report.markdown import MarkdownIssueSink

    sink = MarkdownIssueSink(tmp_path / "issues")
    for env in world.envs:
        env.sink = sink
    case_id = world.announce(world.capture(FAILS_BUT_ON_RUNNER_1))
    world.drive(route=alternate)
    assert world.case(case_id).verdict == "environment_specific"
    [issue] = (tmp_path / "issues").glob("*.md")
    text = issue.read_text()
    assert f"`{ENVIRONMENT_LABEL}`" in text and "Replays by runner:" in text
    assert world.envs[1].runner in text
