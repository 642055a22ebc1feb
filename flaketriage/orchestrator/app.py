"""The receiver: FastAPI routes for events, GitHub and Sentry webhooks, cases, quarantine, health.

Every write route checks, in order: what the headers alone condemn (401 before the body is read: a
source whose secret is unset refuses everything, a signature header missing, our events' timestamp
malformed or stale), the body's size and time (413, 408), the signature over the exact bytes (401),
the JSON and its schema (400, 422 naming the field), the store an event names (422), then records
the delivery and its work and answers 202 once that is committed and handed to the broker (503 when
the database or the broker is down, so the sender retries; a repeated delivery is answered 200 and
does nothing). Bad input never gets a 500 and a value the database refuses as data is a 422, never
an outage; a body left unread is answered with the connection closed, and a client that hangs up
mid-body is one line in the log.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, NoReturn

import anyio.from_thread
import anyio.to_thread
from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from flaketriage import __version__
from flaketriage.errors import (
    BodyRefused,
    BrokerError,
    PayloadError,
    RecordsDataError,
    RecordsError,
    RequestRefusedError,
    SignatureError,
    StoreNotAllowed,
)
from flaketriage.events import FailureEvent
from flaketriage.orchestrator import github_hooks, sentry_hooks
from flaketriage.orchestrator.api_models import (
    Accepted,
    CaseDetail,
    CaseSummary,
    CaseVerdict,
    Health,
    Problem,
    ResultsAccepted,
    RunnerSummary,
    TestDetail,
    TestSummary,
)
from flaketriage.orchestrator.cases import CaseQuery, quarantine_document
from flaketriage.orchestrator.history import TestQuery, accept_results
from flaketriage.orchestrator.intake import IntakeOutcome, IntakeResult
from flaketriage.orchestrator.payloads import DELIVERY_KEY, Parsed
from flaketriage.orchestrator.ping import add_ping_route
from flaketriage.orchestrator.request_body import read_body
from flaketriage.orchestrator.runners import list_runners
from flaketriage.orchestrator.service import Service
from flaketriage.orchestrator.sightings import from_event
from flaketriage.quarantine import QuarantineDocument
from flaketriage.records import CaseStatus
from flaketriage.records.text import storable_json
from flaketriage.results.model import ResultsUpload
from flaketriage.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, check_headers, verify

MAX_ID = 2**31 - 1
"""The largest id an integer column holds (PostgreSQL ``integer``)."""

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "description": text}
    for code, text in (
        (400, "malformed request"),
        (401, "missing, wrong or stale signature (or token)"),
        (413, "body too large"),
        (422, "a field is missing or invalid"),
        (503, "database or broker unavailable: retry"),
    )
}


_SOURCES = {
    "/v1/events": "events",
    "/v1/results": "results",
    "/webhooks/github": "github",
    "/webhooks/sentry": "sentry",
}
"""The write routes, by the source label their deliveries are counted under."""


log = logging.getLogger("flaketriage.receiver")
"""One line per request: source, delivery id, outcome, case and work ids; refusals with why."""


class HTTPProblem(RequestRefusedError):
    """A refusal; `close` when the request's body is left unread (the connection is closed after)."""

    def __init__(self, status: int, detail: str, close: bool = False) -> None:
        self.status = status
        self.detail = detail
        self.close = close


def _problem(status: int, detail: str, close: bool = False) -> JSONResponse:
    headers = {"Connection": "close"} if close else None
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def create_app(service: Service) -> FastAPI:
    """The ASGI app of `service` (nothing is connected until a request comes)."""
    app = FastAPI(
        title="flaketriage",
        version=__version__,
        description="Receives failure events and webhooks, and serves cases and the quarantine list.",
    )
    settings = service.settings
    limit = settings.max_body_kb * 1024

    @app.exception_handler(HTTPProblem)
    async def _http_problem(_: Request, exc: HTTPProblem) -> JSONResponse:
        return _problem(exc.status, exc.detail, exc.close)

    @app.exception_handler(BodyRefused)
    async def _body_refused(request: Request, exc: BodyRefused) -> JSONResponse:
        log.warning("%s: refused %d: %s", request.url.path, exc.status, exc.detail)
        return _problem(exc.status, exc.detail, close=True)

    @app.exception_handler(ClientDisconnect)
    async def _hung_up(request: Request, _: ClientDisconnect) -> Response:
        # A client's doing, not the service's: one line, never a traceback anyone could fill the log with.
        log.info("%s: the client hung up before its body was read whole", request.url.path)
        return Response(status_code=400)  # sent nowhere: the connection is gone

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _problem(422, _validation_text(exc.errors()))

    def count(request: Request, outcome: str) -> None:
        source = _SOURCES.get(request.url.path)
        if source is not None:  # a delivery refused after its route: counted like the others
            service.metrics.events.labels(source, outcome).inc()

    @app.exception_handler(RecordsDataError)
    async def _records_refused(request: Request, exc: RecordsDataError) -> JSONResponse:
        # Not an outage: the same values would be refused again, so the sender must not retry.
        count(request, "invalid")
        log.warning("%s: 422, a value could not be stored: %s", request.url.path, exc)
        return _problem(
            422,
            f"the request holds a value that could not be stored ({exc}); nothing was recorded. "
            "Send text as valid Unicode and numbers as JSON numbers",
        )

    @app.exception_handler(RecordsError)
    async def _records_down(request: Request, exc: RecordsError) -> JSONResponse:
        count(request, "database_down")
        log.warning("%s: 503, the database is unavailable: %s", request.url.path, exc)
        detail = "the database is unavailable (nothing was recorded), retry later"
        return _problem(503, detail + shown(request, exc))

    @app.exception_handler(BrokerError)
    async def _broker_down(request: Request, exc: BrokerError) -> JSONResponse:
        count(request, "broker_down")
        log.warning("%s: 503, recorded but the broker is down: %s", request.url.path, exc)
        detail = "recorded, but the broker is down; it will be sent when it is back"
        return _problem(503, detail + shown(request, exc))

    def shown(request: Request, exc: Exception) -> str:
        # What failed names hosts, users, database names and addresses: for the API token's holder
        # only (it is in the server's log), as /readyz shows it.
        return f": {exc}" if token_given(request.headers.get("authorization")) else " (details in the log)"

    too_large = f"the body is larger than {settings.max_body_kb} KiB (FLAKETRIAGE_MAX_BODY_KB)"

    async def body(request: Request) -> bytes:
        return await read_body(request, limit=limit, timeout_s=settings.body_timeout_s, too_large=too_large)

    token = settings.api_token.get_secret_value() if settings.api_token else ""

    def token_given(authorization: str | None) -> bool:
        given = (authorization or "").removeprefix("Bearer ").strip()
        return bool(
            token
            and authorization
            and authorization.startswith("Bearer ")
            and hmac.compare_digest(given.encode("utf-8", "replace"), token.encode("utf-8"))
        )

    def authorized(authorization: str | None = Header(default=None)) -> None:
        if token and not token_given(authorization):
            raise HTTPProblem(401, "send Authorization: Bearer <FLAKETRIAGE_API_TOKEN>")

    def answer(source: str, result: IntakeResult, notes: list[str], delivery: str) -> JSONResponse:
        service.metrics.events.labels(source, result.outcome.value).inc()
        log.info(
            "%s delivery %s: %s; cases %s; work %s",
            source, delivery, result.outcome.value, list(result.cases) or "none", list(result.work) or "none",
        )  # fmt: skip
        status = 202 if result.outcome is IntakeOutcome.ACCEPTED else 200
        payload = Accepted(
            outcome=result.outcome.value, cases=list(result.cases), work=list(result.work), notes=notes
        )
        return JSONResponse(payload.model_dump(), status_code=status)

    def refuse(
        source: str,
        status: int,
        detail: str,
        outcome: str,
        delivery: str | None = None,
        *,
        close: bool = False,
    ) -> NoReturn:
        service.metrics.events.labels(source, outcome).inc()
        log.warning("%s delivery %s: refused %d (%s): %s", source, delivery or "-", status, outcome, detail)
        raise HTTPProblem(status, detail, close)

    async def github_body(request: Request) -> bytes:
        """The body of a GitHub delivery, unless its headers condemn it (then refused unread)."""
        from flaketriage.orchestrator.signatures import GITHUB_HEADER, check_github_headers

        try:
            check_github_headers(settings.github_webhook_secret, request.headers.get(GITHUB_HEADER))
        except SignatureError as exc:
            delivery = request.headers.get("X-GitHub-Delivery")
            refuse("github", 401, str(exc), "bad_signature", delivery, close=True)
        return await body(request)

    async def sentry_body(request: Request) -> bytes:
        """The body of a Sentry hook, unless its headers condemn it (then refused unread)."""
        from flaketriage.orchestrator.signatures import SENTRY_HEADER, check_sentry_headers

        try:
            check_sentry_headers(settings.sentry_client_secret, request.headers.get(SENTRY_HEADER))
        except SignatureError as exc:
            refuse("sentry", 401, str(exc), "bad_signature", request.headers.get("Request-ID"), close=True)
        return await body(request)

    _document_with(app, {"FailureEvent": FailureEvent, "ResultsUpload": ResultsUpload})
    events_secret = (
        settings.webhook_secret.get_secret_value().encode("utf-8") if settings.webhook_secret else b""
    )
    add_ping_route(app, events_secret, service.policy, settings.body_timeout_s)

    async def signed_body(
        request: Request, source: str, read: Callable[[Request], Awaitable[bytes]]
    ) -> bytes:
        """The body of a delivery signed as events are (`flaketriage.signing`), read by `read`:
        what the headers alone condemn is refused unread (nobody unsigned makes it read a
        megabyte), then the signature over the exact bytes is checked."""
        timestamp = request.headers.get(TIMESTAMP_HEADER)
        signature = request.headers.get(SIGNATURE_HEADER)
        if not events_secret:
            detail = f"{source} are refused: FLAKETRIAGE_WEBHOOK_SECRET is not set"
            refuse(source, 401, detail, "unsigned", close=True)
        try:
            check_headers(timestamp, signature, now=time.time())
        except SignatureError as exc:
            refuse(source, 401, str(exc), "bad_signature", close=True)
        raw = await read(request)
        try:
            verify(events_secret, timestamp, raw, signature, now=time.time())
        except SignatureError as exc:
            refuse(source, 401, str(exc), "bad_signature")
        return raw

    async def results_body(request: Request) -> bytes:
        return await read_body(
            request, limit=results_limit, timeout_s=settings.body_timeout_s * 4, too_large=results_too_large
        )  # a signed no-op (doctor)

    @app.post(
        "/v1/events",
        status_code=202,
        response_model=Accepted,
        responses={200: {"model": Accepted, "description": "a duplicate delivery"}, **_ERRORS},
        openapi_extra=_json_body(
            {"$ref": f"{_COMPONENTS}FailureEvent"}, headers=(TIMESTAMP_HEADER, SIGNATURE_HEADER)
        ),
    )
    async def post_event(request: Request) -> JSONResponse:
        """A ``failure.captured`` event, signed as `flaketriage notify` signs it."""
        # The route reads its body and headers itself: FastAPI's dependency resolution would cost
        # this, the busiest route, a third of its time on the event loop.
        raw = await signed_body(request, "events", body)
        try:
            event = FailureEvent.model_validate_json(raw)
        except ValidationError:
            # Not a valid event: parsed again the slow way, which tells a body that is not a JSON
            # object (400) from one whose fields are wrong (422) and reads what pydantic's parser
            # does not (UTF-16, lone surrogates), as the receiver always has.
            event = _event(raw, refuse)
        try:
            sighting = from_event(event, service.policy)
        except StoreNotAllowed as exc:
            refuse("events", 422, str(exc), "store_refused", event.event_id)
        # Recorded by the intake thread with whatever else arrived meanwhile (group commit); this
        # request is answered once its own delivery is committed and its work sent.
        result = await service.intake_queue.record("events", event.event_id, event.kind, [sighting])
        return answer("events", result, [], event.event_id)

    results_limit = settings.max_results_mb * 1024 * 1024
    results_too_large = (
        f"the results are larger than {settings.max_results_mb} MiB (FLAKETRIAGE_MAX_RESULTS_MB): "
        "upload a sharded suite one shard at a time"
    )

    @app.post(
        "/v1/results",
        status_code=202,
        response_model=ResultsAccepted,
        responses={200: {"model": ResultsAccepted, "description": "a duplicate upload"}, **_ERRORS},
        openapi_extra=_json_body(
            {"$ref": f"{_COMPONENTS}ResultsUpload"}, headers=(TIMESTAMP_HEADER, SIGNATURE_HEADER)
        ),
    )
    async def post_results(request: Request) -> JSONResponse:
        """Every test's outcome in one CI job (`flaketriage results upload`, the pytest plugin),
        signed as events are. Recorded whole or not at all; a repeated ``upload_id`` is a 200 that
        changes nothing."""
        raw = await signed_body(request, "results", results_body)
        upload = await anyio.to_thread.run_sync(_results, raw, refuse)
        answer_ = await anyio.to_thread.run_sync(
            accept_results, service.database, service.dispatcher, settings, upload, service.test_ids
        )
        outcome = answer_.outcome
        service.metrics.events.labels("results", outcome).inc()
        log.info(
            "results upload %s: %s; %d tests, %d failed%s",
            upload.upload_id, outcome, answer_.tests, answer_.failures, " (a storm)" if answer_.storm else "",
        )  # fmt: skip
        return JSONResponse(answer_.model_dump(), status_code=202 if outcome == "accepted" else 200)

    @app.get(
        "/v1/tests",
        response_model=list[TestSummary],
        dependencies=[Depends(authorized)],
        responses={401: _ERRORS[401], 422: _ERRORS[422], 503: _ERRORS[503]},
    )
    def list_tests(
        repository: str | None = None,
        branch: str | None = None,
        flaky: bool | None = None,
        quarantined: bool | None = None,
        sort: Literal["last_seen", "lost", "failures"] = "last_seen",
        limit: int = 100,
    ) -> list[TestSummary]:
        """Tests per variant with their CI history's totals, most recently seen first (``sort=lost``:
        the most CI time lost first); filter by ``repository``, ``branch`` (ran in its latest
        uploads: each job's latest, then the newer others, up to 200,000 results), ``flaky``
        (suspected by history) and ``quarantined``."""
        return TestQuery(service.database).list(
            repository=repository,
            branch=branch,
            flaky=flaky,
            quarantined=quarantined,
            sort=sort,
            limit=max(1, min(limit, 1000)),
        )

    @app.get(
        "/v1/tests/{test_id}",
        response_model=TestDetail,
        dependencies=[Depends(authorized)],
        responses={
            401: _ERRORS[401],
            404: {"model": Problem, "description": "no such test"},
            422: _ERRORS[422],
            503: _ERRORS[503],
        },
    )
    def get_test(test_id: int, recent: int = 50) -> TestDetail:
        """One test in one variant: totals, its latest results (newest first), flaky commits, flip
        rate, CI time lost, and the cases about it with what their replays cost."""
        found = (
            TestQuery(service.database).get(test_id, recent=max(1, min(recent, 500)))
            if 0 < test_id <= MAX_ID
            else None
        )
        if found is None:
            raise HTTPProblem(404, f"no test {test_id}; list them at /v1/tests")
        return found

    @app.post(
        "/webhooks/github",
        status_code=202,
        response_model=Accepted,
        responses={200: {"model": Accepted, "description": "ignored or duplicate"}, **_ERRORS},
        openapi_extra=_json_body({"type": "object", "description": "GitHub's webhook payload"}),
    )
    def post_github(
        raw: bytes = Depends(github_body),
        event: str | None = Header(default=None, alias="X-GitHub-Event"),
        delivery: str | None = Header(default=None, alias="X-GitHub-Delivery"),
        signature: str | None = Header(default=None, alias="X-Hub-Signature-256"),
    ) -> JSONResponse:
        """A GitHub webhook delivery (``workflow_run``, ``check_run``, ``issues``, ``issue_comment``)."""
        from flaketriage.orchestrator.signatures import verify_github

        try:
            verify_github(settings.github_webhook_secret, raw, signature)
        except SignatureError as exc:
            refuse("github", 401, str(exc), "bad_signature", delivery)
        if not event or not delivery:
            refuse(
                "github", 400, "a GitHub delivery has X-GitHub-Event and X-GitHub-Delivery headers", "invalid"
            )
        data = _json(raw, "github", refuse)
        parsed = _parse(lambda: github_hooks.parse(str(event), data, service.policy), "github", refuse)
        return _record(service, "github", str(delivery)[:128], str(event), parsed, answer)

    @app.post(
        "/webhooks/sentry",
        status_code=202,
        response_model=Accepted,
        responses={200: {"model": Accepted, "description": "ignored or duplicate"}, **_ERRORS},
        openapi_extra=_json_body({"type": "object", "description": "Sentry's integration webhook payload"}),
    )
    def post_sentry(
        raw: bytes = Depends(sentry_body),
        resource: str | None = Header(default=None, alias="Sentry-Hook-Resource"),
        signature: str | None = Header(default=None, alias="Sentry-Hook-Signature"),
        request_id: str | None = Header(default=None, alias="Request-ID"),
    ) -> JSONResponse:
        """A Sentry integration webhook (``event_alert``, ``issue``; the rest is ignored)."""
        from flaketriage.orchestrator.signatures import verify_sentry

        try:
            verify_sentry(settings.sentry_client_secret, raw, signature)
        except SignatureError as exc:
            refuse("sentry", 401, str(exc), "bad_signature", request_id)
        if not resource:
            refuse("sentry", 400, "a Sentry delivery has a Sentry-Hook-Resource header", "invalid")
        data = _json(raw, "sentry", refuse)
        parsed = _parse(lambda: sentry_hooks.parse(str(resource), data, service.policy), "sentry", refuse)
        delivery = (request_id or hashlib.sha256(raw).hexdigest())[:128]
        return _record(service, "sentry", delivery, str(resource), parsed, answer)

    @app.get(
        "/v1/cases",
        response_model=list[CaseSummary],
        dependencies=[Depends(authorized)],
        responses={401: _ERRORS[401], 422: _ERRORS[422], 503: _ERRORS[503]},
    )
    def list_cases(
        status: CaseStatus | None = None,
        verdict: CaseVerdict | None = None,
        limit: int = 100,
    ) -> list[CaseSummary]:
        """Cases, newest first; filter by ``status`` and ``verdict`` (a value that is not one of
        theirs is a 422 naming those there are, never an empty list)."""
        return CaseQuery(service.database).list(
            status=status, verdict=verdict, limit=max(1, min(limit, 1000))
        )

    @app.get(
        "/v1/cases/{case_id}",
        response_model=CaseDetail,
        dependencies=[Depends(authorized)],
        responses={
            401: _ERRORS[401],
            404: {"model": Problem, "description": "no such case"},
            422: _ERRORS[422],
            503: _ERRORS[503],
        },
    )
    def get_case(case_id: int) -> CaseDetail:
        """One case with its evidence, occurrences, triage runs and their replays."""
        # An id past the column's range names no case (and PostgreSQL refuses to compare with it).
        found = CaseQuery(service.database).get(case_id) if 0 < case_id <= MAX_ID else None
        if found is None:
            raise HTTPProblem(404, f"no case {case_id}; list them at /v1/cases")
        return found

    @app.get(
        "/v1/runners",
        response_model=list[RunnerSummary],
        dependencies=[Depends(authorized)],
        responses={401: _ERRORS[401], 422: _ERRORS[422], 503: _ERRORS[503]},
    )
    def get_runners(suspect: bool | None = None, limit: int = 1000) -> list[RunnerSummary]:
        """The machines replays ran on, suspects first: a suspect runner keeps reproducing failures
        that other hardware does not (``environment_specific`` verdicts); drain it."""
        return list_runners(service.database, suspect=suspect, limit=max(1, min(limit, 10000)))

    @app.get(
        "/v1/quarantine",
        dependencies=[Depends(authorized)],
        responses={
            200: {"model": QuarantineDocument, "description": "the quarantine document, with its ETag"},
            304: {"description": "the list is the one `If-None-Match` names: the client's copy is current"},
            401: _ERRORS[401],
            503: _ERRORS[503],
        },
    )
    def get_quarantine(if_none_match: str | None = Header(default=None)) -> Response:
        """The quarantine document (the same JSON the CI side reads from a file).

        Every answer carries the document's ETag; a request whose ``If-None-Match`` names it is
        answered ``304 Not Modified`` without the body: the pytest plugin asks so in every session.
        """
        document = quarantine_document(service.database).to_json()
        etag = quarantine_etag(document)
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        if if_none_match is not None and etag_matches(if_none_match, etag):
            return Response(status_code=304, headers=headers)
        return Response(document, media_type="application/json", headers=headers)

    @app.get("/healthz", response_model=Health)
    def healthz() -> Health:
        return Health(status="ok")

    @app.head("/healthz", include_in_schema=False)  # load balancers probe with HEAD
    def healthz_head() -> Response:
        return Response(status_code=200)

    def readiness(detailed: bool) -> tuple[Health, int]:
        problems: dict[str, str] = {}
        try:
            service.database.ping()
        except RecordsError as exc:
            problems["database"] = str(exc)
        try:
            service.sender.ping()
        except BrokerError as exc:
            problems["broker"] = str(exc)
        health = Health(status="unavailable" if problems else "ok", database="ok", broker="ok")
        for part, detail in problems.items():
            log.warning("readyz: the %s is unavailable: %s", part, detail)
            setattr(health, part, detail if detailed else "unavailable")
        return health, 503 if problems else 200

    @app.get("/readyz", response_model=Health, responses={503: {"model": Health}})
    def readyz(authorization: str | None = Header(default=None)) -> JSONResponse:
        """Ready when the database and the broker answer. What is wrong names hosts, users and
        addresses: it is shown to a request with the API token only (and written to the server's
        log); to others a part that is down is ``unavailable``."""
        health, status = readiness(detailed=token_given(authorization))
        return JSONResponse(health.model_dump(), status_code=status)

    @app.head("/readyz", include_in_schema=False)
    def readyz_head() -> Response:
        return Response(status_code=readiness(detailed=False)[1])

    @app.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}, "description": "Prometheus text"}
        },
    )
    def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    from flaketriage.orchestrator.dashboard import mount

    mount(app, service)
    return app


Refuse = Callable[[str, int, str, str], NoReturn]

_COMPONENTS = "#/components/schemas/"


def _json_body(schema: dict[str, Any], headers: tuple[str, ...] = ()) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads its JSON body itself (to check its signature first),
    and `headers`, optional strings, if it reads those itself too (documented as ``Header()`` is)."""
    extra: dict[str, Any] = {
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}
    }
    if headers:
        extra["parameters"] = [
            {
                "name": name,
                "in": "header",
                "required": False,
                "schema": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": name},
            }
            for name in headers
        ]
    return extra


def _document_with(app: FastAPI, models: dict[str, type[BaseModel]]) -> None:
    """Add `models` (and the models they use) to the app's OpenAPI components.

    A route that reads its body itself names its model by ``$ref``; pydantic's own schema nests
    the models it uses under ``$defs``, whose ``#/$defs/...`` references resolve nowhere in the
    OpenAPI document, so they are written as components instead.
    """
    schemas: dict[str, Any] = {}
    for name, model in models.items():
        schema = model.model_json_schema(ref_template=_COMPONENTS + "{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[name] = schema

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            components = document.setdefault("components", {}).setdefault("schemas", {})
            clashes = [name for name in schemas if name in components and components[name] != schemas[name]]
            if clashes:
                raise RuntimeError(f"OpenAPI components {clashes} are defined twice, differently")
            components.update(schemas)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


_UNSTORABLE = re.compile(rb"\\u[dD][89a-fA-F]|NaN|Infinity")
"""What may read as a value no record or answer can hold: a ``\\uD8xx``-``\\uDFxx`` escape (half of a
pair, or a lone surrogate JSON allows and UTF-8 cannot hold), NaN or an infinity (Python reads them)."""


def _json(raw: bytes, source: str, refuse: Refuse) -> Any:
    try:
        data = json.loads(raw)
        if _UNSTORABLE.search(raw):
            # Would fail the hashes of its text, its records and every answer that shows it: made
            # storable once, here, before anything reads it (`storable_json`).
            data = storable_json(data)
    except (ValueError, UnicodeDecodeError) as exc:
        refuse(source, 400, f"the body is not JSON: {exc}", "invalid")
    except RecursionError:
        refuse(source, 400, "the body is not JSON this service reads: it is nested too deeply", "invalid")
    if not isinstance(data, dict):
        refuse(source, 400, "the body must be a JSON object", "invalid")
    return data


def _event(raw: bytes, refuse: Refuse) -> FailureEvent:
    data = _json(raw, "events", refuse)
    try:
        return FailureEvent.model_validate(data)
    except ValidationError as exc:
        refuse("events", 422, _validation_text(exc.errors()), "invalid")


def _results(raw: bytes, refuse: Refuse) -> ResultsUpload:
    """The upload in `raw`: 400 for a body that is not a JSON object, 422 naming the fields that
    are wrong (a value no record can hold, such as a NUL or a lone surrogate, among them)."""
    try:
        return ResultsUpload.model_validate_json(raw)
    except ValidationError as exc:
        if any(e.get("type") == "json_invalid" for e in exc.errors()):
            refuse("results", 400, "the body is not JSON: " + _validation_text(exc.errors()), "invalid")
        if any(e.get("type") == "model_type" and not e.get("loc") for e in exc.errors()):
            refuse("results", 400, "the body must be a JSON object", "invalid")
        refuse("results", 422, _validation_text(exc.errors()), "invalid")


def _parse(parse: Callable[[], Parsed], source: str, refuse: Refuse) -> Parsed:
    try:
        return parse()
    except PayloadError as exc:
        refuse(source, 422, str(exc), "invalid")


def _record(
    service: Service,
    source: str,
    delivery: str,
    kind: str,
    parsed: Parsed,
    answer: Callable[[str, IntakeResult, list[str], str], JSONResponse],
) -> JSONResponse:
    # A route that reads bundles (blocking) runs on a worker thread; the delivery is recorded
    # through the event loop, as every other one is.
    sightings = parsed.sightings if parsed.handled else []
    # Recorded by what the signed body is about, when it says: the sender's delivery id is a header
    # nobody signed, and a captured body re-sent under a new one must not be new (a comment's
    # triage started again, a run counted twice). A delivery id is a key only under its own prefix,
    # so a captured body re-sent under an id spelled as a run's key cannot pass for that run.
    key = parsed.subject or f"{DELIVERY_KEY}{delivery}"
    result = anyio.from_thread.run(service.intake_queue.record, source, key, kind, sightings)
    return answer(source, result, parsed.notes, f"{delivery} ({key})" if parsed.subject else delivery)


def quarantine_etag(document: bytes) -> str:
    """The strong ETag of a quarantine document's bytes: a hash, so every service process (and a
    restarted one) gives the same list the same tag."""
    return '"' + hashlib.sha256(document).hexdigest()[:32] + '"'


def etag_matches(if_none_match: str, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names `etag`: ``*``, or a list of tags compared weakly
    (``W/"x"`` matches ``"x"``), as RFC 9110 section 13.1.2 says. Anything else is no match."""
    if if_none_match.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in if_none_match.split(","))


def _validation_text(errors: Any) -> str:
    parts = []
    for error in list(errors)[:5]:
        loc = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        message = error.get("msg", "invalid")
        pattern = str(error.get("ctx", {}).get("pattern"))
        if error.get("type") == "string_pattern_mismatch" and "\\x00" in pattern:
            message = "must not contain NUL characters"  # what the no-NUL pattern means
        parts.append(f"{loc}: {message}")
    return "; ".join(parts)
