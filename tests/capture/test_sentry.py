"""Sentry: a real sentry_sdk client with a recording transport sees the captured bundle's tag."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from flaketriage.bundle.io import load_manifest
from flaketriage.capture.record import record_failure
from flaketriage.capture.sentry import TAG, after_capture, tag_bundle
from flaketriage.failure.fingerprint import fingerprint_failure
from flaketriage.store import LocalStore


class RecordingTransport(Transport):
    """Keeps envelopes instead of sending them: no network."""

    def __init__(self) -> None:
        super().__init__()
        self.envelopes: list[Envelope] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        self.envelopes.append(envelope)

    def events(self) -> list[dict[str, Any]]:
        return [item.payload.json for env in self.envelopes for item in env.items if item.type == "event"]


@pytest.fixture
def sentry() -> Iterator[RecordingTransport]:
    transport = RecordingTransport()
    sentry_sdk.init(
        dsn="https://public@sentry.example.invalid/1",
        transport=transport,
        default_integrations=False,
        auto_enabling_integrations=False,
    )
    try:
        with sentry_sdk.isolation_scope():
            yield transport
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.get_global_scope().set_client(None)


def _capture_in_process(tmp_path: Path) -> tuple[LocalStore, str]:
    stderr = (
        "Traceback (most recent call last):\n"
        f'  File "{tmp_path}/train.py", line 3, in <module>\n'
        "    step()\n"
        "FloatingPointError: loss is nan at step 12\n"
    )
    info = fingerprint_failure(exit_code=1, stdout="", stderr=stderr, roots=[str(tmp_path)])
    assert info is not None
    (tmp_path / "train.py").write_text("step()\n")
    store = LocalStore(tmp_path / "store")
    return store, record_failure(store, info, argv=[sys.executable, "train.py"], cwd=tmp_path)


def test_a_captured_bundle_tags_the_next_sentry_event(tmp_path: Path, sentry: RecordingTransport) -> None:
    store, bundle = _capture_in_process(tmp_path)
    load_manifest(store, bundle)
    sentry_sdk.capture_message("training diverged")
    sentry_sdk.flush()
    (event,) = sentry.events()
    assert event["message"] == "training diverged"
    assert event["tags"][TAG] == bundle


def test_without_an_active_client_nothing_is_tagged(tmp_path: Path) -> None:
    assert not sentry_sdk.get_client().is_active()
    assert tag_bundle("ab" * 32) is False
    _, bundle = _capture_in_process(tmp_path)  # the capture itself is unaffected
    assert len(bundle) == 64


def test_the_hook_does_not_import_sentry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "sentry_sdk")
    assert after_capture("cd" * 32) == "cd" * 32
    assert "sentry_sdk" not in sys.modules
