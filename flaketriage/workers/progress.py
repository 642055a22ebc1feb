"""A triage's progress as the records show it while it runs: each replay of a triage that runs in
one task (an order-dependent test's, whose polluter search is sequential) recorded as it ends, and
the step it is at.

A triage in batches needs none of this: its replay rows are written as they are sent and as they
end (`flaketriage.workers.pipeline`). One that runs in one task would otherwise record nothing until
it is decided, so `/v1/cases/{id}` listed none of its replays and could not say how far it was.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update

from flaketriage.records import Database, ReplayRow, Work, WorkStatus
from flaketriage.records.models import utc_now
from flaketriage.workers.replay import ReplayResult
from flaketriage.workers.verdict import Outcome

STEPS = {"verdict": "verdict", "order": "order search", "minimize": "minimize"}
"""The step a replay's phase (`flaketriage.workers.cost`) belongs to, as ``progress.step`` names it."""


def replay_summary(result: ReplayResult) -> str | None:
    """What a replay row says of its run: why nothing ran, the other failure it met, or (a hang)
    its failure; None for a plain reproduction or pass."""
    failure = result.failure
    if result.outcome is Outcome.ENVIRONMENT:
        return result.reason
    hung = failure is not None and failure.kind == "timeout" and bool(failure.traceback)
    if failure is None or not (result.outcome is Outcome.DIFFERENT or hung):
        return None
    text = f"{failure.exception_type}: {failure.message}" if failure.exception_type else failure.detail
    return str(text or failure.kind)[:500]


class TriageProgress:
    """Records the replays and the step of one triage work row as they happen.

    Replays are numbered after any an earlier attempt of the same work recorded (a redelivered
    triage adds to them, never clashes). The step goes to ``work.result["progress"]`` only while
    the work runs, so it never overwrites a decided result.
    """

    def __init__(self, database: Database, work_id: int, *, planned: int, runner: str, worker: str) -> None:
        self.database = database
        self.work_id = work_id
        self.planned = planned
        self.runner = runner
        self.worker = worker
        self.step = "verdict"
        with database.session() as session:
            self.done = int(
                session.scalar(
                    select(func.count()).select_from(ReplayRow).where(ReplayRow.work_id == work_id)
                )
                or 0
            )
        self._write()

    def replay(self, phase: str, result: ReplayResult) -> None:
        """Record one finished replay (an `Replayer.on_run` observer)."""
        now = utc_now()
        cost = result.cost
        with self.database.session() as session:
            session.add(
                ReplayRow(
                    work_id=self.work_id,
                    idx=self.done,
                    batch=0,
                    outcome=str(result.outcome),
                    fingerprint=result.failure.fingerprint if result.failure else None,
                    summary=replay_summary(result),
                    duration_s=result.process.duration_s,
                    cpu_s=cost.cpu_s if cost is not None else None,
                    gpu_s=cost.gpu_s if cost is not None else None,
                    runner=self.runner,
                    worker=self.worker,
                    created_at=now,
                    sent_at=now,
                    finished_at=now,
                )
            )
        self.done += 1
        self.step = STEPS.get(phase, phase)
        self._write()

    def message(self, message: str, _done: int, _planned: int) -> None:
        """A `flaketriage.workers.triage.ProgressFn`: a message from the order search names its step."""
        if not message.startswith("replaying"):
            self.step = STEPS["order"]
            self._write()

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "done": self.done, "planned": max(self.planned, self.done)}

    def _write(self) -> None:
        with self.database.session() as session:
            session.execute(
                update(Work)
                .where(Work.id == self.work_id, Work.status == WorkStatus.RUNNING.value)
                .values(result={"progress": self.to_json()})
                .execution_options(synchronize_session=False)
            )
