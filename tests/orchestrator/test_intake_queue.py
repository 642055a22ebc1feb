"""The intake queue: deliveries from many requests at once are recorded in batches by writer threads
(two on PostgreSQL, one on SQLite), each answered once its own is committed and its work sent; a bad
delivery fails alone; a broker that is down is heard by every delivery of its batch."""

from __future__ import annotations

import asyncio
import threading

import pytest

from flaketriage.errors import BrokerError, RecordsError
from flaketriage.orchestrator.intake import Intake, IntakeOutcome, IntakeResult, Sighting
from flaketriage.orchestrator.intake_queue import IntakeQueue
from flaketriage.records import Case, Database, Delivery, Occurrence, Work
from flaketriage.work.dispatch import Dispatcher, MemorySender
from tests.orchestrator.recorders import count_rows, numbered_sighting, record_each_twice_at_once


def _sighting(n: int, fingerprint: str | None = None) -> Sighting:
    return numbered_sighting(n, fingerprint=fingerprint or f"failure-{n:04d}")


def _queue(database: Database, sender: MemorySender) -> IntakeQueue:
    intake = Intake(database, Dispatcher(database, sender), retriage_after_s=3600, storm_window_s=0)
    return IntakeQueue(intake, max_batch=16)


def test_writers_by_backend(database: Database) -> None:
    queue = _queue(database, MemorySender())
    assert queue.writers == (2 if database.engine.dialect.name == "postgresql" else 1)


def test_many_requests_at_once_are_each_recorded_once_and_answered(database: Database) -> None:
    sender = MemorySender()
    results = record_each_twice_at_once(_queue(database, sender), 100)
    outcomes = [r.outcome for r in results]
    assert outcomes.count(IntakeOutcome.ACCEPTED) == 100 and outcomes.count(IntakeOutcome.DUPLICATE) == 100
    assert [count_rows(database, model) for model in (Delivery, Case, Work)] == [100, 100, 100]
    assert sorted(order.work_id for _, order, _ in sender.sent) == sorted(w for r in results for w in r.work)


def test_threads_and_an_event_loop_share_one_queue(database: Database) -> None:
    queue = _queue(database, MemorySender())
    answers: list[IntakeResult] = []

    def from_a_thread(base: int) -> None:
        for n in range(base, base + 20):
            answers.append(queue.submit("github", f"g-{n}", "check_run", [_sighting(n)]).result(timeout=60))

    threads = [threading.Thread(target=from_a_thread, args=(b,)) for b in (0, 100)]
    for thread in threads:
        thread.start()

    async def from_the_loop() -> list[IntakeResult]:
        calls = [
            queue.record("events", f"e-{n}", "failure.captured", [_sighting(n)]) for n in range(200, 240)
        ]
        return await asyncio.gather(*calls)

    try:
        answers.extend(asyncio.run(from_the_loop()))
        for thread in threads:
            thread.join(timeout=60)
    finally:
        queue.close()
    assert len(answers) == 80 and {a.outcome for a in answers} == {IntakeOutcome.ACCEPTED}
    assert count_rows(database, Case) == 80


def test_a_bad_delivery_fails_alone(postgres_database: Database) -> None:
    # A fingerprint longer than its column: PostgreSQL refuses the batch it is in; the others of that
    # batch are recorded again one at a time and succeed.
    queue = _queue(postgres_database, MemorySender())

    async def together() -> list[IntakeResult | BaseException]:
        calls = [
            queue.record("events", f"d-{n}", "failure.captured",
                         [_sighting(n, fingerprint="x" * 300 if n == 5 else None)])
            for n in range(12)
        ]  # fmt: skip
        return await asyncio.gather(*calls, return_exceptions=True)

    try:
        results = asyncio.run(together())
    finally:
        queue.close()
    failed = [n for n, r in enumerate(results) if isinstance(r, BaseException)]
    assert failed == [5] and isinstance(results[5], RecordsError)
    assert count_rows(postgres_database, Case) == 11 and count_rows(postgres_database, Delivery) == 11


def test_a_broker_that_is_down_is_heard_by_the_whole_batch_which_stays_recorded(database: Database) -> None:
    queue = _queue(database, MemorySender(fail=True))

    async def together() -> list[IntakeResult | BaseException]:
        calls = [queue.record("events", f"d-{n}", "failure.captured", [_sighting(n)]) for n in range(10)]
        return await asyncio.gather(*calls, return_exceptions=True)

    try:
        results = asyncio.run(together())
    finally:
        queue.close()
    assert all(isinstance(r, BrokerError) for r in results)
    assert count_rows(database, Work) == 10  # the sweep sends them once the broker is back


def test_close_answers_what_waits_and_the_queue_starts_again(database: Database) -> None:
    queue = _queue(database, MemorySender())
    futures = [queue.submit("events", f"d-{n}", "failure.captured", [_sighting(n)]) for n in range(30)]
    queue.close()
    assert all(f.done() for f in futures) and {f.result().outcome for f in futures} == {
        IntakeOutcome.ACCEPTED
    }
    again = queue.submit("events", "d-late", "failure.captured", [_sighting(99)])
    try:
        assert again.result(timeout=60).outcome is IntakeOutcome.ACCEPTED
    finally:
        queue.close()


def test_a_request_that_went_away_does_not_stop_the_writers(database: Database) -> None:
    queue = _queue(database, MemorySender())

    async def one_gives_up() -> IntakeResult:
        gone = asyncio.ensure_future(queue.record("events", "d-gone", "failure.captured", [_sighting(1)]))
        await asyncio.sleep(0)  # queued, not answered yet
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        return await queue.record("events", "d-next", "failure.captured", [_sighting(2)])

    try:
        assert asyncio.run(one_gives_up()).outcome is IntakeOutcome.ACCEPTED
    finally:
        queue.close()
    assert count_rows(database, Delivery) == 2  # what was sent is recorded, whether or not anyone waits


def test_one_delivery_id_with_twenty_failures_at_once_is_one_delivery_and_its_one_case(
    database: Database,
) -> None:
    # The same id, each time with another failure (a sender that reuses ids, a forged repeat):
    # the first recorded is the delivery; the others are duplicates and write nothing, whether they
    # land in its batch or in transactions of their own racing it.
    sender = MemorySender()
    queue = _queue(database, sender)

    async def together() -> list[IntakeResult]:
        calls = [queue.record("events", "d-same", "failure.captured", [_sighting(n)]) for n in range(20)]
        return await asyncio.gather(*calls)

    try:
        batched = asyncio.run(together())
    finally:
        queue.close()
    intake = queue.intake
    racing: list[IntakeResult] = []
    threads = [
        threading.Thread(
            target=lambda n=n: racing.append(
                intake.record("events", "d-other", "failure.captured", [_sighting(100 + n)])
            )
        )
        for n in range(20)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for results in (batched, racing):
        outcomes = [r.outcome for r in results]
        assert len(outcomes) == 20 and outcomes.count(IntakeOutcome.DUPLICATE) == 19, outcomes
    assert [count_rows(database, model) for model in (Delivery, Case, Occurrence, Work)] == [2, 2, 2, 2]
    assert len(sender.sent) == 2
