"""A failure's case identity in the manifest and in the event: added within schema 3 and left out while
None, so a manifest or an event written before it is the same bytes (the same bundle id, the same
signed body) and reads as its fingerprint's; one that has it keeps it; a malformed one is refused."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from flaketriage.bundle.manifest import Command, Environment, Failure, Manifest
from flaketriage.errors import BundleError
from flaketriage.events import FailureEvent, StoreLocation
from flaketriage.failure.fingerprint import exception_identity, fingerprint_exception

IDENTITY = "a" * 64


def _manifest(identity: str | None = None) -> Manifest:
    return Manifest(
        created_at=datetime(2026, 12, 1, tzinfo=UTC),
        kind="test",
        command=Command(argv=("python", "-m", "pytest", "--", "t.py::t"), cwd="/w"),
        failure=Failure(
            kind="test", fingerprint="f" * 64, signature="pytest|t.py::t|ValueError|x", identity=identity
        ),
        environment=Environment(python="3.12", implementation="CPython", platform="linux", machine="x86_64"),
    )


def test_a_manifest_without_an_identity_re_encodes_as_before_and_is_its_fingerprints() -> None:
    manifest = _manifest()
    raw = manifest.canonical_json()

    assert b'"identity"' not in raw
    read = Manifest.from_json(raw)
    assert read.canonical_json() == raw and read.bundle_id == manifest.bundle_id
    assert read.failure.case_identity == "f" * 64


def test_a_manifest_with_an_identity_keeps_it() -> None:
    manifest = _manifest(IDENTITY)

    read = Manifest.from_json(manifest.canonical_json())

    assert read.failure.identity == read.failure.case_identity == IDENTITY
    assert read.bundle_id == manifest.bundle_id != _manifest().bundle_id


@pytest.mark.parametrize("identity", ["A" * 64, "a" * 63, "../../x", "", 7, ["a" * 64]], ids=repr)
def test_a_malformed_identity_is_a_bundle_error_naming_it(identity: object) -> None:
    data = json.loads(_manifest(IDENTITY).canonical_json())
    data["failure"]["identity"] = identity

    with pytest.raises(BundleError, match=r"failure\.identity"):
        Manifest.from_json(json.dumps(data).encode())


def test_an_event_carries_the_identity_and_leaves_it_out_while_none() -> None:
    store = StoreLocation(kind="local", location="/srv/store")
    old, new = (
        FailureEvent.for_manifest(_manifest(), store),
        FailureEvent.for_manifest(_manifest(IDENTITY), store),
    )

    assert "identity" not in json.loads(old.body())
    assert FailureEvent.model_validate_json(old.body()).case_identity == "f" * 64
    assert json.loads(new.body())["identity"] == IDENTITY
    assert FailureEvent.model_validate_json(new.body()).case_identity == IDENTITY
    with pytest.raises(ValidationError, match="identity"):
        FailureEvent.model_validate_json(new.body().replace(IDENTITY.encode(), b"not-an-identity"))


def test_an_exception_identity_is_the_exceptions_fingerprint_and_none_without_frames() -> None:
    frames = [("/w/t.py", "test_x"), ("/w/m.py", "load")]

    assert exception_identity("ValueError", "bad 7", frames, ["/w"]) == (
        fingerprint_exception("ValueError", "bad 7", frames, ["/w"]).fingerprint
    )
    assert exception_identity("ValueError", "bad", [], ["/w"]) is None
    assert exception_identity("", "bad", frames, ["/w"]) is None
