"""Group commit for the receiver: deliveries recorded many to a transaction, each answered once its
own is committed and its work handed to the broker.

Under load, a transaction and a broker message per delivery cost far more than the delivery's own
work. `IntakeQueue` hands every delivery to one recording thread, which takes all that are waiting
(up to `max_batch`) and records them together (`Intake.commit_batch`): one transaction. A second
thread then hands the batch's work to the broker (`Dispatcher.send`) while the first records the
next batch, and only then answers the batch's requests, so 202 keeps its meaning. A batch that fails
is recorded again one delivery at a time, so a bad delivery never fails the others. When nothing
else waits, a delivery goes alone, at once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from flaketriage.dispatch import Outgoing
from flaketriage.orchestrator.intake import Intake, IntakeResult, Sighting


@dataclass
class Pending:
    source: str
    delivery_id: str
    kind: str
    sightings: Sequence[Sighting]
    future: Future[IntakeResult] = field(default_factory=Future)


_Committed = tuple[list[Pending], list[IntakeResult], list[Outgoing]]
"""A committed batch: its deliveries, their results, and the tasks to send before answering them."""


class IntakeQueue:
    """Records deliveries through `intake` on one thread, in batches; sends their work on another."""

    def __init__(self, intake: Intake, *, max_batch: int = 256) -> None:
        self.intake = intake
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._committed: queue.SimpleQueue[_Committed | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(
        self, source: str, delivery_id: str, kind: str, sightings: Sequence[Sighting]
    ) -> Future[IntakeResult]:
        """The delivery's result, once it is recorded (or the error that kept it from being)."""
        self._ensure_threads()
        item = Pending(source, delivery_id, kind, sightings)
        self._queue.put(item)
        return item.future

    def close(self) -> None:
        with self._lock:
            if self._threads:
                self._queue.put(None)  # the recorder finishes what waits, then stops the sender
                for thread in self._threads:
                    thread.join(timeout=30)
                self._threads = []

    def _ensure_threads(self) -> None:
        with self._lock:
            roles = (("flaketriage-intake", self._record_all), ("flaketriage-intake-send", self._send_all))
            if not self._threads:
                self._threads = [threading.Thread(target=t, name=n, daemon=True) for n, t in roles]
                for thread in self._threads:
                    thread.start()
                return
            for index, (name, target) in enumerate(roles):  # only an error in Python itself ends one
                if not self._threads[index].is_alive():
                    self._threads[index] = threading.Thread(target=target, name=name, daemon=True)
                    self._threads[index].start()

    def _record_all(self) -> None:
        try:
            while True:
                first = self._queue.get()
                if first is None:
                    return
                batch = [first]
                while len(batch) < self.max_batch:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        self._queue.put(None)  # finish this batch, then stop
                        break
                    batch.append(item)
                self._record(batch)
        finally:
            self._committed.put(None)

    def _record(self, batch: list[Pending]) -> None:
        try:
            results, outgoing = self.intake.commit_batch(
                [(p.source, p.delivery_id, p.kind, p.sightings) for p in batch]
            )
        except Exception as exc:  # nothing of the batch was committed
            if len(batch) == 1:
                batch[0].future.set_exception(exc)
                return
            for item in batch:  # one at a time: only the delivery at fault fails
                self._record([item])
            return
        self._committed.put((batch, results, outgoing))

    def _send_all(self) -> None:
        while True:
            committed = self._committed.get()
            if committed is None:
                return
            batch, results, outgoing = committed
            try:
                self.intake.dispatcher.send(outgoing)
            except Exception as exc:  # a `BrokerError`: committed, not handed over; all of it hears so
                for item in batch:
                    item.future.set_exception(exc)
                continue
            for item, result in zip(batch, results, strict=True):
                item.future.set_result(result)
