"""Every route of the app's own OpenAPI document, fuzzed in-process by schemathesis: no input is a
server error, and every answer is one the document describes (status, media type, body schema).

Write routes get bodies signed with the right secret, so the fuzzing reaches the parsers and the
intake instead of stopping at the signature (refusals of bad signatures are tested elsewhere)."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import checks

from flaketriage.orchestrator.app import create_app
from flaketriage.orchestrator.service import Service
from flaketriage.records import Database
from flaketriage.settings import load_settings
from flaketriage.signing import signed_headers
from flaketriage.work.dispatch import MemorySender

if TYPE_CHECKING:
    from conftest import Captured, Receiver  # tests/orchestrator/conftest.py

EVENTS_SECRET = b"events-secret"  # the secrets of conftest.make_receiver
GITHUB_SECRET = b"github-secret"
SENTRY_SECRET = b"sentry-client-secret"
GITHUB_EVENTS = ("workflow_run", "check_run", "issues", "issue_comment")
SENTRY_RESOURCES = ("event_alert", "issue")


def _document_app() -> Any:
    """An app to read the OpenAPI document from: never connected, never called."""
    settings = load_settings(store="/nonexistent/.flaketriage", webhook_secret="unused")
    return create_app(Service.assemble(settings, Database("sqlite://"), MemorySender()))


# The document is read once, at collection; each case is sent to the test's own app (`app=`).
schema = schemathesis.openapi.from_asgi("/openapi.json", _document_app())


def _raw(case: Any, store: Path) -> bytes:
    """The body as it goes out, so that the signature is over those bytes. An event naming a store
    names the allowed one, or the store policy would refuse every generated event before the intake."""
    body = case.body
    if isinstance(body, bytes):
        return body
    if type(body).__name__ == "NotSet":
        return b""
    if case.path == "/v1/events" and isinstance(body, dict) and isinstance(body.get("store"), dict):
        body["store"] = {"kind": "local", "location": str(store)}
    return json.dumps(body).encode("utf-8")


def _signed(case: Any, store: Path) -> dict[str, Any]:
    """Transport arguments that sign the case's body for its route (none for the read routes), and
    name an event the route handles when the case has none."""
    if case.method.upper() != "POST":
        return {}
    raw = _raw(case, store)
    given = {name.lower() for name in case.headers or {}}
    if case.path == "/v1/events":
        headers = signed_headers(EVENTS_SECRET, raw)
    elif case.path == "/webhooks/github":
        headers = {
            "X-Hub-Signature-256": "sha256=" + hmac.new(GITHUB_SECRET, raw, hashlib.sha256).hexdigest()
        }
        if "x-github-event" not in given:
            headers["X-GitHub-Event"] = GITHUB_EVENTS[len(raw) % len(GITHUB_EVENTS)]
        if "x-github-delivery" not in given:
            headers["X-GitHub-Delivery"] = hashlib.sha256(raw).hexdigest()[:36]
    else:
        headers = {"Sentry-Hook-Signature": hmac.new(SENTRY_SECRET, raw, hashlib.sha256).hexdigest()}
        if "sentry-hook-resource" not in given:
            headers["Sentry-Hook-Resource"] = SENTRY_RESOURCES[len(raw) % len(SENTRY_RESOURCES)]
    return {"headers": headers, "data": raw}


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_is_a_server_error_and_every_answer_is_documented(
    case: Any, receiver: Receiver, captured: Captured
) -> None:
    response = case.call(app=receiver.app, **_signed(case, captured.store))

    case.validate_response(
        response,
        checks=[
            checks.not_a_server_error,
            checks.status_code_conformance,
            checks.content_type_conformance,
            checks.response_schema_conformance,
        ],
    )


# -- GitHub's and Sentry's payloads, mangled ------------------------------------------------------
PAYLOADS = Path(__file__).with_name("payloads")
ROUTES = {
    "github_workflow_run.completed.json": ("github", "workflow_run"),
    "github_check_run.completed.json": ("github", "check_run"),
    "github_issues.labeled.json": ("github", "issues"),
    "github_issue_comment.created.json": ("github", "issue_comment"),
    "github_ping.json": ("github", "ping"),
    "sentry_event_alert.triggered.json": ("sentry", "event_alert"),
    "sentry_metric_alert.critical.json": ("sentry", "metric_alert"),
    "sentry_installation.created.json": ("sentry", "installation"),
}
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document: dict keys and list indices, parents before children."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_paths(item, (*prefix, index)))
    return found


def _replaced(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(document))
    parent = copy
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    return copy


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_a_mangled_payload_is_never_a_server_error(receiver: Receiver, captured: Captured, name: str) -> None:
    """Any one field of a real payload replaced by any JSON: a 2xx or a 422, never a 500 or a 503."""
    original = json.loads((PAYLOADS / name).read_text())
    if name.startswith("sentry_event_alert"):
        frames = original["data"]["event"]["exception"]["values"][-1]["stacktrace"]["frames"]
        for frame in frames:
            frame["abs_path"] = f"{captured.project}/{frame['filename']}"
        original["data"]["event"]["tags"].append(["flaketriage.bundle", captured.value_error])
    if name.startswith("github_check_run"):
        original["check_run"]["output"]["text"] = f"flaketriage-bundle: {captured.key_error}"
    source, event = ROUTES[name]
    places = _paths(original)[1:]  # not the root: a body that is not an object is a 400

    @given(place=st.sampled_from(places), value=json_values)
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    def mangle(place: tuple[Any, ...], value: Any) -> None:
        payload = _replaced(original, place, value)
        if source == "github":
            response = receiver.github(event, json.dumps(payload).encode())
        else:
            response = receiver.sentry(event, json.dumps(payload).encode())
        assert response.status_code in (200, 202, 422), (place, value, response.text)

    mangle()


def test_every_reference_in_the_document_resolves(receiver: Receiver) -> None:
    """Fuzzers (and client generators) drop what they cannot resolve: a body behind a broken $ref
    is a body nobody tests."""
    document = receiver.client.get("/openapi.json").json()
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    assert refs
    for ref in refs:
        assert ref.startswith("#/"), ref
        node = document
        for part in ref[2:].split("/"):
            assert part in node, f"{ref} does not resolve"
            node = node[part]
    body = document["paths"]["/v1/events"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/FailureEvent"}
    event = document["components"]["schemas"]["FailureEvent"]
    assert set(event["required"]) >= {"bundle_id", "fingerprint", "failure", "store", "provenance"}
