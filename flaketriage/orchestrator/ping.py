"""``POST /v1/ping``: a signed no-op. It tells a sender (``flaketriage doctor``) that the URL is the
service's, that its secret signs as the service's does, and whether the service reads the store its
events would name. Nothing is recorded, nothing is queued.

The request is signed exactly as an event is (`flaketriage.signing`, with
``FLAKETRIAGE_WEBHOOK_SECRET``), so a wrong secret is refused here with the 401 an event would get.
"""

from __future__ import annotations

import time
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from flaketriage import __version__
from flaketriage.errors import PayloadError, SignatureError, StoreNotAllowed
from flaketriage.events import StoreLocation
from flaketriage.orchestrator.api_models import Problem
from flaketriage.orchestrator.request_body import read_body
from flaketriage.orchestrator.sightings import StorePolicy
from flaketriage.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, check_headers, verify

PING_PATH = "/v1/ping"
MAX_PING_BYTES = 16 * 1024


class Ping(BaseModel):
    """The ping's body: the store the sender's events would name (optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["ping"] = "ping"
    store: StoreLocation | None = None


class StoreAnswer(BaseModel):
    """Whether the service reads the store the ping named."""

    location: str
    allowed: bool
    detail: str | None = None


class Pong(BaseModel):
    """The answer to a ping whose signature is right."""

    status: Literal["ok"] = "ok"
    version: str = __version__
    store: StoreAnswer | None = None
    allowed_stores: list[str]


def answer_ping(body: bytes, policy: StorePolicy) -> Pong:
    """The answer to a signed ping's `body`; raises `PayloadError` when it is not a ping."""
    try:
        ping = Ping.model_validate_json(body or b"{}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise PayloadError(f"not a ping: {where}: {first.get('msg', 'invalid')}") from None
    store = None
    if ping.store is not None:
        try:
            store = StoreAnswer(location=policy.check(ping.store.location), allowed=True)
        except StoreNotAllowed as exc:
            store = StoreAnswer(location=ping.store.location, allowed=False, detail=str(exc))
    return Pong(store=store, allowed_stores=list(policy.allowed))


def add_ping_route(app: FastAPI, secret: bytes, policy: StorePolicy, body_timeout_s: float) -> None:
    """Serve ``POST /v1/ping`` on `app`, checked with the events' `secret` against `policy`; its
    body is read within `body_timeout_s` (the app answers `BodyRefused`)."""

    @app.post(
        PING_PATH,
        response_model=Pong,
        responses={
            400: {"model": Problem, "description": "not a ping"},
            401: {"model": Problem, "description": "missing, wrong or stale signature"},
            413: {"model": Problem, "description": "body too large"},
        },
    )
    async def ping(request: Request) -> JSONResponse:
        """A signed no-op: 200 when the signature is right, with whether the service reads the
        store the body names (``{"store": {"kind": "local", "location": "/abs/path"}}``)."""
        timestamp = request.headers.get(TIMESTAMP_HEADER)
        signature = request.headers.get(SIGNATURE_HEADER)
        unread = {"Connection": "close"}  # refused before the body is read: the connection closes
        if not secret:
            detail = "events are refused: FLAKETRIAGE_WEBHOOK_SECRET is not set"
            return JSONResponse({"detail": detail}, status_code=401, headers=unread)
        try:
            check_headers(timestamp, signature, now=time.time())
        except SignatureError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=401, headers=unread)
        raw = await read_body(
            request, limit=MAX_PING_BYTES, timeout_s=body_timeout_s, too_large="a ping is at most 16 KiB"
        )
        try:
            verify(secret, timestamp, raw, signature, now=time.time())
        except SignatureError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=401)
        try:
            pong = answer_ping(raw, policy)
        except PayloadError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=400)
        return JSONResponse(pong.model_dump(mode="json"))
