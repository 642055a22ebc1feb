"""Text the database cannot hold (lone surrogates, NUL, NaN and infinities), through every write route and
on both databases: recorded safely or refused with a 4xx, never a 5xx, never an outage; and whatever the
records already hold (rows written before this was so) is answered by every read."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
import sqlalchemy.exc
from httpx2 import Response
from sqlalchemy import text

from flaketriage.records import Database

if TYPE_CHECKING:
    from conftest import BeforeStatement, Captured, Receiver  # tests/orchestrator/conftest.py

Load = Callable[[str], dict[str, Any]]
Send = Callable[["Receiver", "Captured", Load, str], Response]

LONE = "x\ud800y"
NUL = "x\x00y"
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


# -- what each route is sent ----------------------------------------------------------------------
def _event(receiver: Receiver, captured: Captured, where: str, value: Any) -> Response:
    data = json.loads(captured.event(captured.value_error).body())
    section, _, name = where.rpartition(".")
    (data[section] if section else data)[name] = value
    # ensure_ascii (the default): a lone surrogate travels as its escape, as JSON allows.
    return receiver.post_event(json.dumps(data).encode())


def _event_field(where: str) -> Send:
    def send(r: Receiver, c: Captured, _load: Load, value: str) -> Response:
        return _event(r, c, where, value)

    send.__name__ = f"event_{where}"
    return send


def _event_command(r: Receiver, c: Captured, _load: Load, value: str) -> Response:
    """A command argument with bytes that were not UTF-8 travels as `OsStr`'s marked escape and is a
    lone surrogate again once read: legitimate, and what the case's title is made of."""
    marked = "\x00" + value.replace("\ud800", "\\udcff")
    return _event(r, c, "command", [marked, "--batch", value])


def _workflow_name(r: Receiver, _c: Captured, load: Load, value: str) -> Response:
    data = load("github_workflow_run.completed.json")
    data["workflow_run"]["name"] = value
    return r.github("workflow_run", json.dumps(data).encode())


def _check_name(r: Receiver, _c: Captured, load: Load, value: str) -> Response:
    data = load("github_check_run.completed.json")
    data["check_run"]["name"] = value
    return r.github("check_run", json.dumps(data).encode())


def _sentry_alert(load: Load, **event: Any) -> dict[str, Any]:
    data = load("sentry_event_alert.triggered.json")
    data["data"]["event"].update(event)
    return data


def _sentry_value(r: Receiver, _c: Captured, load: Load, value: str) -> Response:
    data = _sentry_alert(load)
    data["data"]["event"]["exception"]["values"][-1]["value"] = value
    return r.sentry("event_alert", json.dumps(data).encode())


def _sentry_title(r: Receiver, _c: Captured, load: Load, value: str) -> Response:
    return r.sentry("event_alert", json.dumps(_sentry_alert(load, title=value)).encode())


ROUTES: list[tuple[str, Send]] = [
    ("events", _event_field("provenance.host")),
    ("events", _event_field("provenance.job")),
    ("events", _event_field("provenance.run_url")),
    ("events", _event_field("failure.test_id")),
    ("events", _event_field("failure.message")),
    ("events", _event_command),
    ("github", _workflow_name),
    ("github", _check_name),
    ("sentry", _sentry_value),
    ("sentry", _sentry_title),
]


def _answered_and_readable(receiver: Receiver, response: Response, source: str) -> None:
    assert response.status_code in (200, 202, 422), response.text
    assert receiver.events_total(source, "database_down") == 0
    for case_id in response.json().get("cases", []):
        read = receiver.client.get(f"/v1/cases/{case_id}")
        assert read.status_code == 200, read.text
    assert receiver.client.get("/v1/cases").status_code == 200


@pytest.mark.parametrize("value", [LONE, NUL], ids=["lone-surrogate", "nul"])
@pytest.mark.parametrize(("source", "send"), ROUTES, ids=[send.__name__.strip("_") for _, send in ROUTES])
def test_text_the_database_cannot_hold_is_recorded_safely_on_every_route(
    receiver: Receiver, captured: Captured, load_payload: Load, source: str, send: Send, value: str
) -> None:
    response = send(receiver, captured, load_payload, value)

    assert response.status_code in (200, 202), response.text
    _answered_and_readable(receiver, response, source)
    for case in receiver.cases():
        for column in (case.title, case.test_id, case.job, case.fingerprint):
            assert column is None or not UNSTORABLE.search(column)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("field", ["event_id", "web_url"])
def test_nan_and_infinity_in_a_sentry_payload_are_no_outage(
    receiver: Receiver, load_payload: Load, field: str, number: str
) -> None:
    """Python's JSON reader takes them; neither PostgreSQL's json nor a JSON answer can hold them."""
    body = json.dumps(_sentry_alert(load_payload, **{field: "@"})).replace('"@"', number).encode()

    response = receiver.sentry("event_alert", body)

    _answered_and_readable(receiver, response, "sentry")
    assert response.status_code == 200, response.text
    [occurrence] = receiver.occurrences()
    assert field not in occurrence.provenance  # no number, as the payload's null would be


# -- what the records already hold ----------------------------------------------------------------
@pytest.mark.parametrize(
    "stored",
    [
        '{"host": "a\\ud800b", "nested": ["\\udfff"]}',
        '{"host": "a\\u0000b"}',
        '{"host": NaN, "n": -Infinity}',
    ],
    ids=["lone-surrogate", "nul", "nan"],
)
def test_a_case_whose_stored_json_holds_unencodable_text_is_answered(
    receiver: Receiver, captured: Captured, database: Database, stored: str
) -> None:
    """Rows written before the intake made text storable: every read answers them (U+FFFD, null)."""
    [case_id] = receiver.post_event(captured.event(captured.value_error)).json()["cases"]
    if not database.is_sqlite and "NaN" in stored:
        # PostgreSQL's json type refuses NaN, so no row of it can hold one: nothing to read back.
        with pytest.raises(sqlalchemy.exc.DataError), database.engine.begin() as conn:
            conn.execute(text("UPDATE occurrences SET provenance = :p"), {"p": stored})
        return
    with database.engine.begin() as conn:
        conn.execute(text("UPDATE occurrences SET provenance = :p"), {"p": stored})
        conn.execute(text("UPDATE cases SET evidence = :p"), {"p": stored})
        conn.execute(text("UPDATE work SET result = :p"), {"p": stored})

    read = receiver.client.get(f"/v1/cases/{case_id}")

    assert read.status_code == 200, read.text
    body = read.json()
    host = body["occurrence_list"][0]["provenance"]["host"]
    assert host in ("a\ufffdb", "a\x00b", None)
    assert body["evidence"]["host"] == host and body["triage_runs"][0]["result"]["host"] == host
    assert receiver.client.get("/v1/cases").status_code == 200


# -- a value the database refuses is the request's fault -------------------------------------------
def test_a_value_the_database_refuses_is_a_422_not_an_outage(
    receiver: Receiver, captured: Captured, database: Database, before_statement: BeforeStatement
) -> None:
    """Whatever slips past the intake: the database's data error (PostgreSQL's class 22, SQLite's
    encoding error) is answered 422 and counted as invalid; retrying it would fail alike."""

    def refuse(pid: int | None) -> None:
        if pid is None:
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        raise psycopg.errors.UntranslatableCharacter("unsupported Unicode escape sequence")

    before_statement(database, "INSERT INTO cases", refuse)
    response = receiver.post_event(captured.event(captured.value_error))

    assert response.status_code == 422, response.text
    assert "could not be stored" in response.json()["detail"]
    assert receiver.events_total("events", "invalid") == 1
    assert receiver.events_total("events", "database_down") == 0
    assert receiver.counts()["deliveries"] == 0 and receiver.sender.sent == []
