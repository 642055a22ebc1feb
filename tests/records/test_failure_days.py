"""Failures per day by verdict (`flaketriage.records.failure_days`): the roll-up gives the answer the
occurrences give, today and the days not rolled up yet are counted live, and a verdict given after a
roll-up moves the earlier days at the next one; on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import select

from flaketriage.records import Case, Database, Occurrence
from flaketriage.records.failure_days import KEEP_DAYS, failures_by_day, roll_up_failures
from flaketriage.records.models import FailureDayRow

NOW = datetime(2026, 6, 15, 12, 30, tzinfo=UTC)
TODAY = NOW.date()
_serial = itertools.count()


def _case(database: Database, verdict: str | None, days_ago: list[float]) -> int:
    """A case with `verdict` and one occurrence at each of `days_ago` (fractions: hours into it)."""
    with database.session() as session:
        case = Case(fingerprint=f"fp-{next(_serial)}", kind="bundle", verdict=verdict, status="reported")
        session.add(case)
        session.flush()
        for ago in days_ago:
            session.add(
                Occurrence(
                    case_id=case.id,
                    source="events",
                    delivery_id=f"d-{next(_serial)}",
                    received_at=NOW - timedelta(days=ago),
                )
            )
        return case.id


def _expected(database: Database, days: int = 30) -> dict[date, dict[str | None, int]]:
    """What the occurrences say, counted here one by one."""
    first = TODAY - timedelta(days=days - 1)
    counted: dict[date, Counter[str | None]] = {}
    with database.session() as session:
        for received, verdict in session.execute(
            select(Occurrence.received_at, Case.verdict).join(Case, Case.id == Occurrence.case_id)
        ):
            day = received.astimezone(UTC).date()
            if first <= day <= TODAY:
                counted.setdefault(day, Counter())[verdict] += 1
    return {day: dict(c) for day, c in counted.items()}


def _world(database: Database) -> dict[str, int]:
    return {
        "flaky": _case(database, "flaky", [0, 0.4, 1, 1, 2, 29, 31]),  # 0.4 days ago: 02:54 today
        "deterministic": _case(database, "deterministic", [0.53, 3, 3, 3, 12]),  # 0.53: yesterday 23:47
        "undecided": _case(database, None, [0, 5]),
    }


def _answer(database: Database) -> dict[date, dict[str | None, int]]:
    with database.session() as session:
        return failures_by_day(session, TODAY)


def test_the_roll_up_gives_what_the_occurrences_give(database: Database) -> None:
    _world(database)
    live = _answer(database)
    assert live == _expected(database)
    assert live[TODAY] == {"flaky": 2, None: 1} and TODAY - timedelta(days=31) not in live
    with database.session() as session:
        written = roll_up_failures(session, now=NOW)
    with database.session() as session:
        rows = session.scalars(select(FailureDayRow)).all()
    assert written == len(rows) > 0
    assert all(TODAY - timedelta(days=30) <= row.day < TODAY for row in rows)  # complete days only
    assert {(r.day, r.verdict): r.failures for r in rows}[(TODAY - timedelta(days=3), "deterministic")] == 3
    assert _answer(database) == live


def test_today_and_the_days_after_the_last_roll_up_are_counted_live(database: Database) -> None:
    _world(database)
    with database.session() as session:
        roll_up_failures(session, now=NOW - timedelta(days=4))  # beat stopped four days ago
    _case(database, "flaky", [0, 1, 2, 3])  # failures since, on days it never rolled up
    assert _answer(database) == _expected(database)


def test_a_verdict_given_after_a_roll_up_moves_the_earlier_days_at_the_next(database: Database) -> None:
    cases = _world(database)
    with database.session() as session:
        roll_up_failures(session, now=NOW)
    with database.session() as session:
        session.get_one(Case, cases["undecided"]).verdict = "order_dependent"
    answer = _answer(database)
    assert answer[TODAY] == {"flaky": 2, "order_dependent": 1}  # today: live, as it is now
    assert answer[TODAY - timedelta(days=5)] == {None: 1}  # as of the roll-up
    with database.session() as session:
        roll_up_failures(session, now=NOW)
    assert _answer(database) == _expected(database)


def test_rows_older_than_kept_are_deleted_and_two_roll_ups_write_once(database: Database) -> None:
    _case(database, "flaky", [KEEP_DAYS + 20, 2])
    with database.session() as session:
        roll_up_failures(session, now=NOW - timedelta(days=KEEP_DAYS))  # counted then
    with database.session() as session:
        assert session.scalars(select(FailureDayRow.day)).all() == [TODAY - timedelta(days=KEEP_DAYS + 20)]
    for _ in range(2):
        with database.session() as session:
            roll_up_failures(session, now=NOW)
    with database.session() as session:
        assert session.scalars(select(FailureDayRow.day)).all() == [TODAY - timedelta(days=2)]
