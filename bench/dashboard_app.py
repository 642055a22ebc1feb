"""The app bench/dashboard.py times: what ``flaketriage serve`` serves (`create_app` of `build_service`,
run by `flaketriage.orchestrator.server.run`, settings from ``FLAKETRIAGE_*``), with three things
only the benchmark needs, kept out of the product:

- ``GET /bench/select1``: one ``SELECT 1`` in a database session, answered with a line of HTML; the
  baseline every page is compared with (a request through the same server, middleware and pool);
- ``X-Bench-Statements`` and ``X-Bench-SQL-ms`` on every answer: the SQL statements the request ran
  and the time spent in them, counted at psycopg's cursors (so statements a page sends through the
  pipeline of `flaketriage.records.database.fetch_together`, which SQLAlchemy's events never see,
  count too; a pipelined statement's time is its sending, not its answer);
- ``GET /bench/slowest``: the slowest statement each page ran (a page is named by the client's
  ``X-Bench-Page`` header), and ``GET /bench/explain?page=NAME``: that statement's
  ``EXPLAIN (ANALYZE, BUFFERS)`` with the values it ran with, to say why a page is slow.

Run: ``python bench/dashboard_app.py --port PORT``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STATEMENTS = "x-bench-statements"
SQL_MS = "x-bench-sql-ms"
PAGE = "x-bench-page"


@dataclass
class Tally:
    """What one request ran."""

    statements: int = 0
    seconds: float = 0.0
    slowest: tuple[float, Any, Any] | None = None
    """(seconds, query, parameters) of its slowest statement."""

    def add(self, query: Any, params: Any, seconds: float) -> None:
        self.statements += 1
        self.seconds += seconds
        if self.slowest is None or seconds > self.slowest[0]:
            self.slowest = (seconds, query, params)


_REQUEST: ContextVar[Tally | None] = ContextVar("bench_request", default=None)
_COUNTING: dict[type, type] = {}
_LOCK = threading.Lock()


def counting(factory: type) -> type:
    """`factory` (a psycopg cursor class) whose statements are added to the request's `Tally`."""
    with _LOCK:
        made = _COUNTING.get(factory)
        if made is None:

            class Counting(factory):  # type: ignore[misc, valid-type]
                counts_for_bench = True

                def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
                    tally = _REQUEST.get()
                    start = time.perf_counter()
                    try:
                        return super().execute(query, params, **kwargs)
                    finally:
                        if tally is not None:
                            tally.add(query, params, time.perf_counter() - start)

                def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> Any:
                    tally = _REQUEST.get()
                    start = time.perf_counter()
                    try:
                        return super().executemany(query, params_seq, **kwargs)
                    finally:
                        if tally is not None:
                            tally.add(query, None, time.perf_counter() - start)

            made = _COUNTING[factory] = Counting
    return made


class Counted:
    """ASGI middleware: a `Tally` per request, sent back in its headers and kept per page."""

    def __init__(self, app: Any, slowest: dict[str, tuple[float, Any, Any]]) -> None:
        self.app = app
        self.slowest = slowest

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tally = Tally()
        token = _REQUEST.set(tally)

        async def counted(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    *message.get("headers", []),
                    (STATEMENTS.encode(), str(tally.statements).encode()),
                    (SQL_MS.encode(), f"{tally.seconds * 1000:.2f}".encode()),
                ]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, counted)
        finally:
            _REQUEST.reset(token)
        page = dict(scope.get("headers", [])).get(PAGE.encode())
        if page and tally.slowest is not None:
            name = page.decode("utf-8", "replace")
            if name not in self.slowest or tally.slowest[0] > self.slowest[name][0]:
                self.slowest[name] = tally.slowest


def bench_app(service: Any) -> Any:
    """`create_app(service)` with the benchmark's route, headers and plans."""
    from fastapi import Query
    from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
    from sqlalchemy import event, text

    from flaketriage.orchestrator.app import create_app

    app = create_app(service)
    slowest: dict[str, tuple[float, Any, Any]] = {}

    def count_cursors(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        factory = dbapi_connection.cursor_factory
        if not getattr(factory, "counts_for_bench", False):
            dbapi_connection.cursor_factory = counting(factory)

    if not service.database.is_sqlite:
        event.listen(service.database.engine, "checkout", count_cursors)

    @app.get("/bench/select1", include_in_schema=False)
    def select1() -> HTMLResponse:
        with service.database.session() as session:
            one = session.execute(text("SELECT 1")).scalar_one()
        return HTMLResponse(f"<p>{one}</p>")

    @app.get("/bench/slowest", include_in_schema=False)
    def slowest_statements() -> JSONResponse:
        return JSONResponse(
            {name: {"ms": s * 1000, "sql": _text(query)} for name, (s, query, _) in slowest.items()}
        )

    @app.get("/bench/explain", include_in_schema=False)
    def explain(page: str = Query()) -> PlainTextResponse:
        if page not in slowest:
            return PlainTextResponse(f"no statement recorded for {page!r}", status_code=404)
        return PlainTextResponse(_explain(service, *slowest[page][1:]))

    app.add_middleware(Counted, slowest=slowest)
    return app


def _text(query: Any) -> str:
    if isinstance(query, bytes):
        return query.decode("utf-8", "replace")
    return str(query) if isinstance(query, str) else repr(query)


def _explain(service: Any, query: Any, params: Any) -> str:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of `query` with `params`, bound on the client (a server-side
    parameter cannot always stand in an EXPLAIN)."""
    import psycopg

    sql = _text(query)
    if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
        return f"not a query, not explained:\n{sql}"
    raw = service.database.engine.raw_connection()
    try:
        driver = raw.driver_connection
        with psycopg.ClientCursor(driver) as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        driver.rollback()
    finally:
        raw.close()
    return f"{sql}\n-- parameters: {params!r}\n{plan}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()

    from flaketriage.orchestrator import server
    from flaketriage.orchestrator.service import build_service
    from flaketriage.settings import load_settings

    settings = load_settings()
    service = build_service(settings, lambda line: print(line, file=sys.stderr))
    try:
        server.run(
            bench_app(service), host=args.host, port=args.port, header_timeout_s=settings.header_timeout_s
        )
    finally:
        service.close()


if __name__ == "__main__":
    main()
