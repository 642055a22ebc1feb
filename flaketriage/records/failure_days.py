"""Failures per day by verdict (the dashboard overview's chart), rolled up so that it costs the same
at a million occurrences as at ten.

Counting the occurrences of the last 30 days and joining each to its case's verdict grows with
them: a third of a million took ~115 ms on PostgreSQL. Complete UTC days are rolled up instead
(`roll_up_failures`, by beat every ``FLAKETRIAGE_FAILURE_DAYS_EVERY_S``) into ``failure_days``, one
row per day and verdict; `failures_by_day` reads those rows for the days they cover and counts the
occurrences live only after the last day rolled up (today, and any day the roll-up has not reached
yet). The counts are right whether beat runs or not; what a roll-up cannot know in advance is a
verdict given later: a case decided since the last roll-up moves its earlier days' failures to its
new verdict at the next one.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy import ColumnElement, delete, func, insert, select, text
from sqlalchemy.orm import Session

from flaketriage.records.models import Case, FailureDayRow, Occurrence

FAILURE_DAYS = 30
"""The complete days each roll-up counts again (the overview looks back as far)."""
KEEP_DAYS = 400
"""Rows of days older than this are deleted."""
_LOCK = 0x66_61_69_6C
"""The PostgreSQL advisory lock one roll-up holds at a time (two at once would insert one row twice)."""

Counts = dict[date, dict[str | None, int]]
"""Failures by day, then by verdict (None: the case has none yet)."""


def day_of(column: Any, dialect: str) -> ColumnElement[Any]:
    """The UTC day of a time column: PostgreSQL's ``date`` would take the session's time zone, and
    SQLite keeps times as UTC text already."""
    if dialect == "postgresql":
        return func.date(func.timezone("UTC", column))
    return func.date(column)


def start_of(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def roll_up_failures(session: Session, *, now: datetime, days: int = FAILURE_DAYS) -> int:
    """Count again the failures of the `days` complete days before `now`'s, by their cases'
    verdicts now; the rows written."""
    today = now.astimezone(UTC).date()
    first = today - timedelta(days=days)
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK})
    counted = _live(session, start_of(first), start_of(today))
    session.execute(delete(FailureDayRow).where(FailureDayRow.day >= first, FailureDayRow.day < today))
    session.execute(delete(FailureDayRow).where(FailureDayRow.day < today - timedelta(days=KEEP_DAYS)))
    rows = [
        {"day": day, "verdict": verdict or "", "failures": count, "rolled_at": now}
        for day, by_verdict in counted.items()
        for verdict, count in by_verdict.items()
    ]
    if rows:
        session.execute(insert(FailureDayRow), rows)
    return len(rows)


def failures_by_day(session: Session, today: date, days: int = FAILURE_DAYS) -> Counts:
    """The failures of the `days` days that end with `today`: the days rolled up from their rows,
    the others (today among them) counted from the occurrences."""
    first = today - timedelta(days=days - 1)
    through = session.scalar(
        select(func.max(FailureDayRow.day)).where(FailureDayRow.day >= first, FailureDayRow.day < today)
    )
    counts: Counts = defaultdict(dict)
    if through is not None:
        for day, verdict, failures in session.execute(
            select(FailureDayRow.day, FailureDayRow.verdict, FailureDayRow.failures).where(
                FailureDayRow.day >= first, FailureDayRow.day <= through
            )
        ):
            counts[day][verdict or None] = failures
    live_from = through + timedelta(days=1) if through is not None else first
    for day, by_verdict in _live(session, start_of(live_from), None).items():
        if day <= today:  # a clock ahead of ours: tomorrow is not drawn
            counts[day].update(by_verdict)
    return dict(counts)


def _live(session: Session, since: datetime, until: datetime | None) -> Counts:
    """The occurrences received in [`since`, `until`) by UTC day and their cases' verdicts now."""
    day = day_of(Occurrence.received_at, session.get_bind().dialect.name)
    query = (
        select(day, Case.verdict, func.count())
        .select_from(Occurrence)
        .join(Case, Case.id == Occurrence.case_id)
        .where(Occurrence.received_at >= since)
        .group_by(day, Case.verdict)
    )
    if until is not None:
        query = query.where(Occurrence.received_at < until)
    counts: Counts = defaultdict(dict)
    for when, verdict, count in session.execute(query):
        key = when if isinstance(when, date) else date.fromisoformat(str(when))
        counts[key][verdict] = counts[key].get(verdict, 0) + int(count)
    return dict(counts)
