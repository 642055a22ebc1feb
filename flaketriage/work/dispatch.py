"""Recording work and sending its task: the row first, the message after the commit, and a sweep.

The database is the record and the broker only carries work. `Dispatcher.request` writes a `Work`
row (the same key gives the same row, so a repeated request does nothing); once the transaction
commits, `send` hands the task to the broker. A message lost on the way (the broker restarted and
kept nothing, a worker died holding it) leaves its row waiting, and `sweep` sends it again. Workers
hold the rows they run by a lease they renew (`heartbeat_at`); a step whose lease ran out is sent
again too.

Shared by the orchestrator (events start triages) and the workers (a triage sends its replays, then
minimization and the report), so both live here, in the core.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Connection, or_, select
from sqlalchemy.orm import Session

from flaketriage.errors import BrokerError
from flaketriage.records import Database, ReplayRow, Work, WorkStatus
from flaketriage.records.bulk import insert_rows
from flaketriage.records.models import utc_now
from flaketriage.records.transitions import work_resent
from flaketriage.work.messages import (
    SEND_TASKS_TASK,
    Queue,
    QueuedTask,
    Step,
    TaskBatch,
    WorkOrder,
    task_name,
)

LEASE_S = 120.0
"""A running step renews its lease well within this; one silent this long lost its worker."""


class TaskSender(Protocol):
    """What hands tasks to the broker: one (`send`) or many at once (`send_many`); raises `BrokerError`."""

    def send(self, name: str, order: WorkOrder, queue: str) -> None: ...

    def send_many(self, tasks: Sequence[Outgoing]) -> None:
        """Send `tasks` in order; `BrokerError` when the broker did not take them all."""
        ...


_RETRY_POLICY = {"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2}


class CelerySender:
    """Sends through a Celery app (by task name: the sender needs no task code).

    With `fan_out_queue`, `send_many` hands two or more tasks to the broker as one message: a
    `SEND_TASKS_TASK` on that queue, which a worker sends on, task by task. The receiver sends so:
    publishing one Celery task costs it about 0.2 ms of its one core, a batch message about the same
    for the whole batch. Its tasks are as durable in the broker as if sent one by one: a fan-out lost
    on the way loses what its tasks would have been lost with, and the sweep sends those again.
    """

    def __init__(self, app: Any, *, fan_out_queue: str | None = None) -> None:
        self.app = app
        self.fan_out_queue = fan_out_queue

    def send(self, name: str, order: WorkOrder, queue: str) -> None:
        try:
            self._send_task(name, {"order": order.model_dump()}, queue)
        except Exception as exc:  # kombu/redis raise many types; all mean "not sent now"
            raise BrokerError(f"the broker did not take task {name} ({type(exc).__name__}: {exc})") from exc

    def send_many(self, tasks: Sequence[Outgoing]) -> None:
        """Send `tasks`: one at a time when there is one; as one fan-out message with a
        `fan_out_queue`; else through one producer, in one round trip where the transport batches
        (Redis: one pipeline, kombu's ``Producer.batch``), and one at a time with retries if that fails."""
        if len(tasks) <= 1:
            for task in tasks:
                self.send(task.name, task.order, task.queue)
        elif self.fan_out_queue is not None:
            self._fan_out(tasks, self.fan_out_queue)
        else:
            self._send_batch(tasks)

    def _fan_out(self, tasks: Sequence[Outgoing], queue: str) -> None:
        batch = TaskBatch(tasks=tuple(QueuedTask(name=t.name, order=t.order, queue=t.queue) for t in tasks))
        try:
            self._send_task(
                SEND_TASKS_TASK, {"batch": batch.model_dump()}, queue, repr_=f"<{len(tasks)} tasks>"
            )
        except Exception as exc:
            raise BrokerError(
                f"the broker did not take {len(tasks)} tasks in one {SEND_TASKS_TASK} "
                f"({type(exc).__name__}: {exc})"
            ) from exc

    def _send_batch(self, tasks: Sequence[Outgoing]) -> None:
        try:
            with self.app.producer_or_acquire() as producer, producer.batch():
                for task in tasks:
                    self._send_task(task.name, {"order": task.order.model_dump()}, task.queue, producer)
        except Exception:
            # Perhaps part of the batch reached the broker: all of it again, one at a time with
            # Celery's retries (a task delivered twice does its work once: its step is leased).
            for task in tasks:
                self.send(task.name, task.order, task.queue)

    def _send_task(
        self, name: str, kwargs: dict[str, Any], queue: str, producer: Any = None, repr_: str | None = None
    ) -> None:
        self.app.send_task(
            name,
            kwargs=kwargs,
            queue=queue,
            producer=producer,
            retry=True,
            retry_policy=_RETRY_POLICY,
            # What a worker logs for the task; given here, Celery need not work it out (`saferepr`).
            argsrepr="()",
            kwargsrepr=repr(kwargs) if repr_ is None else repr_,
        )

    def ping(self) -> None:
        try:
            with self.app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=2)
        except Exception as exc:
            raise BrokerError(f"the broker does not answer ({type(exc).__name__}: {exc})") from exc


@dataclass
class MemorySender:
    """Remembers what was sent, in order; `fail` makes it behave like a broker that is down."""

    sent: list[tuple[str, WorkOrder, str]] = field(default_factory=list)
    fail: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def send(self, name: str, order: WorkOrder, queue: str) -> None:
        if self.fail:
            raise BrokerError("the broker is down (MemorySender.fail)")
        with self._lock:
            self.sent.append((name, order, queue))

    def send_many(self, tasks: Sequence[Outgoing]) -> None:
        for task in tasks:
            self.send(task.name, task.order, task.queue)

    def ping(self) -> None:
        if self.fail:
            raise BrokerError("the broker is down (MemorySender.fail)")

    def take(self) -> list[tuple[str, WorkOrder, str]]:
        with self._lock:
            taken, self.sent = self.sent, []
        return taken


@dataclass(frozen=True)
class WorkRequest:
    """A step asked for; `key` names it, so asking twice gives the same work."""

    key: str
    step: Step
    queue: Queue | str
    case_id: int | None = None
    bundle_id: str | None = None
    store_url: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outgoing:
    """A task to send once the transaction that recorded it commits."""

    name: str
    order: WorkOrder
    queue: str


class Dispatcher:
    """Records work in `database` and sends it with `sender`."""

    def __init__(
        self,
        database: Database,
        sender: TaskSender,
        *,
        sweep_after_s: float = 300.0,
        replay_grace_s: float = 900.0,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.database = database
        self.sender = sender
        self.sweep_after = timedelta(seconds=sweep_after_s)
        self.replay_grace = timedelta(seconds=replay_grace_s)
        self.clock = clock

    # -- recording ------------------------------------------------------------------------------
    def request(
        self,
        session: Session,
        *,
        key: str,
        step: Step,
        queue: Queue | str,
        case_id: int | None = None,
        bundle_id: str | None = None,
        store_url: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Work, Outgoing | None]:
        """The work row for `key`, created if new; with the task to send when it was created."""
        existing = session.scalars(select(Work).where(Work.key == key)).first()
        if existing is not None:
            return existing, None
        now = self.clock()
        work = Work(
            key=key,
            step=str(step),
            queue=str(queue),
            case_id=case_id,
            bundle_id=bundle_id,
            store_url=store_url,
            options=dict(options or {}),
            status=WorkStatus.QUEUED.value,
            attempts=0,
            batch=0,
            created_at=now,
            sent_at=now,
        )
        session.add(work)
        session.flush()
        return work, Outgoing(task_name(step), WorkOrder(work_id=work.id), str(queue))

    def request_many(self, conn: Connection, requests: Sequence[WorkRequest]) -> dict[str, Outgoing]:
        """Record the work `requests` ask for, in one statement: by key, the task to send for each
        work created now. A key already recorded (before, by a concurrent transaction, or by an
        earlier request of the same call) is the same work and has none."""
        now = self.clock()
        rows: dict[str, dict[str, Any]] = {}
        for r in requests:
            rows.setdefault(
                r.key,
                {
                    "key": r.key,
                    "step": str(r.step),
                    "queue": str(r.queue),
                    "case_id": r.case_id,
                    "bundle_id": r.bundle_id,
                    "store_url": r.store_url,
                    "options": dict(r.options),
                    "status": WorkStatus.QUEUED.value,
                    "attempts": 0,
                    "batch": 0,
                    "created_at": now,
                    "sent_at": now,
                },
            )
        if not rows:
            return {}
        created = insert_rows(
            conn, Work, list(rows.values()), returning=("id", "key"), skip_conflicts_on=("key",)
        )
        return {
            key: Outgoing(task_name(rows[key]["step"]), WorkOrder(work_id=work_id), rows[key]["queue"])
            for work_id, key in created
        }

    def replays(
        self, session: Session, work: Work, indices: Iterable[int], batch: int, *, queue: Queue | str
    ) -> list[Outgoing]:
        """Record replay rows `indices` of a triage and the tasks that run them."""
        now = self.clock()
        out: list[Outgoing] = []
        for idx in indices:
            session.add(ReplayRow(work_id=work.id, idx=idx, batch=batch, created_at=now, sent_at=now))
            out.append(Outgoing(task_name(Step.REPLAY), WorkOrder(work_id=work.id, replay=idx), str(queue)))
        session.flush()
        return out

    # -- sending --------------------------------------------------------------------------------
    def send(self, outgoing: Iterable[Outgoing | None]) -> None:
        """Hand committed work to the broker; `BrokerError` when it cannot take it (the sweep will)."""
        self.sender.send_many([item for item in outgoing if item is not None])

    def sweep(self, *, broker_emptied: bool = False) -> int:
        """Send again what waits too long: queued work, work whose lease ran out, replays never done,
        and triages whose replays all finished but whose next step was never sent.

        With `broker_emptied` (the broker restarted with none of its messages), everything queued
        or waiting is sent again now, not after `sweep_after_s`: none of it is in the broker.
        """
        now = self.clock()
        due = now if broker_emptied else now - self.sweep_after
        replays_due = now if broker_emptied else now - self.replay_grace
        lease_out = now - timedelta(seconds=LEASE_S)
        resend: list[Outgoing] = []
        with self.database.session() as session:
            works = session.scalars(
                select(Work).where(
                    or_(
                        (Work.status == WorkStatus.QUEUED.value) & (Work.sent_at < due),
                        (Work.status == WorkStatus.RUNNING.value) & (Work.heartbeat_at < lease_out),
                    )
                )
            ).all()
            waiting = session.scalars(
                select(Work).where(
                    Work.status == WorkStatus.WAITING.value,
                    Work.sent_at < due,
                    ~select(ReplayRow.id)
                    .where(ReplayRow.work_id == Work.id, ReplayRow.outcome.is_(None))
                    .exists(),
                )
            ).all()
            for work in [*works, *waiting]:
                work_resent(work, now=now)
                resend.append(Outgoing(task_name(work.step), WorkOrder(work_id=work.id), work.queue))
            stale_replays = session.execute(
                select(ReplayRow, Work.queue)
                .join(Work, Work.id == ReplayRow.work_id)
                .where(ReplayRow.outcome.is_(None), ReplayRow.sent_at < replays_due)
                .where(Work.status != WorkStatus.DONE.value)
            ).all()
            for replay, queue in stale_replays:
                replay.sent_at = now
                resend.append(
                    Outgoing(
                        task_name(Step.REPLAY), WorkOrder(work_id=replay.work_id, replay=replay.idx), queue
                    )
                )
        self.send(resend)
        return len(resend)
