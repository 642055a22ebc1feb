"""The service's pipeline driven in-process with workers on several (stand-in) runners.

Like tests/workers/test_pipeline.py's `World`, with one `WorkerEnv` per runner: each has its own
runner identity (a host name, GPUs) and its own temporary directory for workspaces, so a program
can tell which runner replays it. `drive` hands each replay task to a runner chosen by
`route(index)`; every other step runs on the first runner.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.orchestrator.intake import Intake, Sighting
from flaketriage.records import Case, Database, ReplayRow, RunnerRow, Work
from flaketriage.settings import load_settings
from flaketriage.store import LocalStore
from flaketriage.work.dispatch import Dispatcher, MemorySender
from flaketriage.work.messages import Step
from flaketriage.workers.attribution import RunnerIdentity
from flaketriage.workers.pipeline import Pipeline
from flaketriage.workers.replay import ReplayContext
from flaketriage.workers.report import MemoryIssueSink
from flaketriage.workers.runtime import WorkerEnv
from flaketriage.workers.sandbox import ProcessSandbox


@dataclass
class World:
    tmp: Path
    store: LocalStore
    database: Database
    sender: MemorySender
    sink: MemoryIssueSink
    intake: Intake
    envs: list[WorkerEnv] = field(default_factory=list)

    def capture(self, source: str, *, name: str = "job.py", timeout_s: float | None = None) -> str:
        project = self.tmp / "project"
        project.mkdir(exist_ok=True)
        (project / name).write_text(source)
        request = CaptureRequest(
            argv=[sys.executable, name],
            cwd=project,
            limits=SourceLimits(1 << 20, 1 << 24),
            echo=False,
            timeout_s=timeout_s,
        )
        result = run_and_capture(self.store, request)
        assert result.bundle_id, result.process.stderr
        return result.bundle_id

    def announce(self, bundle_id: str) -> int:
        manifest = json.loads(self.store.get_bytes(bundle_id))
        sighting = Sighting(
            fingerprint=manifest["failure"]["fingerprint"],
            kind="bundle",
            title="t",
            bundle_id=bundle_id,
            store_url=self.store.url,
        )
        return self.intake.record("events", bundle_id[:32], "failure.captured", [sighting]).cases[0]

    def drive(self, route: Callable[[int], int] = lambda index: 0, limit: int = 2000) -> int:
        ran = 0
        while self.sender.sent and ran < limit:
            for name, order, _queue in self.sender.take():
                step = name.split(".", 1)[1]
                if step == Step.REPLAY:
                    index = int(order.replay or 0)
                    Pipeline(self.envs[route(index)]).replay(order.work_id, index)
                else:
                    getattr(Pipeline(self.envs[0]), step)(order.work_id)
                ran += 1
        assert not self.sender.sent, "the pipeline kept sending work"
        return ran

    def case(self, case_id: int) -> Case:
        with self.database.session() as s:
            return s.get_one(Case, case_id)

    def works(self, case_id: int) -> list[Work]:
        with self.database.session() as s:
            return list(s.scalars(select(Work).where(Work.case_id == case_id).order_by(Work.id)).all())

    def replays(self, work_id: int) -> list[ReplayRow]:
        with self.database.session() as s:
            return list(
                s.scalars(select(ReplayRow).where(ReplayRow.work_id == work_id).order_by(ReplayRow.idx))
            )

    def runners(self) -> dict[str, RunnerRow]:
        with self.database.session() as s:
            return {row.id: row for row in s.scalars(select(RunnerRow)).all()}

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.database.dispose()


def make_world(tmp: Path, identities: list[RunnerIdentity], **settings: Any) -> World:
    store = LocalStore(tmp / "store")
    database = Database(f"sqlite:///{tmp / 'service.db'}")
    database.upgrade()
    sender = MemorySender()
    options: dict[str, Any] = {"store": str(tmp / "store"), "replay_batch": 4, "sweep_after_s": 60}
    options.update(settings)
    config = load_settings(**options)
    dispatcher = Dispatcher(database, sender, sweep_after_s=60)
    sink = MemoryIssueSink()
    world = World(
        tmp,
        store,
        database,
        sender,
        sink,
        Intake(database, dispatcher, retriage_after_s=3600, storm_window_s=0),
    )
    process = ReplayContext.from_process()
    for i, identity in enumerate(identities):
        world.envs.append(
            WorkerEnv(
                settings=config,
                database=database,
                dispatcher=dispatcher,
                sandbox=ProcessSandbox(),
                sink=sink,
                commenter=None,
                context=ReplayContext(
                    base_env=process.base_env, temp_root=tmp / f"runner-{i}", git=process.git
                ),
                identity=identity,
            )
        )
    return world
