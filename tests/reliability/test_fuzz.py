"""The receiver under hostile requests, on SQLite and PostgreSQL: schemathesis's requests from the
served OpenAPI document and real GitHub, Sentry and flaketriage payloads with hostile values
(`hostile.requests`), every one signed correctly so it reaches the parsers and the database.

What each request must keep (`probe.Probe`): no 5xx and no crash, no row written when it is
refused or a duplicate, and every case stored readable through ``GET /v1/cases`` and
``GET /v1/cases/{id}``. The inputs that broke a promise before (`hostile.known`) are sent every
run; the rest is derandomized, so the suite is the same every run. ``bench/reliability.py`` sends
10,000 and more, drawn at random.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from tests.reliability.hostile import Request, Sources, from_case, known, openapi_schema, requests
from tests.reliability.probe import EVENT_ID, Probe

if TYPE_CHECKING:
    from tests.orchestrator.conftest import Captured, Receiver

EXAMPLES = 200
"""Requests per backend: a few seconds each on a loaded 2-core machine."""
fuzzing = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


schema = openapi_schema()


def sources(captured: Captured) -> Sources:
    """The payloads to mutate, naming the captured bundles."""
    event = json.loads(captured.event(captured.value_error, event_id=EVENT_ID).body())
    bundles = (captured.value_error, captured.key_error)
    return Sources(event=event, bundles=bundles, project=str(captured.project))


def probe(receiver: Receiver) -> Probe:
    return Probe(TestClient(receiver.app, raise_server_exceptions=False), receiver.database)


KNOWN = (
    "event timestamp of 4,301 digits",
    "event text with NUL and lone surrogates",
    "sentry timestamp of 4,301 digits",
    "sentry bundle tag with a NUL",
    "sentry text with NUL and lone surrogates",
    "sentry numbers NaN",
    "sentry numbers Infinity",
    "workflow run text with NUL and lone surrogates",
    "check run naming 700 different bundles",
    "check run naming one bundle 700 times",
    "event delivered again with another body",
    "workflow run delivered again with another body",
    "sentry alert delivered again with another body",
)
"""`hostile.known`'s names, spelled out so that each is a test of its own."""


def test_known_inputs_are_listed(captured: Captured) -> None:
    assert set(known(sources(captured))) == set(KNOWN)


@pytest.mark.parametrize("name", KNOWN)
def test_a_known_hostile_input_breaks_no_promise(receiver: Receiver, captured: Captured, name: str) -> None:
    """Each of the inputs fuzzing found (or that broke the receiver before), every run."""
    checker = probe(receiver)
    for request in known(sources(captured))[name]:
        problems = checker.send(request)
        assert not problems, "\n".join(map(str, problems))
    assert checker.readable() == []


def test_no_hostile_request_breaks_a_promise(receiver: Receiver, captured: Captured) -> None:
    checker = probe(receiver)

    @given(request=requests(sources(captured)))
    @fuzzing
    def send(request: Request) -> None:
        problems = checker.send(request)
        assert not problems, "\n".join(map(str, problems))

    send()
    assert checker.sent >= EXAMPLES
    assert checker.readable() == []
    assert receiver.counts()["cases"] > 0  # the fuzzing reached the intake, not only the parsers


@schema.include(path_regex="^/(v1/events|webhooks/)").parametrize()
@settings(
    max_examples=30, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
)
def test_no_request_from_the_document_breaks_a_promise(
    case: Any, receiver: Receiver, captured: Captured
) -> None:
    """Schemathesis's requests for the write routes, from the OpenAPI document the app serves."""
    checker = probe(receiver)
    problems = checker.send(from_case(case, str(captured.store)))
    assert not problems, "\n".join(map(str, problems))
    assert checker.readable() == []
