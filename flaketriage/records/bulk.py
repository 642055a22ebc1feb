"""Writing many rows in one statement whose text is the same however many rows there are.

SQLAlchemy writes a batch of rows as one ``INSERT ... VALUES (...), (...), ...``: a statement whose
text grows with the batch, so the driver parses and converts it anew every time (for the receiver's
batches, a third of its recording time went to psycopg reading its own query text). On PostgreSQL
these functions send every column as one array instead and let the server take them apart with
``unnest``:

    INSERT INTO deliveries (source, delivery_id, ...)
    SELECT * FROM unnest(%(source)b::text[], %(delivery_id)b::text[], ...)
    ON CONFLICT (source, delivery_id) DO NOTHING RETURNING id, source, delivery_id

one text per table and shape, which psycopg converts once and prepares on the server, the way
high-volume PostgreSQL writers batch (COPY does not return ids or skip conflicts). On other
databases (SQLite, the embedded default) they run SQLAlchemy's statements as before.

Rows come back in no particular order: a caller that needs to know which id is whose asks for a
unique column beside it (``returning=("id", "fingerprint")``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
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

_POSTGRES_ARRAYS: tuple[tuple[type[TypeEngine[Any]], str], ...] = (
    # Text of any length: an explicit cast to varchar(n) would cut a longer value without a word,
    # where the column's own type refuses it.
    (String, "text"),
    (Integer, "integer"),
    (Float, "double precision"),
    (Boolean, "boolean"),
    (DateTime, "timestamptz"),
    (JSON, "text"),  # serialized here as SQLAlchemy would, read back as json by the SELECT
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
    table = _table(model)
    columns = tuple(rows[0])
    if conn.dialect.name == "postgresql":
        sql = _unnest_insert(table, columns, tuple(returning), _optional(skip_conflicts_on))
        result = conn.exec_driver_sql(sql, _arrays(table, columns, rows, conn))
        return [tuple(row) for row in result] if returning else []
    # SQLite: the only other backend `Database` opens.
    statement: Any = sqlite.insert(table)
    if skip_conflicts_on is not None:
        statement = statement.on_conflict_do_nothing(index_elements=list(skip_conflicts_on))
    if returning:
        result = conn.execute(statement.returning(*(table.c[c] for c in returning)), list(rows))
        return [tuple(row) for row in result]
    conn.execute(statement, list(rows))
    return []


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
        sql = _unnest_update(table, columns, key)
        conn.exec_driver_sql(sql, _arrays(table, columns, rows, conn))
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


def _array_type(table: Table, column: str) -> str:
    kind = table.c[column].type
    if isinstance(kind, TypeDecorator):
        kind = kind.impl_instance
    for base, name in _POSTGRES_ARRAYS:
        if isinstance(kind, base):
            return name
    raise TypeError(f"no array type for {table.name}.{column} ({kind!r})")


@functools.cache
def _unnest_insert(
    table: Table, columns: tuple[str, ...], returning: tuple[str, ...], conflict: tuple[str, ...] | None
) -> str:
    arrays = ", ".join(f"%({c})b::{_array_type(table, c)}[]" for c in columns)
    values = ", ".join(f"v.{c}::json" if isinstance(table.c[c].type, JSON) else f"v.{c}" for c in columns)
    sql = (
        f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT {values} "
        f"FROM unnest({arrays}) AS v({', '.join(columns)})"
    )
    if conflict is not None:
        sql += f" ON CONFLICT ({', '.join(conflict)}) DO NOTHING"
    if returning:
        sql += f" RETURNING {', '.join(returning)}"
    return sql


@functools.cache
def _unnest_update(table: Table, columns: tuple[str, ...], key: str) -> str:
    arrays = ", ".join(f"%({c})b::{_array_type(table, c)}[]" for c in columns)
    sets = ", ".join(
        f"{c} = v.{c}::json" if isinstance(table.c[c].type, JSON) else f"{c} = v.{c}"
        for c in columns
        if c != key
    )
    return (
        f"UPDATE {table.name} AS t SET {sets} FROM unnest({arrays}) AS v({', '.join(columns)}) "
        f"WHERE t.{key} = v.{key}"
    )


def _arrays(
    table: Table, columns: tuple[str, ...], rows: Sequence[Mapping[str, Any]], conn: Connection
) -> dict[str, list[Any]]:
    """The rows as one list per column, each value as the column's type would bind it."""
    dialect = conn.dialect
    serialize = getattr(dialect, "_json_serializer", None) or json.dumps
    arrays: dict[str, list[Any]] = {}
    for column in columns:
        kind = table.c[column].type
        values = [row[column] for row in rows]
        if isinstance(kind, TypeDecorator):
            values = [kind.process_bind_param(v, dialect) for v in values]
        elif isinstance(kind, JSON):
            values = [serialize(v) for v in values]  # None too: a JSON null, as SQLAlchemy writes it
        arrays[column] = values
    return arrays
