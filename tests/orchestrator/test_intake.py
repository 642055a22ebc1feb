"""The intake's rules, through the receiver: a known failure starts no new triage unless it was fixed,
failed or its triage grew old; a storm of one cause is triaged once; deliveries racing each other
are recorded once."""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
from fastapi.testclient import TestClient
from httpx2 import Response

from flaketriage.bundle.manifest import Provenance
from flaketriage.events import FailureEvent, FailureSummary
from flaketriage.signing import signed_headers

if TYPE_CHECKING:
    from conftest import Captured, MakeReceiver, Receiver  # tests/orchestrator/conftest.py

SECRET = b"events-secret"  # conftest.EVENTS_SECRET


def test_a_known_failure_adds_an_occurrence_and_starts_no_triage(
    receiver: Receiver, captured: Captured
) -> None:
    first = captured.event(captured.value_error)
    second = captured.event(captured.value_error_again)
    assert first.fingerprint == second.fingerprint and first.bundle_id != second.bundle_id
    assert receiver.post_event(first).status_code == 202

    response = receiver.post_event(second)

    assert response.status_code == 200
    [case] = receiver.cases()
    assert response.json() == {"outcome": "recorded", "cases": [case.id], "work": [], "notes": []}
    assert (case.occurrences, case.status, case.generation) == (2, "queued", 0)
    assert [o.bundle_id for o in receiver.occurrences()] == [captured.value_error, captured.value_error_again]
    assert len(receiver.works()) == 1
    assert len(receiver.sender.sent) == 1


@pytest.mark.parametrize("status", ["fixed", "failed"])
def test_a_fixed_or_failed_case_is_triaged_again(receiver: Receiver, captured: Captured, status: str) -> None:
    assert receiver.post_event(captured.event(captured.value_error)).status_code == 202
    [case] = receiver.cases()
    receiver.update_case(case.id, status=status, error="boom" if status == "failed" else None)

    response = receiver.post_event(captured.event(captured.value_error_again))

    assert response.status_code == 202
    [case] = receiver.cases()
    assert (case.status, case.generation, case.occurrences, case.error) == ("queued", 1, 2, None)
    first, second = receiver.works()
    assert response.json()["work"] == [second.id]
    assert (second.case_id, second.bundle_id) == (case.id, captured.value_error_again)
    assert [order.work_id for _, order, _ in receiver.sender.sent] == [first.id, second.id]


@pytest.mark.parametrize(("age", "triaged"), [(timedelta(hours=2), True), (timedelta(minutes=30), False)])
def test_a_case_is_triaged_again_when_its_last_triage_is_older_than_the_window(
    make_receiver: MakeReceiver, captured: Captured, age: timedelta, triaged: bool
) -> None:
    receiver = make_receiver(retriage_after_h=1)
    assert receiver.post_event(captured.event(captured.value_error)).status_code == 202
    [case] = receiver.cases()
    receiver.update_case(case.id, status="decided", verdict="flaky", last_triage_at=datetime.now(UTC) - age)

    response = receiver.post_event(captured.event(captured.value_error_again))

    assert response.status_code == (202 if triaged else 200)
    [case] = receiver.cases()
    assert len(receiver.works()) == (2 if triaged else 1)
    assert len(receiver.sender.sent) == (2 if triaged else 1)
    assert case.generation == (1 if triaged else 0)
    assert case.status == ("queued" if triaged else "decided")


# -- storms ---------------------------------------------------------------------------------------
def _storm_event(captured: Captured, index: int) -> FailureEvent:
    """A test of the suite failing of the one cause of the storm (a GPU that fell off the bus)."""
    test_id = f"tests/test_layers.py::test_forward[{index}]"
    base = captured.event(captured.value_error)
    return base.model_copy(
        update={
            "bundle_id": hashlib.sha256(f"bundle {index}".encode()).hexdigest(),
            "fingerprint": hashlib.sha256(test_id.encode()).hexdigest(),
            "failure": FailureSummary(
                kind="test",
                exception_type="RuntimeError",
                message="CUDA error: an illegal memory access was encountered",
                test_id=test_id,
            ),
            "command": ("python", "-m", "pytest", test_id),
            "provenance": Provenance(
                ci_provider="github-actions",
                run_url="https://github.com/acme/trainer/actions/runs/77",
                job="gpu-tests",
            ),
        }
    )


def test_a_storm_of_one_cause_is_triaged_once(receiver: Receiver, captured: Captured) -> None:
    responses = [receiver.post_event(_storm_event(captured, i)) for i in range(50)]

    assert [r.status_code for r in responses] == [202] + [200] * 49
    cases = receiver.cases()
    assert len(cases) == 50 and len({c.fingerprint for c in cases}) == 50
    leader, *followers = cases
    assert leader.storm_of is None and leader.status == "queued"
    assert {c.storm_of for c in followers} == {leader.id}
    assert {c.repository for c in cases} == {"acme/trainer"}
    [work] = receiver.works()
    assert work.case_id == leader.id
    assert len(receiver.sender.sent) == 1


def test_a_storm_follower_seen_again_still_follows(receiver: Receiver, captured: Captured) -> None:
    """The next run of the suite fails the same way: the leader's triage still stands for all."""
    for i in range(5):
        receiver.post_event(_storm_event(captured, i))

    again = [receiver.post_event(_storm_event(captured, i)) for i in range(1, 5)]

    assert [r.json()["outcome"] for r in again] == ["recorded"] * 4
    assert len(receiver.works()) == 1
    assert [c.occurrences for c in receiver.cases()] == [1, 2, 2, 2, 2]


def test_without_a_storm_window_each_failure_is_triaged(
    make_receiver: MakeReceiver, captured: Captured
) -> None:
    receiver = make_receiver(storm_window_s=0)

    responses = [receiver.post_event(_storm_event(captured, i)) for i in range(50)]

    assert {r.status_code for r in responses} == {202}
    assert {c.storm_of for c in receiver.cases()} == {None}
    assert len(receiver.works()) == 50
    assert len(receiver.sender.sent) == 50


def test_a_cause_triaged_before_the_window_starts_a_new_triage(
    make_receiver: MakeReceiver, captured: Captured
) -> None:
    receiver = make_receiver(storm_window_s=600)
    receiver.post_event(_storm_event(captured, 0))
    [leader] = receiver.cases()
    receiver.update_case(leader.id, last_triage_at=datetime.now(UTC) - timedelta(hours=1))

    response = receiver.post_event(_storm_event(captured, 1))

    assert response.status_code == 202
    assert receiver.cases()[1].storm_of is None
    assert len(receiver.works()) == 2


# -- concurrency ----------------------------------------------------------------------------------
def _at_once(receiver: Receiver, bodies: list[bytes]) -> list[Response]:
    """POST each body from its own thread, all released together."""
    barrier = threading.Barrier(len(bodies))
    responses: dict[int, Response] = {}
    errors: list[BaseException] = []

    def send(index: int) -> None:
        body = bodies[index]
        headers = signed_headers(SECRET, body) | {"Content-Type": "application/json"}
        try:
            with TestClient(receiver.app) as client:
                barrier.wait(timeout=30)
                responses[index] = client.post("/v1/events", content=body, headers=headers)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if errors:
        raise errors[0]
    assert len(responses) == len(bodies)
    return [responses[i] for i in range(len(bodies))]


def test_one_event_delivered_from_8_threads_at_once_is_recorded_once(
    receiver: Receiver, captured: Captured
) -> None:
    body = captured.event(captured.value_error).body()

    responses = _at_once(receiver, [body] * 8)

    assert Counter(r.status_code for r in responses) == {202: 1, 200: 7}, [r.text for r in responses]
    assert Counter(r.json()["outcome"] for r in responses) == {"accepted": 1, "duplicate": 7}
    counts = receiver.counts()
    assert (counts["deliveries"], counts["cases"], counts["occurrences"], counts["work"]) == (1, 1, 1, 1)
    assert len(receiver.sender.sent) == 1


def test_8_events_of_one_new_failure_at_once_are_all_recorded_on_one_case(
    receiver: Receiver, captured: Captured
) -> None:
    """Different deliveries racing to create the same case: none may be lost as a "duplicate"."""
    bodies = [captured.event(captured.value_error).body() for _ in range(8)]

    responses = _at_once(receiver, bodies)

    assert Counter(r.json()["outcome"] for r in responses) == {"accepted": 1, "recorded": 7}, [
        r.text for r in responses
    ]
    [case] = receiver.cases()
    assert case.occurrences == 8
    counts = receiver.counts()
    assert (counts["deliveries"], counts["occurrences"], counts["work"]) == (8, 8, 1)
    assert len(receiver.sender.sent) == 1
