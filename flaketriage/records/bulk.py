"""Writing many rows in one statement whose text is the same however many rows there are.

SQLAlchemy writes a batch of rows as one ``INSERT ... VALUES (...), (...), ...``: a statement whose
text grows with the batch, so the driver parses and converts it anew every time (for the receiver's
batches, a third of its recording time went to psycopg reading its own query text). On PostgreSQL
these functions send the rows as one JSON document instead and let the server take it apart with
``json_to_recordset``:

    INSERT INTO deliveries (source, delivery_id, ...)
    SELECT v.source, v.delivery_id, ... FROM json_to_recordset(%(rows)s::json)
        AS v(source text, delivery_id text, ...)
    ON CONFLICT (source, delivery_id) DO NOTHING RETURNING id, source, delivery_id

one text per table and shape, which psycopg prepares on the server once, and one parameter, a string
that Python's C JSON encoder writes (psycopg's array adapters, one Python call per value, cost the
receiver more than the statements' own execution). COPY does not return ids or skip conflicts. On
other databases (SQLite, the embedded default) they run SQLAlchemy's statements as before.

Rows come back in no particular order: a caller that needs to know which id is whose asks for a
unique column beside it (``returning=("id", "fingerprint")``).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    ColumnElement,
    Connection,
    DateTime,
    Float,
    Integer,
    String,
    Table,
    any_,
    bindparam,
    update,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import InstrumentedAttribute
from sqlalchemy.types import ARRAY, TypeDecorator, TypeEngine

from flaketriage.records.database import Query, fetch
from flaketriage.records.models import UTCDateTime

_POSTGRES_TYPES: tuple[tuple[type[TypeEngine[Any]], str], ...] = (
    # Text of any length: an explicit cast to varchar(n) would cut a longer value without a word,
    # where the column's own type refuses it.
    (String, "text"),
    (Integer, "integer"),
    (Float, "double precision"),
    (Boolean, "boolean"),
    (DateTime, "timestamptz"),  # ISO 8601 in the document
    # Serialized here as SQLAlchemy would (a None is JSON's null, not SQL's NULL), carried as a
    # string, and read back as json by the SELECT.
    (JSON, "text"),
)


def insert_rows(
    conn: Connection,
    model: type[Any],
    rows: Sequence[Mapping[str, Any]],
    *,
    returning: Sequence[str] = (),
    skip_conflicts_on: Sequence[str] | None = None,
) -> list[tuple[Any, ...]]:
    """Insert `rows` (dicts with the same keys) into the table of `model` (a mapped class) in one
    statement; a row whose `skip_conflicts_on` columns match one already there is skipped. The
    `returning` columns of the rows inserted, in no particular order."""
    if not rows:
        return []
    return fetch(
        conn, insert_query(conn, model, rows, returning=returning, skip_conflicts_on=skip_conflicts_on)
    )


def insert_query(
    conn: Connection,
    model: type[Any],
    rows: Sequence[Mapping[str, Any]],
    *,
    returning: Sequence[str] = (),
    skip_conflicts_on: Sequence[str] | None = None,
) -> Query:
    """The statement `insert_rows` runs, to run with others (`fetch_together`); `rows` not empty."""
    table = _table(model)
    columns = tuple(rows[0])
    if conn.dialect.name == "postgresql":
        sql = _recordset_insert(table, columns, tuple(returning), _optional(skip_conflicts_on))
        return Query(sql, _document(table, columns, rows, conn))
    # SQLite: the only other backend `Database` opens.
    statement: Any = sqlite.insert(table)
    if skip_conflicts_on is not None:
        statement = statement.on_conflict_do_nothing(index_elements=list(skip_conflicts_on))
    if returning:
        statement = statement.returning(*(table.c[c] for c in returning))
    return Query(statement, list(rows))


def update_rows(
    conn: Connection, model: type[Any], rows: Sequence[Mapping[str, Any]], *, key: str = "id"
) -> None:
    """Set, in each row of `model`'s table whose `key` is a row's, that row's other columns: one
    statement."""
    if not rows:
        return
    table = _table(model)
    columns = tuple(rows[0])
    if conn.dialect.name == "postgresql":
        fetch(conn, Query(_recordset_update(table, columns, key), _document(table, columns, rows, conn)))
        return
    statement = (
        update(table)
        .where(table.c[key] == bindparam(f"_{key}"))
        .values({c: bindparam(c) for c in columns if c != key})
    )
    conn.execute(statement, [{**row, f"_{key}": row[key]} for row in rows])


def one_of(
    column: ColumnElement[Any] | InstrumentedAttribute[Any], name: str
) -> dict[str, ColumnElement[bool]]:
    """By dialect: `column` is one of the values bound to `name` (a list). PostgreSQL compares with
    ``= ANY(array)``, one text for any number of values; elsewhere an IN list expanded per call."""
    return {
        "postgresql": column == any_(bindparam(name, type_=ARRAY(column.type))),
        "sqlite": column.in_(bindparam(name, expanding=True)),
    }


def _table(model: type[Any]) -> Table:
    table = getattr(model, "__table__", None)
    if not isinstance(table, Table):
        raise TypeError(f"{model!r} is not a mapped class with a table")
    return table


def _optional(columns: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if columns is None else tuple(columns)


def _column_type(table: Table, column: str) -> str:
    kind = table.c[column].type
    if isinstance(kind, TypeDecorator):
        kind = kind.impl_instance
    for base, name in _POSTGRES_TYPES:
        if isinstance(kind, base):
            return name
    raise TypeError(f"no recordset type for {table.name}.{column} ({kind!r})")


def _recordset(table: Table, columns: tuple[str, ...]) -> str:
    """The rows parameter taken apart, as ``v``."""
    fields = ", ".join(f"{c} {_column_type(table, c)}" for c in columns)
    return f"json_to_recordset(%(rows)s::json) AS v({fields})"


def _value(table: Table, column: str) -> str:
    return f"v.{column}::json" if isinstance(table.c[column].type, JSON) else f"v.{column}"


@functools.cache
def _recordset_insert(
    table: Table, columns: tuple[str, ...], returning: tuple[str, ...], conflict: tuple[str, ...] | None
) -> str:
    values = ", ".join(_value(table, c) for c in columns)
    sql = f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT {values} FROM {_recordset(table, columns)}"
    if conflict is not None:
        sql += f" ON CONFLICT ({', '.join(conflict)}) DO NOTHING"
    if returning:
        sql += f" RETURNING {', '.join(returning)}"
    return sql


@functools.cache
def _recordset_update(table: Table, columns: tuple[str, ...], key: str) -> str:
    sets = ", ".join(f"{c} = {_value(table, c)}" for c in columns if c != key)
    return f"UPDATE {table.name} AS t SET {sets} FROM {_recordset(table, columns)} WHERE t.{key} = v.{key}"


def _document(
    table: Table, columns: tuple[str, ...], rows: Sequence[Mapping[str, Any]], conn: Connection
) -> dict[str, str]:
    """The rows as one JSON array of objects, each value as the column's type would bind it.

    UTC timestamps (`UTCDateTime`, every timestamp of ours) are written by the encoder's `default`
    hook as it meets them, so a row whose other columns need nothing is not copied."""
    dialect = conn.dialect
    serialize = getattr(dialect, "_json_serializer", None) or json.dumps
    convert: list[tuple[str, Any]] = []
    for column in columns:
        kind = table.c[column].type
        if isinstance(kind, UTCDateTime):
            continue  # `_utc_iso`, by the encoder
        if isinstance(kind, TypeDecorator):
            convert.append((column, _decorated(kind, dialect)))
        elif isinstance(kind, JSON):
            convert.append((column, serialize))  # None too: a JSON null, as SQLAlchemy writes it
        elif isinstance(kind, DateTime):
            convert.append((column, _iso))
        elif isinstance(kind, Float):
            convert.append((column, _float))
    if not convert:
        return {"rows": json.dumps(rows if isinstance(rows, list) else list(rows), default=_utc_iso)}
    out = []
    for row in rows:
        row = dict(row)
        for column, fn in convert:
            row[column] = fn(row[column])
        out.append(row)
    return {"rows": json.dumps(out, default=_utc_iso)}


def _utc_iso(value: Any) -> str:
    """A `UTCDateTime` value in the document: a naive one is UTC, as that type binds it."""
    if isinstance(value, datetime):
        return (value if value.tzinfo is not None else value.replace(tzinfo=UTC)).isoformat()
    raise TypeError(f"{type(value).__name__} is not a value of any column type written in bulk")


def _decorated(kind: TypeDecorator[Any], dialect: Any) -> Any:
    inner = kind.impl_instance

    def convert(value: Any) -> Any:
        value = kind.process_bind_param(value, dialect)
        return _iso(value) if isinstance(inner, DateTime) else value

    return convert


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _float(value: Any) -> Any:
    """A float as the document carries it: JSON has no NaN or infinities, PostgreSQL reads them
    from text."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value
