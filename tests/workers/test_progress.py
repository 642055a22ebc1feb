"""A triage's record while it runs and once it is done: every replay of a pytest bundle (whose triage,
with its order search, runs in one task) is a row `/v1/cases/{id}` lists, and a triage under way
shows its step and the replays done and planned."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flaketriage.bundle.io import list_bundles
from flaketriage.orchestrator.api_models import CaseDetail
from flaketriage.orchestrator.cases import CaseQuery
from flaketriage.process.child import ProcessResult
from flaketriage.store import LocalStore
from flaketriage.work.messages import Step
from flaketriage.workers.attribution import RunnerIdentity
from flaketriage.workers.pipeline import Pipeline
from flaketriage.workers.sandbox import ProcessSandbox, SandboxSpec
from tests.workers.service_world import World, make_world

SUITE = {
    "test_a.py": "def test_first():\n    pass\n",
    "test_b.py": "def test_breaks():\n    assert 1 + 1 == 3, 'arithmetic is broken'\n",
}


class WatchedSandbox(ProcessSandbox):
    """A real sandbox that calls `before(n)` ahead of its n-th run (from 1): a test looks at the
    records there, mid-triage, without timing anything."""

    def __init__(self, before: Callable[[int], None]) -> None:
        super().__init__()
        self.before = before
        self.runs = 0

    def run(self, spec: SandboxSpec) -> ProcessResult:
        self.runs += 1
        self.before(self.runs)
        return super().run(spec)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    world = make_world(tmp_path, [RunnerIdentity(host="ci-1")])
    yield world
    world.close()


def _git(project: Path, *args: str) -> None:
    author = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", *author, *args], cwd=project, check=True, capture_output=True, timeout=60)


def _pytest_bundle(tmp: Path, store: Path, suite: dict[str, str] = SUITE) -> str:
    """A failure captured by `pytest --flaketriage` in a git project of `suite`, after another test ran."""
    project = tmp / "suite"
    project.mkdir()
    for name, text in suite.items():
        (project / name).write_text(text)
    (project / ".gitignore").write_text(".flaketriage/\n__pycache__/\n")
    _git(project, "init", "-q", "-b", "main")
    _git(project, "add", ".")
    _git(project, "commit", "-qm", "suite")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "PYTEST_"))}
    env.pop("CI", None)
    env.update(FLAKETRIAGE_STORE=str(store), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    argv = [sys.executable, "-m", "pytest", "-p", "flaketriage", "--flaketriage", "-p", "no:cacheprovider"]
    run = subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 1, run.stdout + run.stderr
    (bundle,) = list_bundles(LocalStore(store))
    return bundle.id


def _detail(world: World, case_id: int) -> CaseDetail:
    found = CaseQuery(world.database).get(case_id)
    assert found is not None
    return found


def test_every_replay_of_a_pytest_bundle_is_listed_and_its_progress_shown_mid_triage(world: World) -> None:
    case_id = world.announce(_pytest_bundle(world.tmp, world.store.root))
    seen: list[CaseDetail] = []
    world.envs[0].sandbox = WatchedSandbox(lambda n: seen.append(_detail(world, case_id)) if n == 3 else None)
    world.drive()

    detail = _detail(world, case_id)
    assert detail.verdict == "deterministic"
    triage = detail.triage_runs[0]
    assert triage.step == "triage" and triage.result is not None
    # Every replay the verdict rests on is a row, in order, with what it cost and where it ran.
    assert [r.index for r in triage.replays] == list(range(triage.result["replays"]))
    assert len(triage.replays) == 5
    assert all(r.outcome == "reproduced" and r.runner and r.worker for r in triage.replays)
    assert all(r.duration_s is not None and r.duration_s > 0 for r in triage.replays)
    assert detail.progress is None  # nothing under way once it is reported

    (mid,) = seen  # ahead of the third run: two replays done, in the verdict's step
    assert mid.status == "triaging" and mid.progress is not None
    assert mid.progress.step == "verdict" and mid.progress.work_id == triage.id
    assert mid.progress.replays_done == 2 < mid.progress.replays_planned
    assert len(mid.triage_runs[0].replays) == 2


SLOW = "import time\ntime.sleep(0.2)\nraise ZeroDivisionError('slow boom')\n"


def test_a_batched_triage_under_way_shows_replays_done_and_planned(world: World) -> None:
    case_id = world.announce(world.capture(SLOW))
    pipeline = Pipeline(world.envs[0])
    assert _detail(world, case_id).progress is not None  # queued: the triage is the step to come
    (triage_order,) = [o for name, o, _ in world.sender.take() if name.endswith(Step.TRIAGE)]
    pipeline.triage(triage_order.work_id)  # sends the first batch of 4 replays
    replays = world.sender.take()
    assert len(replays) == 4
    pipeline.replay(replays[0][1].work_id, int(replays[0][1].replay or 0))

    progress = _detail(world, case_id).progress
    assert progress is not None and progress.step == "verdict"
    assert (progress.replays_done, progress.replays_planned) == (1, 4)
    for _name, order, _queue in replays[1:]:
        pipeline.replay(order.work_id, int(order.replay or 0))
    world.drive()  # the next batch decides; minimization and the report follow
    assert _detail(world, case_id).progress is None


ORDER_SUITE = {
    "test_a.py": (
        "import json\n"
        "def test_fills_cache():\n"
        "    with open('settings.json', 'w') as f:\n"
        "        json.dump({'mode': 'debug'}, f)\n"
    ),
    "test_z.py": (
        "import json, os\n"
        "def test_reads_clean_state():\n"
        "    exists = os.path.exists('settings.json')\n"
        "    mode = json.load(open('settings.json'))['mode'] if exists else 'release'\n"
        "    assert mode == 'release', f'unexpected mode {mode!r}'\n"
    ),
}


def test_an_order_search_under_way_is_the_step_shown_and_its_runs_are_replays(world: World) -> None:
    case_id = world.announce(_pytest_bundle(world.tmp, world.store.root, ORDER_SUITE))
    seen: list[CaseDetail] = []
    # Five isolated replays pass; the search's runs follow.
    world.envs[0].sandbox = WatchedSandbox(lambda n: seen.append(_detail(world, case_id)) if n == 7 else None)
    world.drive()

    detail = _detail(world, case_id)
    assert detail.verdict == "order_dependent"
    (mid,) = seen
    assert mid.progress is not None and mid.progress.step == "order search"
    assert mid.progress.replays_done == 6 < mid.progress.replays_planned
    outcomes = [r.outcome for r in detail.triage_runs[0].replays]
    assert outcomes[:5] == ["passed"] * 5 and "reproduced" in outcomes[5:]
