"""``POST /v1/ping``: the signed no-op that ``flaketriage doctor`` sends; nothing is recorded."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from flaketriage.events import StoreLocation
from flaketriage.signing import signed_headers
from tests.orchestrator.conftest import EVENTS_SECRET

if TYPE_CHECKING:
    from httpx2 import Response

    from tests.orchestrator.conftest import Captured, MakeReceiver, Receiver

pytestmark = pytest.mark.parametrize("database", ["sqlite"], indirect=True)


def _ping(receiver: Receiver, body: bytes, secret: bytes = EVENTS_SECRET, **headers: str) -> Response:
    signed = signed_headers(secret, body) | {"Content-Type": "application/json"} | headers
    return receiver.client.post("/v1/ping", content=body, headers=signed)


def _store_ping(location: str) -> bytes:
    store = StoreLocation.parse(location).model_dump()
    return json.dumps({"kind": "ping", "store": store}).encode()


def test_a_signed_ping_is_answered_and_records_nothing(receiver: Receiver, captured: Captured) -> None:
    before = receiver.counts()
    answer = _ping(receiver, _store_ping(str(captured.store)))
    assert answer.status_code == 200, answer.text
    pong = answer.json()
    assert pong["status"] == "ok" and pong["store"]["allowed"] is True
    assert pong["store"]["location"] == captured.store.as_uri()
    assert pong["allowed_stores"] == [captured.store.as_uri()]
    assert receiver.counts() == before and receiver.sender.sent == []


def test_an_empty_ping_is_answered(receiver: Receiver) -> None:
    answer = _ping(receiver, b"")
    assert answer.status_code == 200 and answer.json()["store"] is None


def test_a_store_the_service_does_not_read_is_named(receiver: Receiver, tmp_path: object) -> None:
    answer = _ping(receiver, _store_ping(f"{tmp_path}/.flaketriage"))
    assert answer.status_code == 200
    store = answer.json()["store"]
    assert store["allowed"] is False and "FLAKETRIAGE_ALLOWED_STORES" in store["detail"]


def test_a_wrong_or_missing_signature_is_401(receiver: Receiver) -> None:
    wrong = _ping(receiver, b"{}", secret=b"not-the-secret")
    assert wrong.status_code == 401 and "FLAKETRIAGE_WEBHOOK_SECRET" in wrong.json()["detail"]
    unsigned = receiver.client.post("/v1/ping", content=b"{}")
    assert unsigned.status_code == 401


def test_a_service_without_a_secret_refuses_pings(make_receiver: MakeReceiver) -> None:
    receiver = make_receiver(webhook_secret=None)
    answer = _ping(receiver, b"{}")
    assert answer.status_code == 401
    assert answer.json()["detail"] == "events are refused: FLAKETRIAGE_WEBHOOK_SECRET is not set"


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[1]", b'{"kind": "event"}', b'{"store": {"kind": "local", "location": "rel"}}', b"\xff"],
)
def test_a_body_that_is_not_a_ping_is_400(receiver: Receiver, body: bytes) -> None:
    answer = _ping(receiver, body)
    assert answer.status_code == 400 and answer.json()["detail"].startswith("not a ping")


def test_a_large_ping_is_413(receiver: Receiver) -> None:
    assert _ping(receiver, b"{" + b" " * 20_000 + b"}").status_code == 413
