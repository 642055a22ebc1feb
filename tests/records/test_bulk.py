"""Bulk writes (`flaketriage.records.bulk`) on both backends: the rows, conflicts and JSON they
write are what SQLAlchemy's own statements write, and on PostgreSQL one statement text serves
every batch size."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from sqlalchemy import select

from flaketriage.errors import RecordsError
from flaketriage.records import Case, Database, Delivery, Occurrence, ReplayRow, Work
from flaketriage.records.bulk import insert_rows, one_of, update_rows

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _delivery(n: int, source: str = "events") -> dict[str, object]:
    return {"source": source, "delivery_id": f"d-{n}", "kind": "failure.captured", "outcome": "recorded",
            "received_at": NOW}  # fmt: skip


def _case(fingerprint: str, **extra: object) -> dict[str, object]:
    return {"fingerprint": fingerprint, "cause_key": None, "kind": "bundle", "title": "t", "test_id": None,
            "job": None, "repository": None, "status": "open", "error": None, "generation": 0,
            "storm_of": None, "last_triage_at": None, "occurrences": 1, "last_seen": NOW,
            "first_seen": NOW} | extra  # fmt: skip


def test_insert_skips_conflicts_and_returns_what_it_inserted(database: Database) -> None:
    with database.transaction() as conn:
        first = insert_rows(
            conn, Delivery, [_delivery(1), _delivery(2)],
            returning=("id", "delivery_id"), skip_conflicts_on=("source", "delivery_id"),
        )  # fmt: skip
    # d-2 is there already, d-3 twice in one call, and d-1 of another source is another delivery.
    with database.transaction() as conn:
        second = insert_rows(
            conn, Delivery, [_delivery(2), _delivery(3), _delivery(3), _delivery(1, "github")],
            returning=("id", "source", "delivery_id"), skip_conflicts_on=("source", "delivery_id"),
        )  # fmt: skip
    assert sorted(d for _, d in first) == ["d-1", "d-2"]
    assert sorted((s, d) for _, s, d in second) == [("events", "d-3"), ("github", "d-1")]
    with database.session() as session:
        rows = session.execute(select(Delivery.id, Delivery.source, Delivery.delivery_id)).all()
    assert sorted(tuple(r) for r in rows) == sorted([*((id_, "events", d) for id_, d in first), *second])


def test_json_datetimes_and_nulls_read_back_as_the_orm_writes_them(database: Database) -> None:
    provenance = {"ci": "github", "nested": {"list": [1, 2.5, None]}, "nul": "a\x00b", "é": "ü"}
    naive = datetime(2026, 3, 1, 12, 0)  # taken as UTC, as the column type takes it
    elsewhere = datetime(2026, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    with database.transaction() as conn:
        ((case_id,),) = insert_rows(conn, Case, [_case("f" * 64, last_triage_at=naive)], returning=("id",))
        insert_rows(conn, Occurrence, [
            {"case_id": case_id, "source": "events", "delivery_id": "x", "bundle_id": None, "store_url": None,
             "test_id": None, "provenance": provenance, "received_at": elsewhere},
        ])  # fmt: skip
        ((work_id,),) = insert_rows(conn, Work, [
            {"key": "k", "case_id": case_id, "bundle_id": None, "store_url": None, "step": "triage",
             "queue": "cpu", "status": "queued", "attempts": 0, "batch": 0, "options": {}, "result": None,
             "created_at": NOW, "sent_at": NOW},
        ], returning=("id",))  # fmt: skip
    with database.session() as session:
        occurrence = session.scalars(select(Occurrence)).one()
        case = session.get(Case, case_id)
        work = session.get(Work, work_id)
        assert occurrence.provenance == provenance and occurrence.received_at == NOW
        assert case is not None and case.last_triage_at == NOW and case.cause_key is None
        assert work is not None and work.options == {}
        # A None in a JSON column is JSON's null, as SQLAlchemy writes it: read back as None too.
        assert work.result is None


def test_floats_that_json_cannot_hold_are_written_too(database: Database) -> None:
    with database.transaction() as conn:
        ((case_id,),) = insert_rows(conn, Case, [_case("f")], returning=("id",))
        ((work_id,),) = insert_rows(conn, Work, [
            {"key": "k", "case_id": case_id, "bundle_id": None, "store_url": None, "step": "triage",
             "queue": "cpu", "status": "queued", "attempts": 0, "batch": 0, "options": {}, "result": None,
             "created_at": NOW, "sent_at": NOW},
        ], returning=("id",))  # fmt: skip
        durations = [1.5, math.nan, math.inf, -math.inf, None]
        insert_rows(conn, ReplayRow, [
            {"work_id": work_id, "idx": i, "batch": 0, "duration_s": d, "created_at": NOW}
            for i, d in enumerate(durations)
        ])  # fmt: skip
    with database.session() as session:
        read = session.scalars(select(ReplayRow.duration_s).order_by(ReplayRow.idx)).all()
    assert read[0] == 1.5 and read[2:] == [math.inf, -math.inf, None]
    if database.is_sqlite:  # SQLite has no NaN: it stores NULL, through SQLAlchemy's own statement too
        assert read[1] is None
    else:
        assert read[1] is not None and math.isnan(read[1])


def test_update_sets_the_listed_rows_only(database: Database) -> None:
    with database.transaction() as conn:
        created = insert_rows(
            conn, Case, [_case("a"), _case("b"), _case("c")], returning=("id", "fingerprint")
        )
    ids = {fingerprint: id_ for id_, fingerprint in created}
    later = NOW + timedelta(hours=1)
    with database.transaction() as conn:
        update_rows(conn, Case, [
            {"id": ids["a"], "status": "queued", "occurrences": 5, "last_triage_at": later, "error": None},
            {"id": ids["c"], "status": "failed", "occurrences": 2, "last_triage_at": None, "error": "boom"},
        ])  # fmt: skip
    with database.session() as session:
        got = {
            c.fingerprint: (c.status, c.occurrences, c.last_triage_at, c.error)
            for c in session.scalars(select(Case))
        }
    assert got == {
        "a": ("queued", 5, later, None),
        "b": ("open", 1, None, None),
        "c": ("failed", 2, None, "boom"),
    }


def test_one_of_matches_any_number_of_values(database: Database) -> None:
    with database.transaction() as conn:
        created = insert_rows(conn, Case, [_case(f"c{i}") for i in range(5)], returning=("id", "fingerprint"))
        statement = select(Case.fingerprint).where(one_of(Case.id, "ids")[conn.dialect.name])
        picked = sorted(id_ for id_, f in created if f in ("c1", "c3"))
        assert sorted(conn.execute(statement, {"ids": picked}).scalars()) == ["c1", "c3"]
        assert list(conn.execute(statement, {"ids": []}).scalars()) == []


def test_nothing_to_write_writes_nothing(database: Database) -> None:
    with database.transaction() as conn:
        assert insert_rows(conn, Delivery, [], returning=("id",)) == []
        update_rows(conn, Case, [])
    with database.session() as session:
        assert session.scalars(select(Delivery)).all() == []


def test_a_value_too_long_for_its_column_is_refused_not_cut(postgres_database: Database) -> None:
    # An explicit cast to varchar(128) would cut the value silently: the arrays are text, and the
    # column's own length check refuses it.
    with pytest.raises(RecordsError, match="too long"), postgres_database.transaction() as conn:
        insert_rows(conn, Case, [_case("f" * 129)])
    with postgres_database.session() as session:
        assert session.scalars(select(Case)).all() == []


def test_postgresql_sends_one_statement_text_for_every_batch_size(
    postgres_database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen where the driver gets it: in a transaction the statements go around SQLAlchemy.
    seen: list[str] = []
    execute = psycopg.Cursor.execute

    def remember(cursor: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(query))
        return execute(cursor, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", remember)
    for size in (1, 7, 100):
        with postgres_database.transaction() as conn:
            rows = [_delivery(n, f"s{size}") for n in range(size)]
            inserted = insert_rows(conn, Delivery, rows, returning=("id",),
                                   skip_conflicts_on=("source", "delivery_id"))  # fmt: skip
            assert len(inserted) == size
    inserts = {s for s in seen if s.startswith("INSERT")}
    assert len(inserts) == 1 and "json_to_recordset(" in next(iter(inserts))
