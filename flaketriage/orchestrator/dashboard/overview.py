"""The overview, the page a team opens every morning: the failures of the last 30 days by verdict,
the flakiest tests, the CI time they cost, what their triage cost, and the cases waiting.

Every figure is one aggregate over an indexed range (migration 0006): the failures per day from
their daily roll-up and today's occurrences (`flaketriage.records.failure_days`), the results
uploads of the last days (the CI time lost: an upload's ``lost_s`` is the sum of its results', and
uploads are kept when their results are rolled up), the replays finished in them, and the cases by
status.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from flaketriage.orchestrator.api_models import CaseVerdict
from flaketriage.orchestrator.dashboard.cases import tests_of, verdict_label
from flaketriage.orchestrator.dashboard.charts import Series, stacked_bars
from flaketriage.records import Case, CaseStatus, ReplayRow
from flaketriage.records.failure_days import failures_by_day as daily_failures
from flaketriage.records.models import UploadRow, utc_now

if TYPE_CHECKING:
    from flaketriage.orchestrator.dashboard.views import Views

DAYS = 30
"""The days the overview looks back over, today included."""
TOP_TESTS = 10
WAITING = (CaseStatus.QUEUED, CaseStatus.TRIAGING, CaseStatus.SUSPECTED_FLAKY)
"""The statuses of a case waiting for a verdict."""
VERDICTS: tuple[str | None, ...] = (
    CaseVerdict.DETERMINISTIC.value,
    CaseVerdict.FLAKY.value,
    CaseVerdict.ORDER_DEPENDENT.value,
    CaseVerdict.ENVIRONMENT_SPECIFIC.value,
    CaseVerdict.DIFFERENT_FAILURE.value,
    CaseVerdict.ENVIRONMENT.value,
    CaseVerdict.NOT_REPRODUCED.value,
    None,
)
"""The order the verdicts are stacked and listed in; None: no verdict yet."""


@dataclass(frozen=True)
class FailuresByDay:
    """Occurrences per day (oldest first) and verdict of their case."""

    days: list[date]
    counts: dict[str | None, list[int]]
    """By verdict, in `VERDICTS` order, only those with an occurrence."""

    @property
    def totals(self) -> list[int]:
        return [sum(column) for column in zip(*self.counts.values(), strict=True)] or [0] * len(self.days)

    def chart(self) -> Markup:
        total = sum(self.totals)
        return stacked_bars(
            [d.strftime("%m-%d") for d in self.days],
            [Series(verdict_label(v), c, f"verdict-{v or 'none'}") for v, c in self.counts.items()],
            title=f"Failures per day by verdict, last {len(self.days)} days",
            description=(
                f"{total} failures from {self.days[0]} to {self.days[-1]}; "
                + (
                    "; ".join(f"{verdict_label(v)}: {sum(c)}" for v, c in self.counts.items())
                    if self.counts
                    else "none"
                )
                + ". The table below gives each day's numbers."
            ),
            ident="failures-chart",
        )


@dataclass(frozen=True)
class FlakyTest:
    case_id: int
    name: str
    repository: str | None
    verdict: str | None
    status: str
    occurrences: int
    ci_lost_s: float
    test_pk: int | None
    """Its CI history (`TestRow`) when it has one: the link goes there, else to the case."""


def first_day(today: date, days: int = DAYS) -> datetime:
    """The start (UTC) of the first of the `days` days that end with `today`."""
    return datetime.combine(today - timedelta(days=days - 1), time.min, tzinfo=UTC)


def failures_by_day(session: Session, today: date, days: int = DAYS) -> FailuresByDay:
    """The chart's numbers: complete days from their roll-up, the rest counted live
    (`flaketriage.records.failure_days`)."""
    counted = daily_failures(session, today, days)
    span = [today - timedelta(days=days - 1 - i) for i in range(days)]
    counts: dict[str | None, list[int]] = {}
    for i, day in enumerate(span):
        for verdict, count in counted.get(day, {}).items():
            key = verdict if verdict in VERDICTS else None
            counts.setdefault(key, [0] * days)[i] += count
    ordered = {v: counts[v] for v in VERDICTS if v in counts}
    return FailuresByDay(span, ordered)


def top_flaky_tests(session: Session, limit: int = TOP_TESTS) -> list[FlakyTest]:
    """The cases replays called flaky or CI history suspects, by occurrences, with their test's CI
    time lost (every variant) and its CI history row."""
    cases = session.execute(
        select(
            Case.id, Case.title, Case.test_id, Case.repository, Case.verdict, Case.status, Case.occurrences
        )
        .where(or_(Case.verdict == CaseVerdict.FLAKY.value, Case.status == CaseStatus.SUSPECTED_FLAKY.value))
        .order_by(Case.occurrences.desc(), Case.id.desc())
        .limit(limit)
    ).all()
    history = tests_of(session, [(c.repository, c.test_id) for c in cases])
    out = []
    for c in cases:
        pk, lost = history.get((c.repository, c.test_id), (None, 0.0))
        out.append(
            FlakyTest(c.id, c.test_id or c.title, c.repository, c.verdict, c.status, c.occurrences, lost, pk)
        )
    return out


@dataclass(frozen=True)
class Spent:
    ci_lost_s: float
    uploads: int
    replays: int
    cpu_s: float
    gpu_s: float


def spent_since(session: Session, since: datetime) -> Spent:
    lost, uploads = session.execute(
        select(func.coalesce(func.sum(UploadRow.lost_s), 0.0), func.count()).where(
            UploadRow.received_at >= since, UploadRow.storm.is_(False)
        )
    ).one()
    replays, cpu, gpu = session.execute(
        select(
            func.count(),
            func.coalesce(func.sum(ReplayRow.cpu_s), 0.0),
            func.coalesce(func.sum(ReplayRow.gpu_s), 0.0),
        ).where(ReplayRow.finished_at >= since)
    ).one()
    return Spent(float(lost or 0), int(uploads), int(replays), float(cpu or 0), float(gpu or 0))


def waiting(session: Session) -> dict[str, int]:
    rows = session.execute(
        select(Case.status, func.count())
        .where(Case.status.in_([s.value for s in WAITING]))
        .group_by(Case.status)
    ).all()
    found = {str(status): int(count) for status, count in rows}
    return {s.value: found.get(s.value, 0) for s in WAITING}


def router(views: Views) -> APIRouter:
    routes = APIRouter()

    @routes.get("", response_class=HTMLResponse)
    def overview(request: Request) -> HTMLResponse:
        now = utc_now()
        today = now.date()
        since = first_day(today)
        with views.service.database.session() as session:
            failures = failures_by_day(session, today)
            flaky = top_flaky_tests(session)
            spent = spent_since(session, since)
            queue = waiting(session)
        return views.page(
            request,
            "overview.html",
            title="Overview",
            page_key="overview",
            days=DAYS,
            since=since,
            failures=failures,
            chart=failures.chart(),
            verdict_label=verdict_label,
            flaky=flaky,
            spent=spent,
            waiting=queue,
            waiting_total=sum(queue.values()),
        )

    return routes
