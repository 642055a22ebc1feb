"""The service's quarantine of order-dependent tests: rows that name the polluters, and isolation
reruns that replay a victim after them (alone it passes whether or not it is fixed, so a rerun alone
would lift it wrongly); an entry no triage explains gets none."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from flaketriage.bundle.io import list_bundles
from flaketriage.quarantine import FailureRate, QuarantineEntry, QuarantineEvidence
from flaketriage.records import Database, QuarantineRow, Work
from flaketriage.settings import load_settings
from flaketriage.store import LocalStore
from flaketriage.work.dispatch import Dispatcher, MemorySender
from flaketriage.workers.attribution import RunnerIdentity
from flaketriage.workers.quarantine.records import RecordsQuarantine
from flaketriage.workers.replay import ReplayContext
from flaketriage.workers.runtime import WorkerEnv
from flaketriage.workers.sandbox import ProcessSandbox
from flaketriage.workers.upkeep import Upkeep
from tests.workers.service_world import make_world

POLLUTER = "tests/test_warm.py::test_fills_cache"


def evidence(verdict: str) -> QuarantineEvidence:
    return QuarantineEvidence(
        verdict=verdict,
        decided=True,
        replays=5,
        reproductions=0,
        rate=FailureRate(estimate=0, low=0, high=0.52),
    )


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    db = Database(f"sqlite:///{tmp_path / 'service.db'}")
    db.upgrade()
    yield db
    db.dispose()


def test_records_keep_the_polluters_and_reruns_skip_an_order_no_triage_found(
    tmp_path: Path, database: Database
) -> None:
    quarantine = RecordsQuarantine(database)
    assert quarantine.order_dependent  # FLAKETRIAGE_QUARANTINE_ORDER_DEPENDENT's default
    common = {"command": "pytest", "issue_url": "https://github.com/acme/repo/issues/7"}
    quarantine.add(
        "ab" * 32,
        test_id="tests/test_cache.py::test_reads_empty",
        bundle_id="1" * 64,
        evidence=evidence("order_dependent"),
        reason=f"order_dependent: passes alone; fails after {POLLUTER}",
        polluters=[POLLUTER],
        **common,  # type: ignore[arg-type]
    )
    quarantine.add(
        "cd" * 32,
        test_id="t.py::test_flaky",
        bundle_id="2" * 64,
        evidence=evidence("flaky"),
        reason="flaky",
        **common,
    )  # type: ignore[arg-type]
    with database.session() as session:
        row = session.get(QuarantineRow, "ab" * 32)
        assert row is not None and QuarantineEntry.model_validate(row.entry).polluters == (POLLUTER,)
    settings = load_settings(store=str(tmp_path / "store"))
    env = WorkerEnv(
        settings=settings,
        database=database,
        dispatcher=Dispatcher(database, MemorySender(), sweep_after_s=60),
        sandbox=ProcessSandbox(),
        sink=None,
        commenter=None,
        context=ReplayContext.from_process(),
    )
    try:
        assert Upkeep(env).schedule_reruns() == 1  # the flaky one only
    finally:
        env.close()


POLLUTER_SUITE = {
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
FIXED_POLLUTER = "def test_fills_cache():\n    pass\n"


def _git(project: Path, *args: str) -> None:
    author = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", *author, *args], cwd=project, check=True, capture_output=True, timeout=60)


def _captured_victim(project: Path, store: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "PYTEST_"))}
    env.pop("CI", None)
    # Only flaketriage's plugin: the others installed here take seconds to load in every replay.
    env.update(FLAKETRIAGE_STORE=str(store), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    argv = [sys.executable, "-m", "pytest", "-p", "flaketriage", "--flaketriage", "-p", "no:cacheprovider"]
    run = subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 1, run.stdout + run.stderr
    (bundle,) = list_bundles(LocalStore(store))
    return bundle.id


def test_an_order_dependent_victim_is_rerun_after_its_polluters_and_lifted_once_they_are_fixed(
    tmp_path: Path,
) -> None:
    world = make_world(tmp_path, [RunnerIdentity(host="ci-1")], max_flaky_rate=0.2)
    try:
        project = tmp_path / "suite"
        project.mkdir()
        for name, text in POLLUTER_SUITE.items():
            (project / name).write_text(text)
        (project / ".gitignore").write_text(".flaketriage/\n__pycache__/\nsettings.json\n")
        _git(project, "init", "-q", "-b", "main")
        _git(project, "add", ".")
        _git(project, "commit", "-qm", "suite")
        case_id = world.announce(_captured_victim(project, world.store.root))
        world.drive()
        assert world.case(case_id).verdict == "order_dependent"
        with world.database.session() as s:
            (row,) = s.scalars(select(QuarantineRow)).all()
            fingerprint = row.fingerprint
            assert QuarantineEntry.model_validate(row.entry).polluters == ("test_a.py::test_fills_cache",)
        upkeep = Upkeep(world.envs[0])

        assert upkeep.schedule_reruns() == 1  # replayed after its polluter, as it failed
        world.drive()
        with world.database.session() as s:
            assert s.get(QuarantineRow, fingerprint) is not None  # still fails after it: kept

        (project / "test_a.py").write_text(FIXED_POLLUTER)
        _git(project, "commit", "-qam", "the polluter cleans up")
        for env in world.envs:  # the next rerun period
            env.settings = env.settings.model_copy(update={"rerun_every_s": 1e-3})
        assert upkeep.schedule_reruns() == 1
        world.drive()
        with world.database.session() as s:
            assert s.get(QuarantineRow, fingerprint) is None
            reruns = s.scalars(select(Work).where(Work.step == "rerun").order_by(Work.id)).all()
            assert [w.result["state"] for w in reruns if w.result] == [
                "still deterministic",
                "fixed: quarantine lifted",
            ]
            assert all(w.options["polluters"] == ["test_a.py::test_fills_cache"] for w in reruns)
        assert world.case(case_id).status == "fixed"
    finally:
        world.close()
