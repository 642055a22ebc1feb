"""The Celery app of the workers: `create_celery` registers the tasks and the beat schedule.

Nothing happens at import. Each worker process builds its `WorkerEnv` (database, sandbox, report
sinks) at its first task, after the pool forked it, so no connection is ever shared across a fork.
Tasks are thin: they parse their `WorkOrder` and call the `Pipeline`; database and broker outages
are retried with backoff, anything else is recorded on the work and its case.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from datetime import timedelta
from typing import Any

from celery import Celery

from flaketriage.errors import BrokerError, RecordsError
from flaketriage.records import Database
from flaketriage.settings import Settings
from flaketriage.work.broker import broker_was_emptied
from flaketriage.work.celery import build_celery
from flaketriage.work.dispatch import CelerySender, Dispatcher, Outgoing
from flaketriage.work.messages import (
    BROKER_CHECK_TASK,
    GC_TASK,
    ROLL_UP_FAILURES_TASK,
    ROLL_UP_TASK,
    SCHEDULE_RERUNS_TASK,
    SCHEDULE_TELEMETRY_TASK,
    SEND_TASKS_TASK,
    SWEEP_TASK,
    Queue,
    Step,
    TaskBatch,
    WorkOrder,
    task_name,
)
from flaketriage.workers.attribution import RunnerIdentity
from flaketriage.workers.comments import open_commenter
from flaketriage.workers.pipeline import Pipeline
from flaketriage.workers.replay import ReplayContext
from flaketriage.workers.report.backend import open_issue_sink
from flaketriage.workers.runtime import WorkerEnv
from flaketriage.workers.sandbox import make_sandbox
from flaketriage.workers.upkeep import Upkeep

log = logging.getLogger("flaketriage.workers")

TRANSIENT = (RecordsError, BrokerError)
"""Outages that pass: retried with backoff. Anything else is the work's own failure, recorded."""


class _PerProcess:
    """The `WorkerEnv` of the current process, built at first use (after a fork, a new one)."""

    def __init__(self, settings: Settings, app: Celery) -> None:
        self.settings = settings
        self.app = app
        self._env: WorkerEnv | None = None
        self._pid = -1
        self._lock = threading.Lock()

    def env(self) -> WorkerEnv:
        with self._lock:
            if self._env is None or self._pid != os.getpid():
                self._env = build_env(self.settings, self.app)
                self._pid = os.getpid()
            return self._env


def build_env(settings: Settings, app: Celery) -> WorkerEnv:
    database = Database(settings.resolved_database_url())
    return WorkerEnv(
        settings=settings,
        database=database,
        dispatcher=Dispatcher(
            database,
            CelerySender(app),
            sweep_after_s=settings.sweep_after_s,
            replay_grace_s=settings.replay_timeout_s + settings.sweep_after_s,
        ),
        sandbox=make_sandbox(settings.sandbox, warn=log.warning, settings=settings),
        sink=open_issue_sink(settings),  # GitHub when FLAKETRIAGE_GITHUB_REPO and credentials are set
        commenter=open_commenter(settings),
        context=ReplayContext.from_settings(settings),
        identity=RunnerIdentity.local(host=settings.runner_host),
    )


def create_celery(settings: Settings) -> Celery:
    """The workers' app: the shared one (`build_celery`), plus the tasks, their routes and the beat
    schedule."""
    app = build_celery(settings)
    app.conf.beat_schedule = beat_schedule(settings)
    app.conf.task_routes = {
        SWEEP_TASK: {"queue": Queue.REPORT.value},
        BROKER_CHECK_TASK: {"queue": Queue.REPORT.value},
        SCHEDULE_RERUNS_TASK: {"queue": Queue.REPORT.value},
        SCHEDULE_TELEMETRY_TASK: {"queue": Queue.REPORT.value},
        GC_TASK: {"queue": Queue.REPORT.value},
        ROLL_UP_TASK: {"queue": Queue.REPORT.value},
        ROLL_UP_FAILURES_TASK: {"queue": Queue.REPORT.value},
        SEND_TASKS_TASK: {"queue": Queue.REPORT.value},
    }
    holder = _PerProcess(settings, app)
    retry: dict[str, Any] = {
        "autoretry_for": TRANSIENT,
        "retry_backoff": 2,
        "retry_backoff_max": 120,
        "retry_jitter": True,
        "max_retries": 30,
    }

    def step_task(step: Step) -> None:
        def run(order: dict[str, Any]) -> str:
            parsed = WorkOrder.model_validate(order)
            pipeline = Pipeline(holder.env())
            replay = int(parsed.replay or 0) if step is Step.REPLAY else None
            if replay is not None:
                outcome = pipeline.replay(parsed.work_id, replay)
            else:
                outcome = str(getattr(pipeline, str(step))(parsed.work_id))
            with contextlib.suppress(RecordsError):  # the line is for people; the step is done
                log.info("%s", pipeline.log_line(step, parsed.work_id, outcome, replay))
            return outcome

        run.__name__ = f"{step}_task"
        app.task(name=task_name(step), **retry)(run)

    for step in Step:
        step_task(step)

    def emptied() -> bool:
        with app.connection_for_write() as connection:
            lost = broker_was_emptied(connection)
        if lost:
            log.warning("the broker lost its messages (it restarted empty): sending all waiting work again")
        return lost

    def sweep() -> int:
        return holder.env().dispatcher.sweep(broker_emptied=emptied())

    def broker_check() -> int:
        # One Redis command when nothing happened; the sweep's resending only when the broker lost
        # its messages, so lost work goes out within this check's period, not the sweep's minute.
        return holder.env().dispatcher.sweep(broker_emptied=True) if emptied() else 0

    def schedule_reruns() -> int:
        return Upkeep(holder.env()).schedule_reruns()

    def schedule_telemetry() -> int:
        return Upkeep(holder.env()).schedule_telemetry()

    def gc() -> dict[str, int]:
        return Upkeep(holder.env()).collect_garbage()

    def roll_up() -> int:
        return Upkeep(holder.env()).roll_up_results()

    def roll_up_failures() -> int:
        return Upkeep(holder.env()).roll_up_failures()

    sender = CelerySender(app)

    def send_tasks(batch: dict[str, Any]) -> int:
        # The receiver's fan-out: its tasks, sent on in one round trip (no database needed). Sent
        # again should this one be retried: a step task delivered twice does its work once.
        tasks = TaskBatch.model_validate(batch).tasks
        sender.send_many([Outgoing(t.name, t.order, t.queue) for t in tasks])
        return len(tasks)

    for name, fn in (
        (SWEEP_TASK, sweep),
        (BROKER_CHECK_TASK, broker_check),
        (SCHEDULE_RERUNS_TASK, schedule_reruns),
        (SCHEDULE_TELEMETRY_TASK, schedule_telemetry),
        (GC_TASK, gc),
        (ROLL_UP_TASK, roll_up),
        (ROLL_UP_FAILURES_TASK, roll_up_failures),
        (SEND_TASKS_TASK, send_tasks),
    ):
        app.task(name=name, **retry)(fn)

    return app


BROKER_CHECK_EVERY_S = 10.0
"""How often beat asks whether a Redis broker restarted empty (`BROKER_CHECK_TASK`)."""


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    sweep_every_s = max(5.0, min(60.0, settings.sweep_after_s / 2))
    schedule: dict[str, dict[str, Any]] = {
        "sweep": {"task": SWEEP_TASK, "schedule": timedelta(seconds=sweep_every_s)},
        "isolation-reruns": {
            "task": SCHEDULE_RERUNS_TASK,
            "schedule": timedelta(seconds=settings.rerun_every_s),
        },
        "telemetry-runs": {
            "task": SCHEDULE_TELEMETRY_TASK,
            "schedule": timedelta(seconds=settings.telemetry_every_s),
        },
        "store-gc": {"task": GC_TASK, "schedule": timedelta(seconds=settings.gc_every_s)},
        "results-roll-up": {"task": ROLL_UP_TASK, "schedule": timedelta(seconds=settings.gc_every_s)},
        "failures-roll-up": {
            "task": ROLL_UP_FAILURES_TASK,
            "schedule": timedelta(seconds=settings.failure_days_every_s),
        },
    }
    if settings.resolved_broker_url().startswith(("redis://", "rediss://")) and (
        sweep_every_s > BROKER_CHECK_EVERY_S
    ):
        # Only Redis forgets its messages on a restart (the local broker keeps them on disk).
        schedule["broker-check"] = {
            "task": BROKER_CHECK_TASK,
            "schedule": timedelta(seconds=BROKER_CHECK_EVERY_S),
        }
    return schedule
