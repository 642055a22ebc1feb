"""`Database`: the engine, sessions, readiness and schema upgrades for one database URL.

URLs come in their usual form (``sqlite:///path.db``, ``postgresql://user@host:5432/db``) and are
given the driver flaketriage installs (psycopg 3). The schema is Alembic's: `upgrade()` brings any
database to the newest revision and is safe to call from several processes at once.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Connection,
    Engine,
    Integer,
    any_,
    bindparam,
    create_engine,
    event,
    text,
)
from sqlalchemy.engine import Dialect, ExceptionContext, make_url
from sqlalchemy.exc import ArgumentError, DataError, DBAPIError, DisconnectionError, SQLAlchemyError
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker
from sqlalchemy.sql import Executable

from flaketriage.dependencies import require
from flaketriage.errors import ConfigError, RecordsDataError, RecordsError
from flaketriage.files.modes import OWNER_ONLY

MIGRATIONS = Path(__file__).with_name("migrations")
_ADVISORY_LOCK = 0x46_54_52_47  # "FTRG": one schema upgrade at a time on PostgreSQL
_PIPELINE = "flaketriage.pipeline"
_DEFERRED = "flaketriage.deferred"
PING_AFTER_IDLE_S = 1.0
"""A pooled PostgreSQL connection idle longer than this is pinged before use (a server restart, a
proxy or a firewall may have dropped it meanwhile); one in steady use is not: that spares the
receiver a round trip per transaction, and a connection that dies while in use fails its
transaction either way."""


def database_url(url: str) -> str:
    """`url` with flaketriage's driver: ``postgresql://`` and ``postgres://`` use psycopg 3."""
    raw = url.strip()
    if not raw:
        raise ConfigError(
            "the database URL is empty; set FLAKETRIAGE_DATABASE_URL (sqlite:///path or postgresql://...)"
        )
    for prefix in ("postgres://", "postgresql://"):
        if raw.startswith(prefix):
            raw = "postgresql+psycopg://" + raw[len(prefix) :]
    try:
        parsed = make_url(raw)
    except ArgumentError as exc:
        raise ConfigError(
            f"FLAKETRIAGE_DATABASE_URL={url!r} is not a database URL; use sqlite:///path.db or "
            "postgresql://user@host:5432/db"
        ) from exc
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ConfigError(
            f"FLAKETRIAGE_DATABASE_URL names {parsed.get_backend_name()!r}; flaketriage supports sqlite "
            "and postgresql"
        )
    return raw


def create_sqlite_file(url: str | None) -> None:
    """Create the file of a ``sqlite:///path`` database (and its missing directories) owner-only,
    0600 and 0700, when it does not exist: SQLite would create it with the umask's mode, and its WAL
    and journal files take the database's. Records name bundles, stores and tests: like the store
    they sit beside, they are their owner's. Any other URL (in memory, a server) is left alone."""
    if not url or not url.startswith("sqlite"):
        return
    path = make_url(url).database
    if path and path != ":memory:" and not path.startswith("file:"):
        OWNER_ONLY.create_file(Path(path))


class Database:
    """One database: sessions (`session()`), readiness (`ping()`) and schema upgrades (`upgrade()`)."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = database_url(url)
        self.is_sqlite = self.url.startswith("sqlite")
        # When one connection is found dead (a server restart, a network cut) the pooled ones may
        # be too, however recently used: on PostgreSQL each is pinged at its next checkout.
        self._lost_at = 0.0
        options: dict[str, Any] = {"echo": echo, "future": True}
        if self.is_sqlite:
            create_sqlite_file(self.url)
            options["connect_args"] = {"timeout": 30, "check_same_thread": False}
        else:
            # Custom plans only: psycopg prepares a statement run five times, and PostgreSQL may then
            # keep one generic plan for it, chosen when the table was small (a sequential scan),
            # and run it as the table grows (the receiver's dedupe and case lookups slowed down
            # fourfold in a minute on a new database).
            options.update(
                pool_size=10,
                max_overflow=20,
                connect_args={"connect_timeout": 5, "options": "-c plan_cache_mode=force_custom_plan"},
            )
        self.engine: Engine = create_engine(self.url, **options)
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
            # Every transaction takes the write lock at BEGIN: a read-then-write (a claim, a dedupe)
            # can then never act on a snapshot another writer has changed meanwhile.
            event.listen(self.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
        else:
            for when in ("connect", "checkin"):
                event.listen(self.engine, when, _mark_idle)
            event.listen(self.engine, "checkout", self._ping_if_idle)
            event.listen(self.engine, "handle_error", self._note_if_lost)
            event.listen(self.engine, "after_cursor_execute", _answer_now)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def __repr__(self) -> str:
        return f"Database({self.engine.url.render_as_string(hide_password=True)!r})"

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """A session whose transaction commits when the block ends and rolls back on an error.

        Database errors become `RecordsError` (the receiver answers 503 to them), a value refused as
        data `RecordsDataError` (422: the request's fault, not an outage).
        """
        session = self._sessions()
        try:
            yield session
            session.commit()
        except (SQLAlchemyError, UnicodeEncodeError) as exc:
            session.rollback()
            raise self._error(exc) from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A connection in a transaction that commits when the block ends and rolls back on an error:
        for SQL statements without the ORM's bookkeeping (the receiver's hot path). Database errors
        become `RecordsError`, as in `session`.

        On PostgreSQL the transaction runs in psycopg's pipeline mode, to spare round trips: BEGIN
        travels with the first statement, and the statements of a `deferred` block travel with the
        next statement whose result is read, or with the COMMIT. Every other statement is answered
        before `execute` returns, as it would be without a pipeline."""
        try:
            with self.engine.connect() as conn, _pipelined(conn, self), conn.begin():
                yield conn
        except (SQLAlchemyError, UnicodeEncodeError) as exc:
            self._note_if_invalidated(exc)
            raise self._error(exc) from exc

    def _error(self, exc: SQLAlchemyError | UnicodeEncodeError) -> RecordsError:
        """`exc` as the receiver answers it: a value refused as data (a `DataError`; SQLite's driver
        raises `UnicodeEncodeError` for text UTF-8 cannot encode) is the request's fault, anything
        else the database's."""
        if isinstance(exc, DataError | UnicodeEncodeError):
            # No URL: the message goes back to whoever sent the value.
            return RecordsDataError(f"the database refused a value as data: {_first_line(exc)}")
        return RecordsError(f"the database at {self.safe_url} failed: {_first_line(exc)}")

    def _ping_if_idle(self, dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        """SQLAlchemy's ``pool_pre_ping`` for connections idle past `PING_AFTER_IDLE_S`, or idle
        since before a connection was last found dead, only: a dead one is replaced by a fresh one
        (the pool tries the checkout again on `DisconnectionError`)."""
        idle_since = record.info.get("idle_since")
        if (
            idle_since is not None
            and idle_since > self._lost_at
            and time.monotonic() - idle_since < PING_AFTER_IDLE_S
        ):
            return
        try:
            self.engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            self.note_lost()
            raise DisconnectionError(f"the pooled connection is gone: {_first_line(exc)}") from exc

    def note_lost(self) -> None:
        """A connection was found dead: ping each pooled one at its next checkout."""
        self._lost_at = time.monotonic()

    def _note_if_lost(self, context: ExceptionContext) -> None:
        if context.is_disconnect:
            self.note_lost()

    def _note_if_invalidated(self, exc: SQLAlchemyError | UnicodeEncodeError) -> None:
        """A connection our own code found dead (`fetch_together`; SQLAlchemy's own statements
        are noted by `_note_if_lost`)."""
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            self.note_lost()

    @property
    def safe_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def ping(self) -> None:
        """Raise `RecordsError` unless the database answers."""
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except SQLAlchemyError as exc:
            raise RecordsError(
                f"the database at {self.safe_url} does not answer: {_first_line(exc)}"
            ) from exc

    def upgrade(self) -> None:
        """Create or upgrade the schema to the newest migration (Alembic ``upgrade head``)."""
        require("alembic", "server", "the service's schema migrations")
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        try:
            with self.engine.begin() as conn:
                if not self.is_sqlite:
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_LOCK})
                config.attributes["connection"] = conn
                command.upgrade(config, "head")
        except SQLAlchemyError as exc:
            raise RecordsError(
                f"could not create or upgrade the schema at {self.safe_url}: {_first_line(exc)}"
            ) from exc

    def upgrade_when_up(self, wait_s: float, say: Callable[[str], None], *, every_s: float = 2.0) -> None:
        """`upgrade`, trying again every `every_s` while the database does not answer, for `wait_s`
        at most: a service process started while its database restarts waits for it instead of
        exiting. `say` is told of each wait; the last failure is raised."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.upgrade()
                return
            except RecordsError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                say(f"{exc}; trying again for {left:.0f} s more (FLAKETRIAGE_DATABASE_WAIT_S)")
                time.sleep(min(every_s, left))

    def dispose(self) -> None:
        self.engine.dispose()


@contextlib.contextmanager
def deferred(conn: Connection) -> Iterator[None]:
    """Statements in the block whose results nobody reads (no rows, no rowcount): in a
    `Database.transaction` on PostgreSQL they are sent at once and answered together with the next
    statement that is read, or with the COMMIT, in one round trip; an error in one is raised there,
    and the transaction rolls back as a whole. A statement that returns rows is answered at once
    (through `fetch`, or SQLAlchemy's own); SQL text with a RETURNING clause given to
    ``conn.exec_driver_sql`` does not belong in the block. Elsewhere, statements run as usual."""
    outer = conn.info.get(_DEFERRED, False)
    conn.info[_DEFERRED] = True
    try:
        yield
    finally:
        conn.info[_DEFERRED] = outer


@dataclass(frozen=True)
class Query:
    """A statement to run with others (`fetch_together`): a Core statement, or SQL text in the
    driver's style (psycopg's ``%(name)s``), with its parameters (a list of them: many rows)."""

    statement: Executable | str
    params: Mapping[str, Any] | Sequence[Mapping[str, Any]]


def fetch_together(conn: Connection, queries: Sequence[Query]) -> list[list[tuple[Any, ...]]]:
    """Run `queries` in order and return the rows of each (empty for a statement that returns none).

    In a `Database.transaction` on PostgreSQL they are sent at once and answered in one round trip
    (with any `deferred` statement before them): the driver's rows, without SQLAlchemy's type
    processing (a timestamp comes in the session's zone; parameters go to the driver as given, one
    row each). An error in one is raised as SQLAlchemy raises it (an ``IntegrityError`` stays one)
    and the transaction rolls back as a whole. Elsewhere each runs through SQLAlchemy, one after
    another."""
    pipeline = conn.info.get(_PIPELINE)
    if pipeline is None:
        return [fetch(conn, query) for query in queries]
    return _through_pipeline(conn, pipeline, queries, answer=True)


def fetch(conn: Connection, query: Query) -> list[tuple[Any, ...]]:
    """Run `query` and return its rows, if any; a `deferred` one that returns none is not waited
    for. In a `Database.transaction` on PostgreSQL it goes to the driver as `fetch_together` sends
    it; elsewhere through SQLAlchemy."""
    pipeline = conn.info.get(_PIPELINE)
    if pipeline is not None:
        answer = not conn.info.get(_DEFERRED) or _driver_sql(query.statement, conn.dialect)[2]
        answers = _through_pipeline(conn, pipeline, [query], answer=answer)
        return answers[0] if answers else []
    params: Any = query.params
    if isinstance(query.statement, str):
        result = conn.exec_driver_sql(query.statement, params)
    else:
        result = conn.execute(query.statement, params)
    return [tuple(row) for row in result] if result.returns_rows else []


def _through_pipeline(
    conn: Connection, pipeline: Any, queries: Sequence[Query], *, answer: bool
) -> list[list[tuple[Any, ...]]]:
    """Send `queries` on the driver's connection, in pipeline mode. With `answer`, wait for them
    (and for all sent before) and return their rows; else return nothing, and the next statement
    answered, or the COMMIT, raises their errors. SQLAlchemy's execution (its context, its result
    and its events) costs more than running the receiver's statements: they go around it."""
    import psycopg

    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    cursors: list[psycopg.Cursor[Any]] = []
    sql = ""
    try:
        for query in queries:
            sql, bound, _ = _driver_sql(query.statement, conn.dialect)
            cursor = driver.cursor()
            params = query.params
            if not isinstance(params, Mapping):
                raise TypeError("a statement sent in a pipeline takes one row of parameters (a mapping)")
            cursor.execute(sql, {**bound, **params} if bound else params)
            cursors.append(cursor)
        if not answer:
            return []
        pipeline.sync()
        # Rows where the statement returned some (`description` would build its columns first).
        return [cursor.fetchall() if _has_rows(cursor) else [] for cursor in cursors]
    except psycopg.Error as exc:
        lost = conn.dialect.is_disconnect(exc, conn.connection.dbapi_connection, None)  # type: ignore[arg-type]
        if lost:
            conn.invalidate(exc)
        raise DBAPIError.instance(
            sql, None, exc, psycopg.Error, hide_parameters=True, connection_invalidated=lost
        ) from exc
    finally:
        for cursor in cursors:
            cursor.close()


def _has_rows(cursor: Any) -> bool:
    from psycopg import pq

    result = cursor.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


@functools.lru_cache(maxsize=64)
def _driver_sql(statement: Executable | str, dialect: Dialect) -> tuple[str, dict[str, Any], bool]:
    """`statement` as the driver's SQL text, with the values bound in it (a Core statement is
    compiled once per dialect), and whether it returns rows."""
    if isinstance(statement, str):
        return statement, {}, _RETURNS_ROWS.search(statement) is not None
    compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
    returns = bool(getattr(statement, "is_select", False) or compiled.effective_returning)
    return str(compiled), {k: v for k, v in compiled.params.items() if v is not None}, returns


_RETURNS_ROWS = re.compile(r"^\s*(SELECT|WITH|VALUES|SHOW)\b|\bRETURNING\b", re.IGNORECASE)
"""SQL text whose statement returns rows (ours: a query, or a write with a RETURNING clause)."""


@contextlib.contextmanager
def _pipelined(conn: Connection, database: Database) -> Iterator[None]:
    """`conn` in psycopg's pipeline mode for the block, on PostgreSQL where libpq has it."""
    if conn.dialect.name != "postgresql":
        yield
        return
    import psycopg

    if not psycopg.Pipeline.is_supported():
        yield
        return
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    try:
        with driver.pipeline() as pipeline:
            conn.info[_PIPELINE] = pipeline
            try:
                yield
            finally:
                conn.info.pop(_PIPELINE, None)
    except psycopg.Error as exc:
        # Entering or leaving pipeline mode failed (statements fail inside SQLAlchemy, which says
        # so in its own errors): the connection is not fit to go back to the pool.
        conn.invalidate()
        database.note_lost()
        raise RecordsError(f"the database at {database.safe_url} failed: {_first_line(exc)}") from exc


def _answer_now(conn: Connection, _cursor: Any, _sql: str, _params: Any, context: Any, _many: bool) -> None:
    """After a statement in a pipeline: wait for its answer (and those of the statements sent before
    it), so that SQLAlchemy reads its result as without a pipeline; unless it is `deferred` and
    returns nothing (SQLAlchemy's INSERT of one row reads its new key back: that one is answered
    now, deferred or not)."""
    pipeline = conn.info.get(_PIPELINE)
    if pipeline is None:
        return
    compiled = getattr(context, "compiled", None)
    if not conn.info.get(_DEFERRED) or (compiled is not None and compiled.effective_returning):
        pipeline.sync()


def _mark_idle(_dbapi_connection: Any, record: Any) -> None:
    record.info["idle_since"] = time.monotonic()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # BEGIN is ours (see Database.__init__)
    cursor = dbapi_connection.cursor()
    # WAL lets the receiver read while a worker writes; NORMAL sync is durable across a process
    # crash (only an OS crash can lose the last transactions).
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _first_line(exc: BaseException) -> str:
    text_ = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text_[0] if text_ else type(exc).__name__


def among(
    session: Session, column: ColumnElement[int] | InstrumentedAttribute[int], values: Sequence[int]
) -> ColumnElement[bool]:
    """``column IN values``: on PostgreSQL ``column = ANY(:array)``, one parameter however many
    values (an ``IN`` of a few thousand ids cost ~12 ms a statement to compile and send), else an
    ``IN`` list."""
    if session.get_bind().dialect.name == "postgresql":
        return column == any_(bindparam(None, list(values), type_=ARRAY(Integer)))
    return column.in_(values)
