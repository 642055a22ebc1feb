"""The work the service hands to its workers: task names, queues, and the messages tasks take.

The orchestrator and the workers meet only here and in the database: the orchestrator records a
`Work` row and sends the task named for its step with a `WorkOrder`; a worker runs it and records
what it did. Messages are small JSON objects: the row id says everything else.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Queue(StrEnum):
    """Queues by capability: a worker consumes the ones it can serve."""

    CPU = "cpu"
    GPU = "gpu"
    REPORT = "report"
    """Reports and the service's own upkeep (sweeps, schedules): no replays, light."""


class Step(StrEnum):
    """One step of the pipeline for a case and a bundle; each is a Celery task of the same name."""

    TRIAGE = "triage"
    """Advance the sequential test: send the next batch of replays, or decide."""
    REPLAY = "replay"
    MINIMIZE = "minimize"
    REPORT = "report"
    TELEMETRY = "telemetry"
    RERUN = "rerun"
    """An isolation rerun of a quarantined failure: is it fixed?"""
    HISTORY = "history"
    """What an upload of CI results says: tests suspected flaky, cases their passes resolve."""
    CHECK = "check"
    """Publish (or update in place) a commit's pull request check run."""


def task_name(step: Step | str) -> str:
    return f"flaketriage.{step}"


SWEEP_TASK = "flaketriage.sweep"
"""Re-send work whose message was lost (the database is the record, the broker only carries work)."""
BROKER_CHECK_TASK = "flaketriage.broker_check"
"""Whether a Redis broker restarted empty, asked more often than sweeps run: when it did, the sweep's
work (all queued and waiting work sent again) is done at once instead of at the next sweep."""
SCHEDULE_RERUNS_TASK = "flaketriage.schedule_reruns"
SCHEDULE_TELEMETRY_TASK = "flaketriage.schedule_telemetry"
GC_TASK = "flaketriage.gc"
ROLL_UP_TASK = "flaketriage.roll_up"
"""Fold old CI results into daily totals per test."""
ROLL_UP_FAILURES_TASK = "flaketriage.roll_up_failures"
"""Count the failures of the last complete days by verdict again, for the dashboard's overview."""
SEND_TASKS_TASK = "flaketriage.send_tasks"
"""Send on the step tasks a `TaskBatch` carries: how the receiver hands the work of one transaction to
the broker in one message (a worker does the per-task publishing, off the receiver's hot path)."""


class WorkOrder(BaseModel):
    """The message of every step's task: which `Work` row to do (and, for a replay, which one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    work_id: int = Field(ge=1)
    replay: int | None = Field(default=None, ge=0)
    """For a replay task: its index within the triage."""


class QueuedTask(BaseModel):
    """One step task as a `TaskBatch` carries it: the task's name, its order and its queue."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    order: WorkOrder
    queue: str

    @field_validator("name")
    @classmethod
    def _a_step_task(cls, name: str) -> str:
        if name not in _STEP_TASKS:
            raise ValueError(f"{name!r} is not a step task; expected one of {sorted(_STEP_TASKS)}")
        return name


class TaskBatch(BaseModel):
    """The message of `SEND_TASKS_TASK`: step tasks whose work one transaction recorded, in order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: tuple[QueuedTask, ...] = Field(min_length=1)


_STEP_TASKS = frozenset(task_name(step) for step in Step)
