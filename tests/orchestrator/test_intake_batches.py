"""Group commit keeps the rules: deliveries recorded in one batch leave the same records, answers and
tasks as the same deliveries recorded one at a time, on both backends (the batch reads its cases
once, decides in memory and writes back a statement per table)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text

from flaketriage.orchestrator.intake import Intake, IntakeResult, Item, Sighting, Trigger
from flaketriage.records import Base, Database
from flaketriage.work.dispatch import Dispatcher, MemorySender

NOW = datetime(2026, 1, 1, tzinfo=UTC)
FAILURES = 8
"""Failures 0, 2, 4, 6 share one cause, 1 and 5 another (storms); 3 and 7 have none."""


def _sighting(failure: int, bundle: str | None, trigger: Trigger, serial: int) -> Sighting:
    return Sighting(
        fingerprint=f"failure-{failure}",
        kind="bundle",
        title=f"failure {failure}",
        cause_key=None if failure % 4 == 3 else f"cause-{failure % 2}",
        test_id=f"tests/test_x.py::test_{failure}",
        repository="acme/trainer",
        bundle_id=bundle,
        store_url="file:///store" if bundle else None,
        provenance={"serial": serial},
        trigger=trigger,
        reply_to={"issue": serial} if trigger == "always" else None,
    )


@st.composite
def _deliveries(draw: st.DrawFn) -> list[Item]:
    """Deliveries that repeat each other, sight a failure twice, ask for triages and start storms."""
    raw = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["events", "github"]),
                st.sampled_from([f"delivery-{i}" for i in range(8)]),
                st.lists(
                    st.tuples(
                        st.integers(0, FAILURES - 1),
                        st.sampled_from([None, "b1", "b2"]),
                        st.sampled_from(["auto", "auto", "auto", "always", "never"]),
                    ),
                    max_size=3,
                ),
            ),
            min_size=1,
            max_size=10,
        )
    )
    serial = iter(range(10_000))
    return [
        (source, delivery, "kind", [_sighting(f, b, t, next(serial)) for f, b, t in sightings])  # type: ignore[arg-type]
        for source, delivery, sightings in raw
    ]


def _empty(database: Database) -> None:
    tables = [table.name for table in Base.metadata.sorted_tables]
    with database.engine.begin() as conn:
        if database.is_sqlite:  # ids start at 1 again: SQLite gives max(id) + 1
            for table in reversed(tables):
                conn.execute(text(f"DELETE FROM {table}"))
        else:
            conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))


def _records(database: Database) -> dict[str, list[dict[str, Any]]]:
    """Every row, in order; work and deliveries without their ids: a row that was there already
    (a delivery repeated, work asked for again) may take a number from PostgreSQL's sequence, and
    one at a time asks more often than a batch does."""
    out: dict[str, list[dict[str, Any]]] = {}
    with database.engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            rows = [row._asdict() for row in conn.execute(select(table).order_by(*table.primary_key))]
            if table.name in ("work", "deliveries"):
                rows = [{k: v for k, v in r.items() if k != "id"} for r in rows]
            out[table.name] = rows
    return out


def _run(
    database: Database, history: list[Item], deliveries: list[Item], window: float, *, batch: bool
) -> Any:
    _empty(database)
    sender = MemorySender()
    intake = Intake(
        database,
        Dispatcher(database, sender, clock=lambda: NOW),
        retriage_after_s=3600,
        storm_window_s=window,
        clock=lambda: NOW,
    )
    intake.record_batch(history)
    sender.take()
    results: list[IntakeResult] = (
        intake.record_batch(deliveries) if batch else [intake.record(*item) for item in deliveries]
    )
    with database.engine.connect() as conn:
        keys = dict(conn.execute(text("SELECT id, key FROM work")).all())
    answers = [(str(r.outcome), r.cases, [keys[w] for w in r.work]) for r in results]
    sent = [(name, keys[order.work_id], queue) for name, order, queue in sender.sent]
    return answers, sent, _records(database)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=_deliveries(), deliveries=_deliveries(), window=st.sampled_from([0, 600]))
def test_a_batch_is_recorded_as_its_deliveries_one_at_a_time(
    database: Database, history: list[Item], deliveries: list[Item], window: float
) -> None:
    assert _run(database, history, deliveries, window, batch=True) == _run(
        database, history, deliveries, window, batch=False
    )


def test_a_storm_follower_a_request_triages_leads_the_cases_after_it_in_the_same_batch(
    database: Database,
) -> None:
    """Failure 2 follows failure 4's storm until a request triages it: from then on it leads, so a
    new case of the cause later in the batch follows it, as it would one delivery at a time (found
    by the property test above)."""
    history: list[Item] = [
        ("events", "d0", "kind", [_sighting(2, None, "auto", 0), _sighting(4, "b1", "auto", 1)])
    ]
    deliveries: list[Item] = [
        ("events", "d1", "kind", [_sighting(2, "b1", "auto", 2), _sighting(2, "b1", "always", 3)]),
        ("github", "d0", "kind", [_sighting(0, "b1", "auto", 4)]),
    ]
    batched = _run(database, history, deliveries, 600, batch=True)
    assert batched == _run(database, history, deliveries, 600, batch=False)
    storm_of = {c["fingerprint"]: c["storm_of"] for c in batched[2]["cases"]}
    leader = {c["fingerprint"]: c["id"] for c in batched[2]["cases"]}["failure-2"]
    assert storm_of == {"failure-2": None, "failure-4": None, "failure-0": leader}


@pytest.mark.parametrize("batch", [True, False], ids=["batch", "one-at-a-time"])
def test_a_storm_leader_from_before_leads_the_cases_a_batch_triages_too(
    database: Database, batch: bool
) -> None:
    """The first case of a cause triaged within the window leads its storm, even when the batch
    itself triages a later case of that cause (asked for explicitly) before another one comes."""
    history = [("events", "first", "kind", [_sighting(0, "b1", "auto", 0)])]
    deliveries: list[Item] = [
        ("github", "asked", "kind", [_sighting(2, "b1", "always", 1)]),
        ("events", "storm", "kind", [_sighting(4, "b1", "auto", 2)]),
    ]

    answers, _, records = _run(database, history, deliveries, 600, batch=batch)

    leader, asked, follower = records["cases"]
    assert (asked["storm_of"], asked["status"]) == (None, "queued")
    assert follower["storm_of"] == leader["id"]
    assert [outcome for outcome, _, _ in answers] == ["accepted", "recorded"]


def test_a_case_created_and_followed_in_one_batch_points_to_its_leader(database: Database) -> None:
    """Both cases are new: the follower is written before its leader has an id, then pointed to it."""
    deliveries: list[Item] = [
        ("events", "one", "kind", [_sighting(0, "b1", "auto", 0)]),
        ("events", "two", "kind", [_sighting(2, "b1", "auto", 1)]),
    ]

    answers, sent, records = _run(database, [], deliveries, 600, batch=True)

    leader, follower = records["cases"]
    assert (leader["storm_of"], follower["storm_of"]) == (None, leader["id"])
    assert (leader["status"], follower["status"]) == ("queued", "queued")
    assert [outcome for outcome, _, _ in answers] == ["accepted", "recorded"]
    assert [key for _, key, _ in sent] == [f"triage:{leader['id']}:g0"]


def test_cases_created_by_a_batch_are_numbered_in_the_order_first_sighted(database: Database) -> None:
    deliveries: list[Item] = [
        ("events", str(n), "kind", [_sighting(failure, "b1", "auto", n)])
        for n, failure in enumerate([5, 1, 3])
    ]

    answers, _, records = _run(database, [], deliveries, 0, batch=True)

    assert [(c["id"], c["fingerprint"]) for c in records["cases"]] == [
        (1, "failure-5"),
        (2, "failure-1"),
        (3, "failure-3"),
    ]
    assert [cases for _, cases, _ in answers] == [(1,), (2,), (3,)]
    assert timedelta(0) == records["cases"][0]["first_seen"] - NOW
