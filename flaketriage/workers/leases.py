"""Leases on work rows: one worker runs a step at a time, and a step whose worker died is taken over.

`claim` takes a row that waits (queued, or a triage waiting for its replays) or whose lease ran out
(its worker stopped renewing it); `Heartbeat` renews the lease while a long step runs. A second
delivery of the same task finds the row taken, or done, and does nothing.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from types import TracebackType

from sqlalchemy import or_, update

from flaketriage.records import Database, Work, WorkStatus
from flaketriage.records.models import utc_now
from flaketriage.work.dispatch import LEASE_S


def claim(database: Database, work_id: int) -> bool:
    """Take `work_id` for this worker; False when another holds it or it is finished."""
    now = utc_now()
    expired = now - timedelta(seconds=LEASE_S)
    with database.session() as session:
        result = session.execute(
            update(Work)
            .where(
                Work.id == work_id,
                or_(
                    Work.status.in_([WorkStatus.QUEUED.value, WorkStatus.WAITING.value]),
                    (Work.status == WorkStatus.RUNNING.value) & (Work.heartbeat_at < expired),
                ),
            )
            .values(
                status=WorkStatus.RUNNING.value,
                attempts=Work.attempts + 1,
                heartbeat_at=now,
                started_at=now,
            )
            .execution_options(synchronize_session=False)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def release(database: Database, work_id: int, status: str, **values: object) -> None:
    """Leave the row in `status` (done, failed, waiting, queued) with `values` set."""
    now = utc_now()
    extra: dict[str, object] = {"status": status, "heartbeat_at": None, **values}
    if status in (WorkStatus.DONE.value, WorkStatus.FAILED.value):
        extra.setdefault("finished_at", now)
    if status in (WorkStatus.QUEUED.value, WorkStatus.WAITING.value):
        extra.setdefault("sent_at", now)
    with database.session() as session:
        session.execute(
            update(Work)
            .where(Work.id == work_id)
            .values(**extra)
            .execution_options(synchronize_session=False)
        )


class Heartbeat:
    """Renews the lease on `work_id` every `every_s` seconds while the block runs."""

    def __init__(self, database: Database, work_id: int, every_s: float = LEASE_S / 4) -> None:
        self.database = database
        self.work_id = work_id
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{work_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                with self.database.session() as session:
                    session.execute(
                        update(Work)
                        .where(Work.id == self.work_id, Work.status == WorkStatus.RUNNING.value)
                        .values(heartbeat_at=utc_now())
                        .execution_options(synchronize_session=False)
                    )
            except Exception:  # a missed beat is retried; the lease is four beats long
                continue
