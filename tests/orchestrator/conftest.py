"""Fixtures for the receiver: a real database (SQLite in tmp_path, PostgreSQL in a database of this
session's own), real bundles captured by the real CLI, and the app driven in-process (TestClient)
with an in-memory broker (`MemorySender`)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from httpx2 import Response
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event as sa_event
from sqlalchemy import func, select

from flaketriage.bundle.io import load_manifest
from flaketriage.bundle.manifest import Manifest
from flaketriage.events import FailureEvent, StoreLocation
from flaketriage.orchestrator.app import create_app
from flaketriage.orchestrator.service import Service
from flaketriage.records import Base, Case, Database, Delivery, Occurrence, Work
from flaketriage.settings import load_settings
from flaketriage.signing import signed_headers
from flaketriage.store import open_store
from flaketriage.work.dispatch import MemorySender

EVENTS_SECRET = b"events-secret"
GITHUB_SECRET = b"github-secret"
SENTRY_SECRET = b"sentry-client-secret"
PAYLOADS = Path(__file__).with_name("payloads")
_CI_VARS = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "JENKINS_URL", "CIRCLECI")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings come from the tests only, never from the machine running them."""
    for name in list(os.environ):
        if name.startswith("FLAKETRIAGE_"):
            monkeypatch.delenv(name)


def row_counts(database: Database) -> dict[str, int]:
    """Rows in every table of the schema."""
    with database.engine.connect() as conn:
        return {
            table.name: conn.execute(select(func.count()).select_from(table)).scalar_one()
            for table in Base.metadata.sorted_tables
        }


# -- real bundles ---------------------------------------------------------------------------------
FAIL_PY = """\
def load(batch):
    raise ValueError(f"bad batch {batch}")


def main():
    load(7)


main()
"""

KEY_PY = """\
def column(name):
    return {"loss": 1.0}[name]


column("accuracy")
"""


@dataclass(frozen=True)
class Captured:
    """A project whose programs failed under ``flaketriage capture``; its store is ``.flaketriage``."""

    project: Path
    value_error: str
    """``fail.py``: ValueError('bad batch 7') raised in load(), called by main()."""
    value_error_again: str
    """``fail.py`` captured a second time: another bundle, the same fingerprint."""
    key_error: str
    """``key.py``: KeyError('accuracy')."""

    @property
    def store(self) -> Path:
        return self.project / ".flaketriage"

    def manifest(self, bundle_id: str) -> Manifest:
        return load_manifest(open_store(self.store, readonly=True), bundle_id)

    def event(self, bundle_id: str, **update: Any) -> FailureEvent:
        """A new event (fresh event id) for a bundle of this store."""
        event = FailureEvent.for_manifest(self.manifest(bundle_id), StoreLocation.parse(self.store))
        return event.model_copy(update=update) if update else event


def _capture(project: Path, script: str) -> str:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FLAKETRIAGE_", "GITHUB_")) and k not in _CI_VARS
    }
    done = subprocess.run(
        [sys.executable, "-m", "flaketriage", "capture", "--json", "--", sys.executable, script],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["error"] is None and report["bundle"], report
    return str(report["bundle"])


@pytest.fixture(scope="session")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Captured:
    project = tmp_path_factory.mktemp("project")
    (project / "fail.py").write_text(FAIL_PY)
    (project / "key.py").write_text(KEY_PY)
    return Captured(
        project=project,
        value_error=_capture(project, "fail.py"),
        value_error_again=_capture(project, "fail.py"),
        key_error=_capture(project, "key.py"),
    )


# -- the receiver ---------------------------------------------------------------------------------
@dataclass
class Receiver:
    """The app of one service, and ways to send it what each source sends."""

    service: Service
    sender: MemorySender
    app: FastAPI = field(init=False)

    def __post_init__(self) -> None:
        self.app = create_app(self.service)

    @cached_property
    def client(self) -> TestClient:
        return TestClient(self.app)

    @property
    def database(self) -> Database:
        return self.service.database

    def events_total(self, source: str, outcome: str) -> float:
        """The ``flaketriage_events_total`` counter of `source` and `outcome`, as /metrics shows it."""
        for family in text_string_to_metric_families(self.client.get("/metrics").text):
            for sample in family.samples:
                if sample.name == "flaketriage_events_total" and sample.labels == {
                    "source": source,
                    "outcome": outcome,
                }:
                    return float(sample.value)
        return 0.0

    # -- sending ----------------------------------------------------------------------------------
    def post_event(
        self, event: FailureEvent | bytes, *, secret: bytes = EVENTS_SECRET, **headers: str
    ) -> Response:
        body = event if isinstance(event, bytes) else event.body()
        signed = signed_headers(secret, body) | {"Content-Type": "application/json"} | headers
        return self.client.post("/v1/events", content=body, headers=signed)

    def github(
        self,
        event: str,
        payload: dict[str, Any] | bytes,
        *,
        delivery: str | None = None,
        secret: bytes = GITHUB_SECRET,
        omit: tuple[str, ...] = (),
        **headers: str,
    ) -> Response:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        sent = {
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/a1b2c3d",
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery or secrets.token_hex(16),
            "X-GitHub-Hook-ID": "292430182",
            "X-Hub-Signature-256": github_signature(secret, body),
        } | headers
        sent = {name: value for name, value in sent.items() if name not in omit}
        return self.client.post("/webhooks/github", content=body, headers=sent)

    def sentry(
        self,
        resource: str,
        payload: dict[str, Any] | bytes,
        *,
        request_id: str | None = None,
        secret: bytes = SENTRY_SECRET,
        omit: tuple[str, ...] = (),
        **headers: str,
    ) -> Response:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        sent = {
            "Content-Type": "application/json",
            "Request-ID": request_id or secrets.token_hex(16),
            "Sentry-Hook-Resource": resource,
            "Sentry-Hook-Timestamp": "1718031234",
            "Sentry-Hook-Signature": hmac.new(secret, body, hashlib.sha256).hexdigest(),
        } | headers
        sent = {name: value for name, value in sent.items() if name not in omit}
        return self.client.post("/webhooks/sentry", content=body, headers=sent)

    # -- looking ----------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        return row_counts(self.database)

    def cases(self) -> list[Case]:
        with self.database.session() as session:
            return list(session.scalars(select(Case).order_by(Case.id)).all())

    def works(self) -> list[Work]:
        with self.database.session() as session:
            return list(session.scalars(select(Work).order_by(Work.id)).all())

    def occurrences(self) -> list[Occurrence]:
        with self.database.session() as session:
            return list(session.scalars(select(Occurrence).order_by(Occurrence.id)).all())

    def deliveries(self) -> list[Delivery]:
        with self.database.session() as session:
            return list(session.scalars(select(Delivery).order_by(Delivery.id)).all())

    def update_case(self, case_id: int, **values: Any) -> None:
        with self.database.session() as session:
            case = session.get_one(Case, case_id)
            for name, value in values.items():
                setattr(case, name, value)


def github_signature(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


MakeReceiver = Callable[..., Receiver]


@pytest.fixture
def make_receiver(database: Database, captured: Captured) -> Iterator[MakeReceiver]:
    """Build a receiver on `database`; keyword arguments override its settings (or give ``sender``,
    ``database``)."""
    made: list[Receiver] = []

    def build(
        *, sender: MemorySender | None = None, database: Database = database, **overrides: Any
    ) -> Receiver:
        options: dict[str, Any] = {
            "store": str(captured.store),
            "webhook_secret": EVENTS_SECRET.decode(),
            "github_webhook_secret": GITHUB_SECRET.decode(),
            "sentry_client_secret": SENTRY_SECRET.decode(),
            "allowed_stores": [str(captured.store)],
            "max_body_kb": 64,
        }
        options.update(overrides)
        sender = sender if sender is not None else MemorySender()
        receiver = Receiver(Service.assemble(load_settings(**options), database, sender), sender)
        made.append(receiver)
        return receiver

    yield build
    for receiver in made:
        if "client" in receiver.__dict__:
            receiver.client.close()


@pytest.fixture
def receiver(make_receiver: MakeReceiver) -> Receiver:
    return make_receiver()


@pytest.fixture
def load_payload() -> Callable[[str], dict[str, Any]]:
    """Read a recorded webhook payload from ``payloads/`` (a fresh copy each time)."""

    def load(name: str) -> dict[str, Any]:
        data = json.loads((PAYLOADS / name).read_text(encoding="utf-8"))
        assert isinstance(data, dict)
        return data

    return load


BeforeStatement = Callable[[Database, str, Callable[[int | None], None]], None]


@pytest.fixture
def before_statement(monkeypatch: pytest.MonkeyPatch) -> Iterator[BeforeStatement]:
    """``before_statement(database, prefix, action)``: `action` runs before each statement whose
    text starts with `prefix`, where the driver gets it (a PostgreSQL transaction sends its
    statements around SQLAlchemy); it is given the PostgreSQL backend's process id (None on
    SQLite), and may raise as the driver would."""
    listening: list[tuple[Database, Callable[..., None]]] = []

    def install(database: Database, prefix: str, action: Callable[[int | None], None]) -> None:
        def matches(statement: object) -> bool:
            return str(statement).lstrip().upper().startswith(prefix.upper())

        if database.is_sqlite:

            def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
                if matches(statement):
                    action(None)

            sa_event.listen(database.engine, "before_cursor_execute", before)
            listening.append((database, before))
            return
        import psycopg

        for name in ("execute", "executemany"):
            original = getattr(psycopg.Cursor, name)

            def run(cursor: Any, query: Any, *args: Any, _original: Any = original, **kw: Any) -> Any:
                if matches(query):
                    action(cursor.connection.info.backend_pid)
                return _original(cursor, query, *args, **kw)

            monkeypatch.setattr(psycopg.Cursor, name, run)

    yield install
    for database, before in listening:
        sa_event.remove(database.engine, "before_cursor_execute", before)
