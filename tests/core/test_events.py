"""The event message: canonical body, strict schema, and how it is built from a manifest."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from flaketriage.bundle.manifest import Failure, Manifest, Provenance
from flaketriage.events import MAX_MESSAGE_CHARS, FailureEvent, StoreLocation


def _event(make_manifest: Callable[..., Manifest], **overrides: object) -> FailureEvent:
    manifest = make_manifest(provenance=Provenance(ci_provider="github-actions", job="test", attempt="2"))
    event = FailureEvent.for_manifest(manifest, StoreLocation(kind="s3", location="s3://bucket/ft"))
    return event.model_copy(update=overrides) if overrides else event


def test_for_manifest_carries_the_bundle_and_its_failure(make_manifest: Callable[..., Manifest]) -> None:
    manifest = make_manifest()
    event = FailureEvent.for_manifest(manifest, StoreLocation.parse("s3://bucket/ft/"))
    assert event.kind == "failure.captured" and event.schema_version == 1
    assert event.bundle_id == manifest.bundle_id
    assert event.fingerprint == manifest.failure.fingerprint
    assert event.failure.exception_type == "ZeroDivisionError"
    assert event.failure.message == "division by zero"
    assert event.command == ("python", "train.py")
    assert event.store == StoreLocation(kind="s3", location="s3://bucket/ft")
    assert event.provenance == manifest.provenance
    assert len(event.event_id) == 32
    assert event.event_id != FailureEvent.for_manifest(manifest, event.store).event_id


def test_body_is_canonical_and_round_trips(make_manifest: Callable[..., Manifest]) -> None:
    event = _event(make_manifest)
    body = event.body()
    data = json.loads(body)
    assert list(data) == sorted(data)
    assert body == json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    again = FailureEvent.model_validate_json(body)
    assert again == event and again.body() == body
    assert data["provenance"]["job"] == "test" and data["store"]["kind"] == "s3"


def test_unknown_fields_and_versions_are_refused(make_manifest: Callable[..., Manifest]) -> None:
    data = json.loads(_event(make_manifest).body())
    with pytest.raises(ValidationError, match="extra"):
        FailureEvent.model_validate({**data, "surprise": 1})
    with pytest.raises(ValidationError, match="schema_version"):
        FailureEvent.model_validate({**data, "schema_version": 2})
    with pytest.raises(ValidationError, match="event_id"):
        FailureEvent.model_validate({**data, "event_id": "not-a-uuid"})
    with pytest.raises(ValidationError, match="bundle_id"):
        FailureEvent.model_validate({**data, "bundle_id": "abc"})
    with pytest.raises(ValidationError, match="kind"):
        FailureEvent.model_validate({**data, "store": {"kind": "ftp", "location": "x"}})


def test_long_messages_are_cut(make_manifest: Callable[..., Manifest]) -> None:
    failure = Failure(
        kind="exception",
        exception_type="AssertionError",
        message="x" * 50_000,
        fingerprint="f",
        signature="s",
    )
    event = FailureEvent.for_manifest(make_manifest(failure=failure), StoreLocation.parse("/tmp/store"))
    assert event.failure.message is not None
    assert len(event.failure.message) == MAX_MESSAGE_CHARS and event.failure.message.endswith("…")


def test_store_location_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert StoreLocation.parse("s3://b/p") == StoreLocation(kind="s3", location="s3://b/p")
    assert StoreLocation.parse("shared/store") == StoreLocation(
        kind="local", location=str(tmp_path / "shared" / "store")
    )
