"""Signing in to the dashboard in tests as a browser does: the sign-in page read for its form token,
the form posted, the cookies kept by the client; and every row of the database, to show that a
refused request changed nothing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from httpx2 import Response
from sqlalchemy import select

from flaketriage.orchestrator.app import create_app
from flaketriage.orchestrator.service import Service
from flaketriage.records import Base, Database
from flaketriage.settings import load_settings
from flaketriage.work.dispatch import MemorySender
from tests.orchestrator.dashboard.conftest import Dashboard

TOKEN = "dashboard-token-" + "k" * 24
SECRET = "dashboard-secret-" + "s" * 32
_CSRF = re.compile(r'name="csrf_token" value="([^"]*)"')


def make_dashboard(database: Database, tmp_path: Path, **overrides: Any) -> Dashboard:
    """A receiver's app over `database` with a dashboard token and secret (`overrides` on top), and
    a client that does not follow redirects (the tests read them)."""
    options: dict[str, Any] = {
        "store": str(tmp_path / "store"),
        "webhook_secret": "dashboard-webhook-secret",
        "dashboard_token": TOKEN,
        "dashboard_secret": SECRET,
    } | overrides
    service = Service.assemble(load_settings(**options), database, MemorySender())
    return Dashboard(service, client(service))


def client(service: Service, **options: Any) -> TestClient:
    """Another browser on the same app (its own cookies)."""
    return TestClient(create_app(service), follow_redirects=False, **options)


def csrf_of(html: str) -> str:
    """The form token of a page (the first form's)."""
    found = _CSRF.search(html)
    assert found is not None, "the page has no form token"
    return found.group(1)


def sign_in(
    browser: TestClient, *, name: str = "alice", token: str = TOKEN, next_path: str | None = None
) -> Response:
    """Post the token form as a person does: the sign-in page first, for its form token."""
    page = browser.get("/dashboard/login")
    assert page.status_code == 200, page.text
    form = {"csrf_token": csrf_of(page.text), "name": name, "token": token}
    if next_path is not None:
        form["next"] = next_path
    return browser.post("/dashboard/login", data=form)


def signed_in(service: Service, name: str = "alice") -> TestClient:
    browser = client(service)
    answer = sign_in(browser, name=name)
    assert answer.status_code == 303, answer.text
    return browser


def page_token(browser: TestClient, path: str = "/dashboard/login") -> str:
    """The form token a page gives this browser (its session's, once signed in)."""
    return csrf_of(browser.get(path).text)


def rows(database: Database) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in a stable order."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with database.engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            found = [tuple(row) for row in conn.execute(select(table))]
            out[table.name] = sorted(found, key=repr)
    return out
