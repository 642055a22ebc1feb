"""The real receiver (`create_app` over SQLite and an in-memory broker) served by uvicorn on loopback,
for the tests that send to it as a CI job does: the plugin, ``notify`` and ``doctor``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from flaketriage.orchestrator.app import create_app
from flaketriage.orchestrator.service import Service
from flaketriage.records import Database, Delivery
from flaketriage.settings import load_settings
from flaketriage.work.dispatch import MemorySender

SERVICE_SECRET = "live-service-secret"


@dataclass
class LiveService:
    base: str
    store: Path
    """The one store the service reads."""
    service: Service

    @property
    def events_url(self) -> str:
        return f"{self.base}/v1/events"

    @property
    def quarantine_url(self) -> str:
        return f"{self.base}/v1/quarantine"

    def deliveries(self) -> int:
        """Deliveries the service recorded."""
        with self.service.database.session() as session:
            return session.scalars(select(func.count()).select_from(Delivery)).one()


@contextmanager
def served(app: Any) -> Iterator[str]:
    """Serve `app` with uvicorn on a free loopback port, in a thread; yields its base URL."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the receiver did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def live_service(root: Path, **overrides: Any) -> Iterator[LiveService]:
    """Serve a receiver whose store is ``root/service-store``; `overrides` are its settings."""
    store = root / "service-store"
    store.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {
        "store": str(store),
        "webhook_secret": SERVICE_SECRET,
        "database_url": f"sqlite:///{root / 'service.db'}",
    } | overrides
    settings = load_settings(**options)
    database = Database(settings.resolved_database_url())
    database.upgrade()
    service = Service.assemble(settings, database, MemorySender())
    try:
        with served(create_app(service)) as base:
            yield LiveService(base, store, service)
    finally:
        service.close()
