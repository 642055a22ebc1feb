"""Sending hostile requests to a receiver and checking what it promises about each: never a server
error or a crash, nothing written for a refused (4xx) or duplicate delivery, and every case it
stored readable afterwards (``GET /v1/cases`` and ``GET /v1/cases/{id}``, 200)."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from flaketriage.records import Base, Database
from flaketriage.signing import TIMESTAMP_HEADER, signed_headers
from tests.reliability.hostile import Request

EVENTS_SECRET = b"events-secret"  # the secrets of tests/orchestrator/conftest.make_receiver
GITHUB_SECRET = b"github-secret"
SENTRY_SECRET = b"sentry-client-secret"
EVENT_ID = "e" * 32
"""The event id of the event a strategy mutates: replaced by a fresh one (or the last one) when sent."""
DELIVERY_HEADERS = {"/webhooks/github": "X-GitHub-Delivery", "/webhooks/sentry": "Request-ID"}


def row_counts(database: Database) -> dict[str, int]:
    """Rows in every table of the schema."""
    with database.engine.connect() as conn:
        return {
            table.name: conn.execute(select(func.count()).select_from(table)).scalar_one()
            for table in Base.metadata.sorted_tables
        }


@dataclass
class Problem:
    """A broken promise: which, and the request that broke it."""

    kind: str
    """``5xx``, ``crash``, ``rows on refusal`` or ``unreadable case``."""
    detail: str
    request: Request | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" + (f"\n  after {self.request!r}" if self.request else "")


@dataclass
class Probe:
    """Sends requests through `client` to a receiver on `database`; counts them."""

    client: TestClient
    database: Database
    sent: int = 0
    last_ids: dict[str, str] = field(default_factory=dict)
    _ids: Iterator[int] = field(default_factory=itertools.count)

    def send(self, request: Request) -> list[Problem]:
        """Send `request`, signed for its route; the promises it broke."""
        body, headers = self._signed(request)
        before = row_counts(self.database)
        self.sent += 1
        try:
            response = self.client.post(request.route, content=body, headers=headers)
        except Exception as exc:  # the app raised instead of answering
            return [Problem("crash", f"{type(exc).__name__}: {exc}"[:500], request)]
        problems = []
        if response.status_code >= 500:
            problems.append(Problem("5xx", f"{response.status_code} {response.text[:300]}", request))
        answer = _json(response.text)
        outcome = answer.get("outcome") if isinstance(answer, dict) else None
        if 400 <= response.status_code < 500 or outcome == "duplicate":
            after = row_counts(self.database)
            if after != before:
                changed = {t: (before[t], after[t]) for t in after if after[t] != before[t]}
                problems.append(
                    Problem(
                        "rows on refusal", f"{response.status_code} {outcome or ''} wrote {changed}", request
                    )
                )
        if response.status_code < 300 and isinstance(answer, dict):
            problems += [Problem(p.kind, p.detail, request) for p in self._read(answer.get("cases") or [])]
        return problems

    def readable(self) -> list[Problem]:
        """Every stored case read through the API: the list, then each case."""
        listed = self.client.get("/v1/cases", params={"limit": 1000})
        if listed.status_code != 200:
            return [Problem("unreadable case", f"GET /v1/cases: {listed.status_code} {listed.text[:300]}")]
        return self._read([case["id"] for case in listed.json()])

    def _read(self, ids: list[Any]) -> list[Problem]:
        problems = []
        for case_id in ids:
            answer = self.client.get(f"/v1/cases/{case_id}")
            if answer.status_code != 200:
                detail = f"GET /v1/cases/{case_id}: {answer.status_code} {answer.text[:300]}"
                problems.append(Problem("unreadable case", detail))
        return problems

    def _signed(self, request: Request) -> tuple[bytes, dict[str, str]]:
        headers = {"Content-Type": "application/json", **request.headers}
        body = request.body
        if request.route == "/v1/events":
            fresh = self._delivery(request)
            body = body.replace(f'"{EVENT_ID}"'.encode(), f'"{fresh}"'.encode())
            timestamp = headers.pop(TIMESTAMP_HEADER, None)
            headers |= signed_headers(EVENTS_SECRET, body)
            if timestamp is not None:  # a hostile timestamp: the signature no longer matters
                headers[TIMESTAMP_HEADER] = timestamp
        elif request.route == "/webhooks/github":
            headers.setdefault("X-GitHub-Delivery", self._delivery(request))
            headers["X-Hub-Signature-256"] = (
                "sha256=" + hmac.new(GITHUB_SECRET, body, hashlib.sha256).hexdigest()
            )
        else:
            headers.setdefault("Request-ID", self._delivery(request))
            headers.setdefault("Sentry-Hook-Timestamp", "1718031234")
            headers["Sentry-Hook-Signature"] = hmac.new(SENTRY_SECRET, body, hashlib.sha256).hexdigest()
        return body, headers

    def _delivery(self, request: Request) -> str:
        """A fresh delivery id for the route (counted, so a run is the same every time), or its
        last one when the request repeats it."""
        if not (request.repeat and request.route in self.last_ids):
            self.last_ids[request.route] = f"{next(self._ids):032x}"
        return self.last_ids[request.route]


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
