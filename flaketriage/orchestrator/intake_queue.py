"""Group commit for the receiver: deliveries recorded many to a transaction, each answered once its
own is committed.

Under load, a transaction and a broker message per delivery cost far more than the delivery's own
work. `IntakeQueue` hands every delivery to one recording thread, which takes all that are waiting
(up to `max_batch`) and records them together (`Intake.record_batch`): one transaction, one round
of task messages. Each request still waits until its delivery is committed and its work sent, so
202 keeps its meaning; a batch that fails is recorded again one delivery at a time, so a bad
delivery never fails the others. When nothing else waits, a delivery goes alone, at once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from flaketriage.errors import BrokerError
from flaketriage.orchestrator.intake import Intake, IntakeResult, Sighting


@dataclass
class Pending:
    source: str
    delivery_id: str
    kind: str
    sightings: Sequence[Sighting]
    future: Future[IntakeResult] = field(default_factory=Future)


class IntakeQueue:
    """Records deliveries through `intake` on one thread, in batches."""

    def __init__(self, intake: Intake, *, max_batch: int = 256) -> None:
        self.intake = intake
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(
        self, source: str, delivery_id: str, kind: str, sightings: Sequence[Sighting]
    ) -> Future[IntakeResult]:
        """The delivery's result, once it is recorded (or the error that kept it from being)."""
        self._ensure_thread()
        item = Pending(source, delivery_id, kind, sightings)
        self._queue.put(item)
        return item.future

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="flaketriage-intake", daemon=True)
                self._thread.start()

    def _run(self) -> None:
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

    def _record(self, batch: list[Pending]) -> None:
        try:
            results = self.intake.record_batch(
                [(p.source, p.delivery_id, p.kind, p.sightings) for p in batch]
            )
        except BrokerError as exc:  # committed, but not handed over: every delivery of it hears so
            for item in batch:
                item.future.set_exception(exc)
            return
        except Exception as exc:  # nothing of the batch was committed
            if len(batch) == 1:
                batch[0].future.set_exception(exc)
                return
            for item in batch:  # one at a time: only the delivery at fault fails
                self._record([item])
            return
        for item, result in zip(batch, results, strict=True):
            item.future.set_result(result)
