"""POST /webhooks/sentry with Sentry's integration payloads (``payloads/sentry_*.json``): an issue
alert for the exception a bundle captured lands on the bundle's case, a ``flaketriage.bundle.io`` tag
starts a triage, other resources are acknowledged and ignored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Captured, MakeReceiver, Receiver  # tests/orchestrator/conftest.py

Load = Callable[[str], dict[str, Any]]

SDK_SITE = '''\
"""Sentry initialised at interpreter start, as a service would; events go to a file, not a network."""
import json
import os

import sentry_sdk
from sentry_sdk.transport import Transport


class FileTransport(Transport):
    def capture_envelope(self, envelope):
        for item in envelope.items:
            if item.type == "event":
                with open(os.environ["SENTRY_EVENTS_FILE"], "a", encoding="utf-8") as out:
                    out.write(json.dumps(item.payload.json) + "\\n")


sentry_sdk.init(
    dsn="https://public@sentry.example.invalid/1",
    transport=FileTransport(),
    release="trainer@1.4.2",
    environment="production",
)
'''


def _alert(load_payload: Load, root: Path | str, **event: Any) -> dict[str, Any]:
    """The recorded issue alert for fail.py's ValueError, its frames under `root`."""
    data = load_payload("sentry_event_alert.triggered.json")
    sentry_event = data["data"]["event"]
    for frame in sentry_event["exception"]["values"][-1]["stacktrace"]["frames"]:
        frame["abs_path"] = f"{root}/{frame['filename']}"
    sentry_event.update(event)
    return data


def _tagged(data: dict[str, Any], bundle_id: str) -> dict[str, Any]:
    data["data"]["event"]["tags"].append(["flaketriage.bundle", bundle_id])
    return data


@pytest.mark.parametrize("root", ["project", "/srv/app"])
def test_an_alert_for_the_captured_exception_lands_on_the_bundles_case(
    receiver: Receiver, captured: Captured, load_payload: Load, root: str
) -> None:
    """In CI (the capture's directory) or deployed elsewhere: the same code path, the same case."""
    assert receiver.post_event(captured.event(captured.value_error)).status_code == 202
    [case] = receiver.cases()

    response = receiver.sentry(
        "event_alert", _alert(load_payload, captured.project if root == "project" else root)
    )

    assert response.status_code == 200, response.text
    assert response.json() == {"outcome": "recorded", "cases": [case.id], "work": [], "notes": []}
    [case] = receiver.cases()
    assert case.occurrences == 2 and case.kind == "bundle"
    sentry_occurrence = receiver.occurrences()[1]
    assert sentry_occurrence.source == "sentry"
    assert sentry_occurrence.provenance == {
        "source": "sentry",
        "event_id": "e4874d664c3540c1a32eab185f12c5ab",
        "web_url": "https://sentry.io/organizations/acme/issues/1170820242/events/e4874d664c3540c1a32eab185f12c5ab/",
        "release": "trainer@1.4.2",
        "environment": "production",
        "rule": "Errors in training jobs",
    }
    assert len(receiver.works()) == 1


def test_the_real_sdks_event_for_the_same_program_lands_on_the_same_case(
    receiver: Receiver, captured: Captured, load_payload: Load, tmp_path: Path
) -> None:
    """The exception as sentry_sdk reports it from the very program the capture ran."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SDK_SITE)
    events = tmp_path / "events.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "SENTRY_"))}
    env |= {"PYTHONPATH": str(tmp_path / "site"), "SENTRY_EVENTS_FILE": str(events)}
    run = subprocess.run(
        [sys.executable, "fail.py"],
        cwd=captured.project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and "ValueError: bad batch 7" in run.stderr, run.stderr
    [sdk_event] = [json.loads(line) for line in events.read_text().splitlines()]
    data = load_payload("sentry_event_alert.triggered.json")
    data["data"]["event"].update(exception=sdk_event["exception"], event_id=sdk_event["event_id"])
    receiver.post_event(captured.event(captured.value_error))

    response = receiver.sentry("event_alert", data)

    assert response.status_code == 200, response.text
    [case] = receiver.cases()
    assert response.json()["cases"] == [case.id]
    assert case.occurrences == 2


def test_an_alert_first_opens_a_sentry_case_that_the_bundle_then_triages(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    response = receiver.sentry("event_alert", _alert(load_payload, captured.project))

    assert response.status_code == 200 and response.json()["outcome"] == "recorded"
    [case] = receiver.cases()
    assert (case.kind, case.status) == ("sentry", "open")
    assert case.fingerprint == captured.manifest(captured.value_error).failure.fingerprint
    assert "ValueError: bad batch 7" in case.title
    assert receiver.works() == []

    event = receiver.post_event(captured.event(captured.value_error))

    assert event.status_code == 202
    assert event.json()["cases"] == [case.id]
    [case] = receiver.cases()
    assert (case.status, case.occurrences) == ("queued", 2)


def test_another_code_path_is_another_case(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    receiver.post_event(captured.event(captured.value_error))
    data = _alert(load_payload, captured.project)
    data["data"]["event"]["exception"]["values"][-1]["stacktrace"]["frames"][1]["function"] = "main_loop"

    response = receiver.sentry("event_alert", data)

    assert response.status_code == 200
    assert len(receiver.cases()) == 2


def test_a_bundle_tag_triages_that_bundle(receiver: Receiver, captured: Captured, load_payload: Load) -> None:
    data = load_payload("sentry_event_alert.triggered.json")
    data["data"]["event"]["exception"]["values"][-1].update(type="KeyError", value="'accuracy'")
    _tagged(data, captured.key_error)

    response = receiver.sentry("event_alert", data)

    assert response.status_code == 202, response.text
    sentry_case, bundle_case = receiver.cases()
    assert (sentry_case.kind, bundle_case.kind) == ("sentry", "bundle")
    [work] = receiver.works()
    assert (work.case_id, work.bundle_id) == (bundle_case.id, captured.key_error)
    assert receiver.occurrences()[1].provenance["event_id"] == "e4874d664c3540c1a32eab185f12c5ab"
    assert len(receiver.sender.sent) == 1


def test_a_tag_naming_the_alerts_own_failure_is_one_occurrence_and_one_triage(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    """flaketriage.capture.sentry tags the event of the very failure it captured: one case, seen once."""
    data = _tagged(_alert(load_payload, captured.project), captured.value_error)

    response = receiver.sentry("event_alert", data)

    assert response.status_code == 202, response.text
    [case] = receiver.cases()
    assert response.json()["cases"] == [case.id]
    assert case.occurrences == 1
    [occurrence] = receiver.occurrences()
    assert occurrence.bundle_id == captured.value_error
    [work] = receiver.works()
    assert work.bundle_id == captured.value_error


def test_a_tag_naming_a_missing_bundle_says_so(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    response = receiver.sentry("event_alert", _tagged(_alert(load_payload, captured.project), "e" * 64))

    assert response.status_code == 200
    assert "e" * 64 in response.json()["notes"][0]
    assert receiver.works() == []


def test_an_alert_with_neither_exception_nor_tag_is_a_422(receiver: Receiver, load_payload: Load) -> None:
    data = load_payload("sentry_event_alert.triggered.json")
    del data["data"]["event"]["exception"]

    response = receiver.sentry("event_alert", data)

    assert response.status_code == 422
    assert "exception" in response.json()["detail"]
    assert receiver.counts()["deliveries"] == 0


@pytest.mark.parametrize(
    ("resource", "name"),
    [
        ("metric_alert", "sentry_metric_alert.critical.json"),
        ("installation", "sentry_installation.created.json"),
    ],
)
def test_other_resources_are_ignored(
    receiver: Receiver, load_payload: Load, resource: str, name: str
) -> None:
    response = receiver.sentry(resource, load_payload(name))

    assert response.status_code == 200
    assert response.json()["outcome"] == "ignored"
    assert receiver.cases() == [] and receiver.sender.sent == []


def test_a_repeated_request_id_is_a_duplicate(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    data = _alert(load_payload, captured.project)
    assert (
        receiver.sentry("event_alert", data, request_id="3f5b9ab2-0d1b-4e88-a0c4-1b0e0f0a9c11").status_code
        == 200
    )
    counts = receiver.counts()

    again = receiver.sentry("event_alert", data, request_id="3f5b9ab2-0d1b-4e88-a0c4-1b0e0f0a9c11")

    assert again.status_code == 200 and again.json()["outcome"] == "duplicate"
    assert receiver.counts() == counts


def test_an_alert_sent_again_under_another_request_id_is_a_duplicate(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    # Sentry signs the body, not Request-ID: the same event's alert again is the same event.
    data = _tagged(_alert(load_payload, captured.project), captured.value_error)
    assert receiver.sentry("event_alert", data).status_code == 202
    counts, sent = receiver.counts(), list(receiver.sender.sent)

    again = receiver.sentry("event_alert", data, request_id="another-request")

    assert again.status_code == 200 and again.json()["outcome"] == "duplicate"
    assert receiver.counts() == counts and receiver.sender.sent == sent


def test_an_alert_for_another_event_of_the_issue_is_another_occurrence(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    assert receiver.sentry("event_alert", _alert(load_payload, captured.project)).status_code == 200

    response = receiver.sentry("event_alert", _alert(load_payload, captured.project, event_id="f" * 32))

    assert response.json()["outcome"] == "recorded"
    [case] = receiver.cases()
    assert case.occurrences == 2


def test_a_request_id_naming_an_alert_to_come_does_not_make_it_a_duplicate(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    data = _alert(load_payload, captured.project)
    event_id = data["data"]["event"]["event_id"]
    other = load_payload("sentry_metric_alert.critical.json")  # names nothing of its own
    assert receiver.sentry("metric_alert", other, request_id=f"event_alert:{event_id}").status_code == 200

    response = receiver.sentry("event_alert", data)

    assert response.json()["outcome"] == "recorded" and len(receiver.occurrences()) == 1


def _sentry_issue(action: str, **issue: Any) -> dict[str, Any]:
    """An ``issue`` webhook as Sentry sends it, for fail.py's ValueError."""
    fields = {
        "id": "1170820242",
        "title": "ValueError: bad batch 7",
        "metadata": {"type": "ValueError", "value": "bad batch 7", "filename": "fail.py", "function": "load"},
        "firstSeen": "2024-06-10T14:00:00Z",
        "lastSeen": "2024-06-10T14:00:00Z",
        "web_url": "https://sentry.io/organizations/acme/issues/1170820242/",
    }
    return {"action": action, "data": {"issue": fields | issue}, "actor": {"type": "application"}}


def test_an_issue_sent_again_is_a_duplicate_and_its_regression_is_not(receiver: Receiver) -> None:
    assert receiver.sentry("issue", _sentry_issue("created")).status_code == 200
    counts = receiver.counts()

    again = receiver.sentry("issue", _sentry_issue("created"), request_id="another-request")

    assert again.json()["outcome"] == "duplicate" and receiver.counts() == counts
    regressed = receiver.sentry("issue", _sentry_issue("unresolved", lastSeen="2024-06-12T08:00:00Z"))
    assert regressed.json()["outcome"] == "recorded"
    [case] = receiver.cases()
    assert case.occurrences == 2


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"secret": b"not-the-client-secret"}, 401),
        ({"omit": ("Sentry-Hook-Signature",)}, 401),
        ({"Sentry-Hook-Signature": "sha256=0"}, 401),
        ({"omit": ("Sentry-Hook-Resource",)}, 400),
    ],
    ids=["wrong-secret", "no-signature", "garbage-signature", "no-resource"],
)
def test_a_refused_delivery_writes_nothing(
    receiver: Receiver, captured: Captured, load_payload: Load, headers: dict[str, Any], status: int
) -> None:
    response = receiver.sentry("event_alert", _alert(load_payload, captured.project), **headers)

    assert response.status_code == status, response.text
    assert set(receiver.counts().values()) == {0}
    assert receiver.sender.sent == []


def test_an_unset_client_secret_refuses_every_delivery(
    make_receiver: MakeReceiver, load_payload: Load
) -> None:
    receiver = make_receiver(sentry_client_secret=None)

    response = receiver.sentry("installation", load_payload("sentry_installation.created.json"))

    assert response.status_code == 401
    assert "FLAKETRIAGE_SENTRY_CLIENT_SECRET" in response.json()["detail"]


def _set(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[last] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("data.event.tags", 5, "tags"),
        ("data.event.exception.values.0.stacktrace.frames", {"0": {}}, "frames"),
        ("data.event.exception.values.0.type", ["ValueError"], "type"),
    ],
)
def test_a_mistyped_field_is_a_422_naming_it(
    receiver: Receiver, captured: Captured, load_payload: Load, path: str, value: Any, field: str
) -> None:
    data = _set(_alert(load_payload, captured.project), path, value)

    response = receiver.sentry("event_alert", data)

    assert response.status_code == 422, response.text
    assert field in response.json()["detail"]
    assert set(receiver.counts().values()) == {0}


def test_an_exception_module_that_is_not_a_string_is_not_a_module(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    receiver.post_event(captured.event(captured.value_error))
    data = _set(_alert(load_payload, captured.project), "data.event.exception.values.0.module", ["builtins"])

    response = receiver.sentry("event_alert", data)

    assert response.status_code == 200, response.text
    assert len(receiver.cases()) == 1


@pytest.mark.parametrize(
    "tag",
    ["ab\x00cd" * 4, "/" * 64, "../" * 20, "e" * 65, "e" * 11, "g" * 12, "\u00ff" * 12, "x\ud800" * 8],
    ids=["nul", "slashes", "dot-dots", "too-long", "too-short", "not-hex", "latin-1", "lone-surrogate"],
)
def test_a_tag_that_is_not_a_bundle_id_is_a_422_before_any_store_is_opened(
    receiver: Receiver, captured: Captured, load_payload: Load, monkeypatch: pytest.MonkeyPatch, tag: str
) -> None:
    """A bundle is named by 12 to 64 hex digits: anything else never reaches the file system, and the
    answer names no path of the server's."""

    def no_store(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a store was opened for a tag that is not a bundle id")

    monkeypatch.setattr("flaketriage.orchestrator.sightings.open_store", no_store)
    data = _tagged(_alert(load_payload, captured.project), tag)

    response = receiver.sentry("event_alert", json.dumps(data).encode())

    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert "flaketriage.bundle" in detail and "12 to 64 hex digits" in detail
    assert str(captured.store) not in response.text and "/tmp" not in response.text
    assert receiver.counts()["deliveries"] == 0
