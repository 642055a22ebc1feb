"""Group commit for the receiver: deliveries recorded many to a transaction, each answered once its
own is committed and its work handed to the broker.

Under load, a transaction and a broker message per delivery cost far more than the delivery's own
work. `IntakeQueue` hands every delivery to a few writer threads; a writer takes all that wait (up
to `max_batch`), records them together (`Intake.commit_batch`: one transaction), hands the batch's
work to the broker (`Dispatcher.send`) and only then answers the batch's requests, so 202 keeps its
meaning. While one writer waits for the database, another records the next batch: a batch spends
most of its time in round trips, so two writers take about twice the deliveries. A batch that fails
is recorded again one delivery at a time, so a bad delivery never fails the others. When nothing
else waits, a delivery goes alone, at once.

Writers on SQLite: one (it takes one writer at a time anyway). Requests on an event loop
(`record`) are answered in one call into the loop per batch, not one per request.

The receiver records through an `IntakeQueue` on SQLite; on PostgreSQL it records the same batches
(`record_each`, `settle`) in a process of its own (`flaketriage.orchestrator.intake_process`).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from flaketriage.orchestrator.intake import Intake, IntakeResult, Item, Sighting

WRITERS = 2
"""Writer threads on a database that takes concurrent writers (PostgreSQL)."""


@dataclass
class Pending:
    source: str
    delivery_id: str
    kind: str
    sightings: Sequence[Sighting]
    future: Future[IntakeResult] | asyncio.Future[IntakeResult]


class IntakeQueue:
    """Records deliveries through `intake` on writer threads, in batches, and sends their work."""

    def __init__(self, intake: Intake, *, max_batch: int = 256, writers: int | None = None) -> None:
        self.intake = intake
        self.max_batch = max_batch
        if writers is None:
            writers = WRITERS if intake.database.engine.dialect.name == "postgresql" else 1
        self.writers = max(1, writers)
        self._queue: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(
        self, source: str, delivery_id: str, kind: str, sightings: Sequence[Sighting]
    ) -> Future[IntakeResult]:
        """The delivery's result, once it is recorded and its work sent (or the error that kept it
        from being: `RecordsError`, nothing recorded; `BrokerError`, recorded but not sent)."""
        future: Future[IntakeResult] = Future()
        self._put(Pending(source, delivery_id, kind, sightings, future))
        return future

    async def record(
        self, source: str, delivery_id: str, kind: str, sightings: Sequence[Sighting]
    ) -> IntakeResult:
        """`submit`, awaited on the running event loop."""
        waiter: asyncio.Future[IntakeResult] = asyncio.get_running_loop().create_future()
        self._put(Pending(source, delivery_id, kind, sightings, waiter))
        return await waiter

    def close(self) -> None:
        """Record and answer what waits, then stop the writers."""
        with self._lock:
            if self._threads:
                self._queue.put(None)  # each writer that takes it passes it on, then stops
                for thread in self._threads:
                    thread.join(timeout=30)
                self._threads = []
                self._queue = queue.SimpleQueue()

    def _put(self, item: Pending) -> None:
        self._ensure_threads()
        self._queue.put(item)

    def _ensure_threads(self) -> None:
        with self._lock:
            # Only an error in Python itself ends a writer: one that did is started again.
            self._threads = [t for t in self._threads if t.is_alive()]
            while len(self._threads) < self.writers:
                name = f"flaketriage-intake-{len(self._threads) + 1}"
                thread = threading.Thread(target=self._write_all, name=name, daemon=True)
                thread.start()
                self._threads.append(thread)

    def _write_all(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                self._queue.put(None)  # for the next writer
                return
            batch = [first]
            stop = False
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._write(batch)
            if stop:
                self._queue.put(None)
                return

    def _write(self, batch: list[Pending]) -> None:
        outcomes = record_each(self.intake, [(p.source, p.delivery_id, p.kind, p.sightings) for p in batch])
        settle([(p.future, result, error) for p, (result, error) in zip(batch, outcomes, strict=True)])


Outcome = tuple[IntakeResult | None, BaseException | None]
"""A delivery's result, or the error that kept it from being recorded or its work from being sent."""

Waiter = Future[IntakeResult] | asyncio.Future[IntakeResult]
"""What a request waits on for its delivery's outcome."""


def record_each(intake: Intake, items: Sequence[Item]) -> list[Outcome]:
    """Record `items` in one transaction and send their work: each one's outcome. A batch that fails
    is recorded again one delivery at a time, so that only the delivery at fault fails."""
    try:
        results, outgoing = intake.commit_batch(items)
    except Exception as exc:  # nothing of the batch was committed
        if len(items) == 1:
            return [(None, exc)]
        return [outcome for item in items for outcome in record_each(intake, [item])]
    try:
        intake.dispatcher.send(outgoing)
    except Exception as exc:  # a `BrokerError`: committed, not handed over; all of it hears so
        return [(None, exc)] * len(items)
    return [(result, None) for result in results]


Settled = tuple[Waiter, IntakeResult | None, BaseException | None]
"""A waiter and its delivery's outcome."""


def settle(outcomes: Sequence[Settled]) -> None:
    """Give each waiter its result or error: at once for those awaited on this thread's event loop,
    in one call per loop for those awaited on another thread's."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Settled]] = {}
    for outcome in outcomes:
        future = outcome[0]
        if isinstance(future, asyncio.Future):
            by_loop.setdefault(future.get_loop(), []).append(outcome)
        else:
            _resolve(*outcome)
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    for loop, waiting in by_loop.items():
        if loop is running:
            _resolve_all(waiting)
            continue
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits these any more
            loop.call_soon_threadsafe(_resolve_all, waiting)


def _resolve_all(outcomes: list[Settled]) -> None:
    for outcome in outcomes:
        _resolve(*outcome)


def _resolve(future: Waiter, result: IntakeResult | None, error: BaseException | None) -> None:
    if future.done():  # an awaiting request that was cancelled (its client went away)
        return
    if error is not None:
        future.set_exception(error)
    else:
        assert result is not None
        future.set_result(result)
