"""`Database` (`flaketriage.records.database`).

* `Database.transaction` in psycopg's pipeline mode on PostgreSQL: statements read as they would be
  without it, `deferred` ones answered with the COMMIT in one round trip, an error in a deferred
  statement rolls the whole transaction back; on SQLite the same calls behave the same.
* A service process started before its database answers waits for it (`Database.upgrade_when_up`)
  instead of exiting: workers restarted while PostgreSQL restarts came up as nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Connection, func, insert, inspect, select, update
from sqlalchemy.exc import IntegrityError

from flaketriage.errors import RecordsError
from flaketriage.records import Database, Delivery
from flaketriage.records.bulk import insert_query, insert_rows, update_rows
from flaketriage.records.database import Query, deferred, fetch, fetch_together

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _row(n: int) -> dict[str, object]:
    return {
        "source": "events",
        "delivery_id": f"d-{n}",
        "kind": "k",
        "outcome": "recorded",
        "received_at": NOW,
    }


def _next_transaction_works(database: Database) -> None:
    """The pool's connection (or its replacement) is fit for the next transaction."""
    with database.transaction() as conn:
        conn.execute(insert(Delivery), [_row(9)])
    assert _count(database) == 1


def _count(database: Database) -> int:
    with database.session() as session:
        return int(session.scalar(select(func.count()).select_from(Delivery)) or 0)


def _deliveries(database: Database) -> list[tuple[str, str, str]]:
    """Each delivery's id, outcome and kind, in order."""
    with database.session() as session:
        rows = session.execute(select(Delivery.delivery_id, Delivery.outcome, Delivery.kind)).all()
    return sorted((r[0], r[1], r[2]) for r in rows)


def _counted_syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    syncs: list[int] = []
    original = psycopg.Pipeline.sync

    def counting(self: psycopg.Pipeline) -> None:
        syncs.append(1)
        original(self)

    monkeypatch.setattr(psycopg.Pipeline, "sync", counting)
    return syncs


def _kill_backend(database: Database, conn: Connection) -> None:
    """End the server process behind `conn`, as a server restart would."""
    pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    with database.engine.connect() as other:
        other.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid or 0)})")


def test_deferred_writes_commit_and_later_reads_see_them(database: Database) -> None:
    with database.transaction() as conn:
        ids = conn.execute(insert(Delivery).returning(Delivery.id), [_row(1)]).scalars().all()
        with deferred(conn):
            conn.execute(insert(Delivery), [_row(2), _row(3)])
            conn.execute(update(Delivery).where(Delivery.id == ids[0]).values(outcome="accepted"))
        # Read after the deferred block: answered together with them, and sees them.
        assert conn.execute(select(func.count()).select_from(Delivery)).scalar() == 3
        with deferred(conn):
            conn.execute(update(Delivery).values(kind="done"))
    assert _deliveries(database) == [
        ("d-1", "accepted", "done"),
        ("d-2", "recorded", "done"),
        ("d-3", "recorded", "done"),
    ]


def test_an_error_in_a_deferred_statement_rolls_back_everything(database: Database) -> None:
    with pytest.raises(RecordsError, match="failed") as caught, database.transaction() as conn:
        conn.execute(insert(Delivery), [_row(1)])
        with deferred(conn):
            conn.execute(insert(Delivery), [_row(2)])
            conn.execute(insert(Delivery), [_row(2)])  # the same delivery twice: unique violation
    assert "IntegrityError" in type(caught.value.__cause__).__name__
    assert _count(database) == 0
    _next_transaction_works(database)


def test_deferred_statements_wait_for_no_answer_of_their_own(
    postgres_database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL: every statement read is one sync of the pipeline; deferred ones add none."""
    syncs = _counted_syncs(monkeypatch)
    with postgres_database.transaction() as conn:
        conn.execute(insert(Delivery), [_row(1)])
        assert len(syncs) == 1
        with deferred(conn):
            for n in range(2, 6, 2):
                conn.execute(insert(Delivery), [_row(n), _row(n + 1)])
            conn.execute(update(Delivery).values(kind="done"))
        assert len(syncs) == 1
        with deferred(conn):  # one row: SQLAlchemy reads its new key back, so it is answered now
            result = conn.execute(insert(Delivery), [_row(9)])
        assert len(syncs) == 2 and result.inserted_primary_key is not None
    assert _count(postgres_database) == 6


def test_fetched_statements_in_a_transaction_go_to_the_driver_and_deferred_ones_wait_with_the_next(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fetch` (and what runs on it: `insert_rows`, `update_rows`) in a transaction: a deferred write
    is not waited for, a statement that returns rows is answered at once, deferred or not."""
    syncs = _counted_syncs(monkeypatch)
    with database.transaction() as conn:
        with deferred(conn):
            assert insert_rows(conn, Delivery, [_row(1), _row(2)]) == []
            ids = insert_rows(conn, Delivery, [_row(3)], returning=("delivery_id",))
            counted = fetch(conn, Query(select(func.count()).where(Delivery.kind == "k"), {}))
            update_rows(conn, Delivery, [{"id": 1, "outcome": "accepted"}])
            fetch(conn, Query(update(Delivery).values(kind="done"), {}))
        assert ids == [("d-3",)] and counted == [(3,)]
        if not database.is_sqlite:
            assert len(syncs) == 2  # the RETURNING and the count; the writes wait for the COMMIT
    assert _deliveries(database) == [
        ("d-1", "accepted", "done"),
        ("d-2", "recorded", "done"),
        ("d-3", "recorded", "done"),
    ]


def test_an_error_in_a_deferred_fetched_statement_rolls_back_everything(database: Database) -> None:
    with pytest.raises(RecordsError, match="failed") as caught, database.transaction() as conn:
        insert_rows(conn, Delivery, [_row(1)], returning=("id",))
        with deferred(conn):
            insert_rows(conn, Delivery, [_row(2)])
            insert_rows(conn, Delivery, [_row(2)])  # the same delivery twice: unique violation
    assert isinstance(caught.value.__cause__, IntegrityError)
    assert _count(database) == 0
    _next_transaction_works(database)


def test_a_lost_connection_is_a_records_error_and_the_next_transaction_works(
    postgres_database: Database,
) -> None:
    with pytest.raises(RecordsError, match="failed"), postgres_database.transaction() as conn:
        conn.execute(insert(Delivery), [_row(1)])
        _kill_backend(postgres_database, conn)
        with deferred(conn):  # two rows: nothing read back, the lost connection shows at COMMIT
            conn.execute(insert(Delivery), [_row(2), _row(3)])
    _next_transaction_works(postgres_database)


def test_without_pipeline_support_deferred_statements_run_as_usual(
    postgres_database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A libpq without pipeline mode: the same transaction, each statement answered as it runs."""
    monkeypatch.setattr(psycopg.Pipeline, "is_supported", classmethod(lambda cls: False))
    with postgres_database.transaction() as conn:
        assert conn.connection.driver_connection._pipeline is None  # type: ignore[union-attr]
        with deferred(conn):
            conn.execute(insert(Delivery), [_row(1), _row(2)])
        assert conn.execute(select(func.count()).select_from(Delivery)).scalar() == 2
    assert _count(postgres_database) == 2


def test_queries_fetched_together_read_as_one_at_a_time(database: Database) -> None:
    """Core statements and driver SQL, with rows or without, in order: each one's rows."""
    with database.transaction() as conn:
        written = insert_query(conn, Delivery, [_row(1), _row(2)], returning=("delivery_id",))
        count = select(func.count()).select_from(Delivery)
        mark = update(Delivery).where(Delivery.delivery_id == "d-1").values(outcome="accepted")
        answers = fetch_together(
            conn, [written, Query(count, {}), Query(mark, {}), Query(select(Delivery.outcome), {})]
        )
    assert sorted(answers[0]) == [("d-1",), ("d-2",)]
    assert answers[1] == [(2,)]
    assert answers[2] == []
    assert sorted(answers[3]) == [("accepted",), ("recorded",)]


def test_on_postgresql_queries_fetched_together_are_one_round_trip(
    postgres_database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs = _counted_syncs(monkeypatch)
    with postgres_database.transaction() as conn:
        with deferred(conn):
            conn.execute(insert(Delivery), [_row(1), _row(2)])
        queries = [
            Query("SELECT count(*) FROM deliveries", {}),
            Query(select(Delivery.delivery_id).where(Delivery.delivery_id == "d-2"), {}),
            Query("SELECT %(n)s::int + 1", {"n": 41}),
        ]
        assert fetch_together(conn, queries) == [[(2,)], [("d-2",)], [(42,)]]
        assert len(syncs) == 1


def test_an_error_in_queries_fetched_together_rolls_back_everything(database: Database) -> None:
    """A unique violation among them is SQLAlchemy's IntegrityError (the intake tries its batch
    again on one); nothing of the transaction stays; the connection serves the next one."""
    with pytest.raises(RecordsError, match="failed") as caught, database.transaction() as conn:
        conn.execute(insert(Delivery), [_row(1)])
        fetch_together(
            conn,
            [Query(select(func.count()).select_from(Delivery), {}), insert_query(conn, Delivery, [_row(1)])],
        )
    assert isinstance(caught.value.__cause__, IntegrityError)
    assert _count(database) == 0
    _next_transaction_works(database)


def test_a_connection_lost_before_queries_fetched_together_is_a_records_error(
    postgres_database: Database,
) -> None:
    with pytest.raises(RecordsError, match="failed"), postgres_database.transaction() as conn:
        conn.execute(insert(Delivery), [_row(1)])
        _kill_backend(postgres_database, conn)
        fetch_together(conn, [Query("SELECT 1", {})])
    _next_transaction_works(postgres_database)


def _read(database: Database) -> None:
    _count(database)


def _read_together(database: Database) -> None:
    with database.transaction() as conn:
        fetch_together(conn, [Query("SELECT 1", {})])


def _write_deferred(database: Database) -> None:
    with database.transaction() as conn, deferred(conn):
        conn.execute(insert(Delivery), [_row(1), _row(2)])


@pytest.mark.parametrize("first", [_read, _read_together, _write_deferred])
def test_after_a_lost_connection_the_pooled_ones_are_checked_before_use(
    postgres_database: Database, first: Callable[[Database], None]
) -> None:
    """A server restart kills every pooled connection: the one request that meets it first fails,
    and none after it does, even those whose connection was used a moment before the restart."""
    database = postgres_database
    held = [database.engine.connect() for _ in range(3)]
    pids = [int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar() or 0) for conn in held]
    for conn in held:
        conn.close()
    url = database.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as killer:  # not one of the pool's
        for pid in pids:
            killer.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(RecordsError, match="failed"):
        first(database)
    for _ in range(2):
        with database.transaction() as conn:
            assert fetch_together(conn, [Query("SELECT 1", {})]) == [[(1,)]]
        database.ping()
        assert _count(database) == 0


# -- waiting for the database: `Database.upgrade_when_up` ------------------------------------------
def test_the_schema_is_made_once_the_database_answers(tmp_path: Path) -> None:
    path = tmp_path / "service.db"
    path.mkdir()  # SQLite cannot open a directory: a database that does not answer yet
    database = Database(f"sqlite:///{path}")
    said: list[str] = []

    def say(text: str) -> None:
        said.append(text)
        path.rmdir()  # the database comes up while the process waits

    database.upgrade_when_up(30, say, every_s=0.01)

    assert len(said) == 1 and "FLAKETRIAGE_DATABASE_WAIT_S" in said[0], said
    assert "cases" in inspect(database.engine).get_table_names()
    database.dispose()


def test_a_database_that_never_answers_is_the_last_error_after_the_wait(tmp_path: Path) -> None:
    (tmp_path / "service.db").mkdir()
    database = Database(f"sqlite:///{tmp_path / 'service.db'}")
    said: list[str] = []

    with pytest.raises(RecordsError, match="could not create or upgrade the schema"):
        database.upgrade_when_up(0.2, said.append, every_s=0.05)

    assert said, "each failed try is said before the next"
    with pytest.raises(RecordsError):
        database.upgrade_when_up(0, said.append)  # no wait: the first failure is the answer
    database.dispose()
