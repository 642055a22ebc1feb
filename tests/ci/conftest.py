"""Fixtures for the ci tests: a real event receiver, and real captured bundles."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.ci import notify
from flaketriage.ci.outbox import Outbox
from flaketriage.errors import SignatureError
from flaketriage.events import FailureEvent
from flaketriage.settings import Settings
from flaketriage.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from flaketriage.store import LocalStore

SECRET = b"test-webhook-secret"
_CI_VARS = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "JENKINS_URL", "CIRCLECI")


# -- a real receiver ----------------------------------------------------------------------------
@dataclass
class Receiver:
    """What the service will do at POST /v1/events: verify, validate, dedupe by event_id."""

    url: str
    secret: bytes
    events: list[FailureEvent] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    script: list[tuple[int, dict[str, str]] | tuple[int, dict[str, str], str]] = field(default_factory=list)
    """Responses to give, in order, before answering normally: status, headers (and body)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def event_ids(self) -> list[str]:
        return [e.event_id for e in self.events]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        rec = self.server.receiver
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with rec.lock:
            rec.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
            scripted = rec.script.pop(0) if rec.script else None
        if scripted is not None:
            return self._answer(*scripted)
        if self.path != "/v1/events":
            return self._answer(404)
        try:
            verify(
                rec.secret,
                self.headers.get(TIMESTAMP_HEADER),
                body,
                self.headers.get(SIGNATURE_HEADER),
                now=time.time(),
            )
        except SignatureError as exc:
            return self._answer(401, body=str(exc))
        try:
            event = FailureEvent.model_validate_json(body)
        except ValidationError:
            return self._answer(422, body="not a valid event")
        with rec.lock:
            if event.event_id not in rec.event_ids():
                rec.events.append(event)
        return self._answer(202)

    def _answer(self, status: int, headers: dict[str, str] | None = None, body: str = "") -> None:
        raw = body.encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    receiver: Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.receiver = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}/v1/events", secret=SECRET)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.receiver
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def dead_url() -> str:
    """A URL where nothing listens: connections are refused."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()
    return f"http://127.0.0.1:{port}/v1/events"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No FLAKETRIAGE_ settings and no CI variables from the machine running the tests."""
    for name in list(os.environ):
        if name.startswith("FLAKETRIAGE_") or name in _CI_VARS or name.startswith("GITHUB_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Waits of 10 ms between attempts; records the attempt numbers."""
    attempts: list[int] = []

    def delay(attempt: int, backoff_s: float, rng: object = None) -> float:
        attempts.append(attempt)
        return 0.01

    monkeypatch.setattr(notify, "backoff_delay", delay)
    return attempts


# -- real bundles: two captures (an exit, an exception), copied into each test's store ------------
@dataclass
class Project:
    root: Path
    store: LocalStore
    bundles: list[str]
    """Oldest first."""
    secret: bytes = SECRET

    def settings(self, url: str | None, secret: bytes | None = None) -> Settings:
        """Settings for this store; `secret` overrides the project's (b"": none)."""
        secret = self.secret if secret is None else secret
        return Settings(store=self.store.root, notify_url=url, webhook_secret=SecretStr(secret.decode()))

    @property
    def outbox(self) -> Outbox:
        return Outbox(self.store.root / "outbox")


@pytest.fixture(scope="session")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A store holding two real captured bundles, oldest first."""
    root = tmp_path_factory.mktemp("captured")
    (root / "project").mkdir()
    (root / "project" / "train.py").write_text("raise SystemExit(3)\n")
    env = {k: v for k, v in os.environ.items() if k not in _CI_VARS and not k.startswith("GITHUB_")}
    store = LocalStore(root / "store")
    ids = []
    for code in ("raise SystemExit(3)", "raise ValueError('bad batch 7')"):
        request = CaptureRequest(
            argv=[sys.executable, "-c", code],
            cwd=root / "project",
            limits=SourceLimits.from_settings(Settings()),
            echo=False,
            env=env,
        )
        result = run_and_capture(store, request)
        assert result.bundle_id is not None
        ids.append(result.bundle_id)
    return root / "store", ids


@pytest.fixture
def project(tmp_path: Path, captured: tuple[Path, list[str]]) -> Project:
    shutil.copytree(captured[0], tmp_path / ".flaketriage")
    return Project(tmp_path, LocalStore(tmp_path / ".flaketriage"), list(captured[1]))
