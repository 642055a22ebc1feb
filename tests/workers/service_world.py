"""The service's pipeline driven in-process: the intake, the workers and an in-memory broker, with
the real sandbox and a real SQLite database.

`make_world` builds one `WorkerEnv` per runner. Without identities it is one worker on this machine
(its own identity and temporary directory); given identities, each runner has its own (a host name,
GPUs) and its own temporary directory for workspaces, so a program can tell which runner replays it.
`drive` runs what the pipeline sends until nothing is left: each replay task on the runner chosen by
`route(index)`, every other step on the first runner; in the order sent, or shuffled, or twice each.
"""

from __future__ import annotations

import json
import random
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
from flaketriage.workers.comments import Commenter
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

    @property
    def env(self) -> WorkerEnv:
        """The first runner's worker, which runs every step but the replays `drive` routes."""
        return self.envs[0]

    @property
    def pipeline(self) -> Pipeline:
        return Pipeline(self.env)

    def capture(
        self,
        source: str,
        *args: str,
        data: list[Path] | None = None,
        name: str = "job.py",
        timeout_s: float | None = None,
    ) -> str:
        project = self.tmp / "project"
        project.mkdir(exist_ok=True)
        (project / name).write_text(source)
        request = CaptureRequest(
            argv=[sys.executable, name, *args],
            cwd=project,
            limits=SourceLimits(1 << 20, 1 << 24),
            echo=False,
            data=data or [],
            timeout_s=timeout_s,
        )
        result = run_and_capture(self.store, request)
        assert result.bundle_id, result.process.stderr
        return result.bundle_id

    def announce(self, bundle_id: str, delivery: str | None = None, **extra: object) -> int:
        manifest = json.loads(self.store.get_bytes(bundle_id))
        sighting = Sighting(
            fingerprint=manifest["failure"]["fingerprint"],
            kind="bundle",
            title="t",
            bundle_id=bundle_id,
            store_url=self.store.url,
            **extra,  # type: ignore[arg-type]
        )
        result = self.intake.record("events", delivery or bundle_id[:32], "failure.captured", [sighting])
        return result.cases[0]

    def drive(
        self,
        route: Callable[[int], int] = lambda index: 0,
        *,
        order: str = "fifo",
        twice: bool = False,
        limit: int = 2000,
    ) -> int:
        """Run every task sent until none is left; returns how many ran."""
        ran = 0
        rng = random.Random(7)
        while self.sender.sent and ran < limit:
            batch = self.sender.take()
            if order == "shuffle":
                rng.shuffle(batch)
            for name, work_order, _queue in batch:
                for _ in range(2 if twice else 1):
                    step = name.split(".", 1)[1]
                    if step == Step.REPLAY:
                        index = int(work_order.replay or 0)
                        Pipeline(self.envs[route(index)]).replay(work_order.work_id, index)
                    else:
                        getattr(self.pipeline, step)(work_order.work_id)
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


def make_world(
    tmp: Path,
    identities: list[RunnerIdentity] | None = None,
    *,
    commenter: Commenter | None = None,
    **settings: Any,
) -> World:
    """A world of one worker per runner in `identities` (None: one, on this machine), whose replies
    go to `commenter`; `settings` over the tests' (batches of 4 replays, a sweep after a minute)."""
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
    if identities is None:
        world.envs.append(
            WorkerEnv(
                settings=config,
                database=database,
                dispatcher=dispatcher,
                sandbox=ProcessSandbox(),
                sink=sink,
                commenter=commenter,
                context=process,
            )
        )
    for i, identity in enumerate(identities or []):
        world.envs.append(
            WorkerEnv(
                settings=config,
                database=database,
                dispatcher=dispatcher,
                sandbox=ProcessSandbox(),
                sink=sink,
                commenter=commenter,
                context=ReplayContext(
                    base_env=process.base_env, temp_root=tmp / f"runner-{i}", git=process.git
                ),
                identity=identity,
            )
        )
    return world
