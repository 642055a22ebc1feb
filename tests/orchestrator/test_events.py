"""POST /v1/events: a signed ``failure.captured`` event becomes a case, an occurrence and one triage;
everything refused is refused before anything is written or sent; a database or broker that is down
is a 503 that leaves the records whole."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from httpx2 import Response
from sqlalchemy.exc import OperationalError

from flaketriage.records import Base, Database
from flaketriage.signing import signed_headers
from flaketriage.store import store_url
from flaketriage.work.dispatch import Dispatcher, MemorySender
from flaketriage.work.messages import WorkOrder

if TYPE_CHECKING:
    from conftest import BeforeStatement, Captured, MakeReceiver, Receiver  # tests/orchestrator/conftest.py

SECRET = b"events-secret"  # conftest.EVENTS_SECRET
EMPTY = dict.fromkeys((table.name for table in Base.metadata.sorted_tables), 0)
"""Every table of the schema, empty: a refused event writes to none of them."""


def test_a_signed_event_becomes_a_case_an_occurrence_and_one_triage(
    receiver: Receiver, captured: Captured
) -> None:
    event = captured.event(captured.value_error)

    response = receiver.post_event(event)

    assert response.status_code == 202, response.text
    body = response.json()
    assert body["outcome"] == "accepted"
    assert receiver.counts() == EMPTY | {"cases": 1, "deliveries": 1, "occurrences": 1, "work": 1}
    [case] = receiver.cases()
    [work] = receiver.works()
    [occurrence] = receiver.occurrences()
    assert body["cases"] == [case.id] and body["work"] == [work.id]
    assert (case.fingerprint, case.kind, case.status, case.occurrences) == (
        captured.manifest(captured.value_error).failure.fingerprint,
        "bundle",
        "queued",
        1,
    )
    assert "ValueError: bad batch 7" in case.title
    assert (work.step, work.status, work.case_id, work.bundle_id) == (
        "triage",
        "queued",
        case.id,
        captured.value_error,
    )
    assert work.store_url == store_url(captured.store)
    assert (occurrence.source, occurrence.delivery_id, occurrence.bundle_id) == (
        "events",
        event.event_id,
        captured.value_error,
    )
    assert receiver.sender.sent == [("flaketriage.triage", WorkOrder(work_id=work.id), "cpu")]


def test_the_same_event_again_is_a_duplicate_that_writes_and_sends_nothing(
    receiver: Receiver, captured: Captured
) -> None:
    event = captured.event(captured.value_error)
    assert receiver.post_event(event).status_code == 202
    counts, sent = receiver.counts(), list(receiver.sender.sent)

    again = receiver.post_event(event)

    assert again.status_code == 200
    assert again.json() == {"outcome": "duplicate", "cases": [], "work": [], "notes": []}
    assert receiver.counts() == counts
    assert receiver.sender.sent == sent


def test_the_same_body_signed_again_later_is_a_duplicate(receiver: Receiver, captured: Captured) -> None:
    # What the sender's retry (or a captured body signed again) sends: the signature is fresh, the
    # body's event_id is not.
    body = captured.event(captured.value_error).body()
    assert receiver.post_event(body).status_code == 202
    counts, sent = receiver.counts(), list(receiver.sender.sent)

    again = receiver.post_event(body, **signed_headers(SECRET, body, now=time.time() + 120))

    assert again.status_code == 200 and again.json()["outcome"] == "duplicate"
    assert receiver.counts() == counts and receiver.sender.sent == sent


def test_an_event_id_again_with_another_failure_is_a_duplicate_that_writes_nothing(
    receiver: Receiver, captured: Captured
) -> None:
    first = captured.event(captured.value_error)
    assert receiver.post_event(first).status_code == 202
    counts, sent = receiver.counts(), list(receiver.sender.sent)

    other = captured.event(captured.key_error, event_id=first.event_id)
    again = receiver.post_event(other)

    assert again.json() == {"outcome": "duplicate", "cases": [], "work": [], "notes": []}
    assert receiver.counts() == counts and receiver.sender.sent == sent
    assert [case.fingerprint for case in receiver.cases()] == [first.fingerprint]


# -- refused before anything is written ----------------------------------------------------------
def _body(captured: Captured, **changes: Any) -> bytes:
    """An event's JSON with fields changed (None: removed), re-serialized as the sender would."""
    data = json.loads(captured.event(captured.value_error).body())
    for name, value in changes.items():
        if value is None:
            data.pop(name)
        else:
            data[name] = value
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def _signed(body: bytes, *, secret: bytes = SECRET, now: float | None = None) -> dict[str, str]:
    return signed_headers(secret, body, now=now) | {"Content-Type": "application/json"}


def _post(receiver: Receiver, body: Any, headers: dict[str, str]) -> Response:
    return receiver.client.post("/v1/events", content=body, headers=headers)


Refusal = Callable[["Receiver", "Captured"], Response]


def _wrong_secret(r: Receiver, c: Captured) -> Response:
    body = c.event(c.value_error).body()
    return _post(r, body, _signed(body, secret=b"not-the-secret"))


def _no_signature(r: Receiver, c: Captured) -> Response:
    body = c.event(c.value_error).body()
    headers = _signed(body)
    del headers["X-Flaketriage-Signature"]
    return _post(r, body, headers)


def _no_timestamp(r: Receiver, c: Captured) -> Response:
    body = c.event(c.value_error).body()
    headers = _signed(body)
    del headers["X-Flaketriage-Timestamp"]
    return _post(r, body, headers)


def _no_headers(r: Receiver, c: Captured) -> Response:
    return _post(r, c.event(c.value_error).body(), {"Content-Type": "application/json"})


def _stale(r: Receiver, c: Captured) -> Response:
    body = c.event(c.value_error).body()
    return _post(r, body, _signed(body, now=time.time() - 3600))


def _from_the_future(r: Receiver, c: Captured) -> Response:
    body = c.event(c.value_error).body()
    return _post(r, body, _signed(body, now=time.time() + 3600))


def _body_changed_after_signing(r: Receiver, c: Captured) -> Response:
    body = c.event(c.value_error).body()
    changed = body.replace(b"bad batch 7", b"bad batch 8")
    assert changed != body
    return _post(r, changed, _signed(body))


def _too_large(r: Receiver, c: Captured) -> Response:
    body = _body(c, provenance={"host": "x" * 70_000})
    return _post(r, body, _signed(body))


def _too_large_chunked(r: Receiver, c: Captured) -> Response:
    body = _body(c, provenance={"host": "x" * 70_000})

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 4096):
            yield body[start : start + 4096]

    response = _post(r, chunks(), _signed(body))
    assert "content-length" not in response.request.headers  # sent chunked: only the stream tells
    return response


def _not_json(r: Receiver, c: Captured) -> Response:
    body = b'{"event_id": "abc", '
    return _post(r, body, _signed(body))


def _not_utf8(r: Receiver, c: Captured) -> Response:
    body = b'{"kind": "\xff\xfe"}'
    return _post(r, body, _signed(body))


def _a_list(r: Receiver, c: Captured) -> Response:
    body = b"[1, 2, 3]"
    return _post(r, body, _signed(body))


def _deeply_nested(r: Receiver, c: Captured) -> Response:
    body = b"[" * 30_000 + b"]" * 30_000
    return _post(r, body, _signed(body))


def _wrong_type(r: Receiver, c: Captured) -> Response:
    body = _body(c, bundle_id=12345)
    return _post(r, body, _signed(body))


def _unknown_field(r: Receiver, c: Captured) -> Response:
    body = _body(c, priority="high")
    return _post(r, body, _signed(body))


def _missing_field(r: Receiver, c: Captured) -> Response:
    body = _body(c, fingerprint=None)
    return _post(r, body, _signed(body))


def _store_not_allowed(r: Receiver, c: Captured) -> Response:
    body = _body(c, store={"kind": "local", "location": str(c.project / "elsewhere")})
    return _post(r, body, _signed(body))


def _store_dot_dot(r: Receiver, c: Captured) -> Response:
    body = _body(c, store={"kind": "local", "location": f"{c.store}/../other"})
    return _post(r, body, _signed(body))


def _store_with_nul(r: Receiver, c: Captured) -> Response:
    body = _body(c, store={"kind": "local", "location": f"{c.store}\x00"})
    return _post(r, body, _signed(body))


def _store_too_long(r: Receiver, c: Captured) -> Response:
    body = _body(c, store={"kind": "local", "location": "/" + "a" * 300})
    return _post(r, body, _signed(body))


def _memory_store(r: Receiver, c: Captured) -> Response:
    body = _body(c, store={"kind": "memory", "location": "memory://other"})
    return _post(r, body, _signed(body))


REFUSALS: list[tuple[Refusal, int, str]] = [
    (_wrong_secret, 401, "does not match"),
    (_no_signature, 401, "X-Flaketriage-Signature"),
    (_no_timestamp, 401, "X-Flaketriage-Timestamp"),
    (_no_headers, 401, "header"),
    (_stale, 401, "ago"),
    (_from_the_future, 401, "future"),
    (_body_changed_after_signing, 401, "does not match"),
    (_too_large, 413, "64 KiB"),
    (_too_large_chunked, 413, "64 KiB"),
    (_not_json, 400, "not JSON"),
    (_not_utf8, 400, "not JSON"),
    (_a_list, 400, "JSON object"),
    (_deeply_nested, 400, "JSON"),
    (_wrong_type, 422, "bundle_id"),
    (_unknown_field, 422, "priority"),
    (_missing_field, 422, "fingerprint"),
    (_store_not_allowed, 422, "elsewhere"),
    (_store_dot_dot, 422, "allowed"),
    (_store_with_nul, 422, "store"),
    (_store_too_long, 422, "store"),
    (_memory_store, 422, "memory://other"),
]


@pytest.mark.parametrize(("send", "status", "detail"), REFUSALS, ids=lambda x: getattr(x, "__name__", None))
def test_a_refused_event_writes_nothing_and_sends_nothing(
    receiver: Receiver, captured: Captured, send: Refusal, status: int, detail: str
) -> None:
    before = receiver.counts()

    response = send(receiver, captured)

    assert response.status_code == status, response.text
    assert detail in response.json()["detail"]
    assert receiver.counts() == before == EMPTY
    assert receiver.sender.sent == []


def test_the_body_limit_is_exact(receiver: Receiver, captured: Captured) -> None:
    """A body of exactly max_body_kb KiB is read (and refused only for what it says), one byte more is 413."""
    base = _body(captured, provenance={"host": ""})
    pad = 64 * 1024 - len(base)
    at_limit = _body(captured, provenance={"host": "x" * pad})
    assert len(at_limit) == 64 * 1024

    assert _post(receiver, at_limit, _signed(at_limit)).status_code == 202
    over = _body(captured, provenance={"host": "x" * (pad + 1)})
    assert _post(receiver, over, _signed(over)).status_code == 413
    assert receiver.counts()["deliveries"] == 1


def test_an_unset_secret_refuses_every_event(make_receiver: MakeReceiver, captured: Captured) -> None:
    receiver = make_receiver(webhook_secret=None)
    body = captured.event(captured.value_error).body()

    response = _post(receiver, body, _signed(body))

    assert response.status_code == 401
    assert "FLAKETRIAGE_WEBHOOK_SECRET" in response.json()["detail"]
    assert receiver.counts() == EMPTY and receiver.sender.sent == []


def test_refusals_are_counted_by_outcome(receiver: Receiver, captured: Captured) -> None:
    _wrong_secret(receiver, captured)
    _unknown_field(receiver, captured)
    _store_not_allowed(receiver, captured)

    text = receiver.client.get("/metrics").text

    for outcome in ("bad_signature", "invalid", "store_refused"):
        assert f'flaketriage_events_total{{outcome="{outcome}",source="events"}} 1.0' in text


def test_text_with_nul_characters_is_recorded_on_every_backend(
    receiver: Receiver, captured: Captured
) -> None:
    """PostgreSQL text cannot hold NUL; a message that has one is still a failure to record, not a 503."""
    event = captured.event(captured.value_error)
    failure = event.failure.model_copy(update={"message": "bad\x00batch", "test_id": "tests/t.py::t\x00"})
    event = event.model_copy(update={"failure": failure, "fingerprint": "\x00f\x00"})
    again = event.model_copy(update={"event_id": uuid.uuid4().hex})

    response = receiver.post_event(event)
    second = receiver.post_event(again)

    assert response.status_code == 202, response.text
    assert second.status_code in (200, 202), second.text
    [case] = receiver.cases()  # the same fingerprint, NUL and all, is the same case
    assert "\x00" not in case.title and "\x00" not in (case.test_id or "")
    assert case.fingerprint == "\ufffdf\ufffd" and case.occurrences == 2


def test_a_long_run_url_is_recorded(receiver: Receiver, captured: Captured) -> None:
    """The repository is read from the run URL; a long one must not overflow its column."""
    event = captured.event(captured.value_error)
    provenance = event.provenance.model_copy(
        update={"run_url": f"https://github.com/{'o' * 150}/{'r' * 150}/actions/runs/1"}
    )

    response = receiver.post_event(event.model_copy(update={"provenance": provenance}))

    assert response.status_code == 202, response.text


# -- the database or the broker is down ----------------------------------------------------------
def _unreachable(database: Database, tmp_path: Path) -> Database:
    """A database of the same backend that cannot be reached."""
    if database.is_sqlite:
        (tmp_path / "a-directory").mkdir()
        return Database(f"sqlite:///{tmp_path / 'a-directory'}")
    return Database("postgresql://postgres@127.0.0.1:1/nothing")


def test_an_unreachable_database_is_a_503_and_nothing_is_sent(
    make_receiver: MakeReceiver, database: Database, captured: Captured, tmp_path: Path
) -> None:
    down = _unreachable(database, tmp_path)
    receiver = make_receiver(database=down)

    response = receiver.post_event(captured.event(captured.value_error))

    assert response.status_code == 503
    assert "retry" in response.json()["detail"]
    assert receiver.sender.sent == []
    metrics = receiver.client.get("/metrics").text
    assert 'flaketriage_events_total{outcome="database_down",source="events"} 1.0' in metrics
    ready = receiver.client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["database"] != "ok"
    down.dispose()


def test_a_503_names_what_is_down_only_to_the_api_tokens_holder(
    make_receiver: MakeReceiver, captured: Captured
) -> None:
    """A 503's detail would name the database's user, host, port and name: an unauthenticated
    caller (a signed sender, or anyone on the reads when no token is set) reads only that it is
    down; the token's holder, as on /readyz, reads what failed."""
    down = Database("postgresql://secret_user@127.0.0.1:1/secret_db")
    public = make_receiver(database=down)
    guarded = make_receiver(database=down, api_token="the-token")

    answers = [
        public.post_event(captured.event(captured.value_error)),
        public.client.get("/v1/cases"),
        guarded.client.get("/v1/cases", headers={"Authorization": "Bearer wrong"}),
    ]
    detailed = guarded.client.get("/v1/cases", headers={"Authorization": "Bearer the-token"})

    for response in answers:
        assert response.status_code in (401, 503), response.text
        assert "secret_" not in response.text and "127.0.0.1" not in response.text, response.text
    assert answers[0].status_code == answers[1].status_code == 503
    assert "retry" in answers[0].json()["detail"]
    assert detailed.status_code == 503 and "secret_db" in detailed.json()["detail"], detailed.text
    down.dispose()


def test_a_database_failing_mid_transaction_leaves_nothing_half_recorded(
    make_receiver: MakeReceiver, database: Database, captured: Captured, before_statement: BeforeStatement
) -> None:
    receiver = make_receiver()
    event = captured.event(captured.value_error)
    failing = True

    def fail(pid: int | None) -> None:
        if not failing:
            return
        if pid is None:
            raise OperationalError("INSERT INTO work", {}, Exception("disk I/O error"))
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    before_statement(database, "INSERT INTO work", fail)
    response = receiver.post_event(event)

    assert response.status_code == 503, response.text
    assert receiver.counts() == EMPTY
    assert receiver.sender.sent == []
    # The sender retries the same event once the database is back: it is new, not a duplicate.
    failing = False
    again = receiver.post_event(event)
    assert again.status_code == 202 and again.json()["outcome"] == "accepted"
    assert receiver.counts() == EMPTY | {"cases": 1, "deliveries": 1, "occurrences": 1, "work": 1}


def test_a_postgresql_connection_killed_mid_transaction_is_a_503(
    make_receiver: MakeReceiver,
    postgres_database: Database,
    postgres_url: str,
    captured: Captured,
    before_statement: BeforeStatement,
) -> None:
    """The server really drops the connection (pg_terminate_backend) while the case is half-written."""
    database = postgres_database
    receiver = make_receiver(database=database)
    event = captured.event(captured.value_error)
    killing = True

    def kill(pid: int | None) -> None:
        if killing:
            with psycopg.connect(postgres_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    before_statement(database, "INSERT INTO work", kill)
    response = receiver.post_event(event)

    assert response.status_code == 503, response.text
    killing = False
    assert receiver.counts() == EMPTY
    assert receiver.sender.sent == []
    assert receiver.post_event(event).status_code == 202


def test_a_broker_that_is_down_is_a_503_and_the_sweep_sends_the_recorded_work(
    make_receiver: MakeReceiver, database: Database, captured: Captured
) -> None:
    sender = MemorySender(fail=True)
    receiver = make_receiver(sender=sender)
    event = captured.event(captured.value_error)

    response = receiver.post_event(event)

    assert response.status_code == 503
    assert "broker" in response.json()["detail"]
    assert receiver.counts() == EMPTY | {"cases": 1, "deliveries": 1, "occurrences": 1, "work": 1}
    [work] = receiver.works()
    assert work.status == "queued"
    assert sender.sent == []
    assert receiver.client.get("/readyz").json()["broker"] != "ok"
    metrics = receiver.client.get("/metrics").text
    assert 'flaketriage_events_total{outcome="broker_down",source="events"} 1.0' in metrics

    sender.fail = False
    # The sender's retry is a duplicate: the work is already recorded, the sweep sends it.
    assert receiver.post_event(event).json()["outcome"] == "duplicate"
    assert sender.sent == []
    assert Dispatcher(database, sender, sweep_after_s=300).sweep() == 0
    assert Dispatcher(database, sender, sweep_after_s=0).sweep() == 1
    assert sender.sent == [("flaketriage.triage", WorkOrder(work_id=work.id), "cpu")]


def test_the_receiver_logs_one_line_per_request_with_its_delivery_outcome_and_cases(
    receiver: Receiver, captured: Captured, caplog: pytest.LogCaptureFixture
) -> None:
    event = captured.event(captured.value_error)
    body = event.body()
    with caplog.at_level(logging.INFO, logger="flaketriage.receiver"):
        accepted = _post(receiver, body, _signed(body))
        again = _post(receiver, body, _signed(body))  # the same delivery, sent again
        _wrong_secret(receiver, captured)
        _store_not_allowed(receiver, captured)
    lines = [r.getMessage() for r in caplog.records if r.name == "flaketriage.receiver"]
    assert len(lines) == 4, lines
    event_id = json.loads(body)["event_id"]
    cases = accepted.json()["cases"]
    assert lines[0] == f"events delivery {event_id}: accepted; cases {cases}; work {accepted.json()['work']}"
    assert again.json()["outcome"] == "duplicate"
    assert lines[1] == f"events delivery {event_id}: duplicate; cases none; work none"  # recorded once
    assert lines[2].startswith("events delivery -: refused 401 (bad_signature): ")
    assert "refused 422 (store_refused): " in lines[3] and "elsewhere" in lines[3]
    assert [r.levelno for r in caplog.records if r.name == "flaketriage.receiver"] == [20, 20, 30, 30]


def test_served_the_receivers_lines_are_written_beside_uvicorns() -> None:
    import subprocess
    import sys

    code = (
        "import logging, logging.config; from flaketriage.orchestrator.server import log_config;"
        "logging.config.dictConfig(log_config('info'));"
        "logging.getLogger('flaketriage.receiver').info('events delivery d1: accepted; cases [1]; work [2]')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "events delivery d1: accepted; cases [1]; work [2]" in done.stderr
