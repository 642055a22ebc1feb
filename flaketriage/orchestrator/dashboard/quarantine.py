"""The quarantine page: every entry (what it forgives, who answers for it, since when), the
evidence that put it there (the failure rate with its interval), what has happened since (its
isolation reruns, the test's CI results since), the condition that lifts it in words, the forms to
lift or remove it, and the form to quarantine a test by hand.

A page is `PAGE_SIZE` entries, newest change first; the CI results since each entry's start are one
query (`flaketriage.orchestrator.dashboard.tests.latest_results`, `SINCE` per test variant), its
tests one lookup by ``tests (test_id)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from flaketriage.errors import ConfigError
from flaketriage.orchestrator.api_models import CaseVerdict
from flaketriage.orchestrator.dashboard.case import Evidence, web_link
from flaketriage.orchestrator.dashboard.charts import rate_interval
from flaketriage.orchestrator.dashboard.tests import Result, latest_results, summary
from flaketriage.orchestrator.dashboard.views import duration, when
from flaketriage.quarantine import QuarantineEntry
from flaketriage.records import QuarantineRow, Work
from flaketriage.records.models import TestRow, WorkStatus
from flaketriage.variant import parse_variant, variant_covers, variant_key
from flaketriage.work.messages import Step
from flaketriage.work.sequential import clean_replays

if TYPE_CHECKING:
    from flaketriage.orchestrator.dashboard.views import Views
    from flaketriage.settings import Settings

PAGE_SIZE = 50
MAX_PAGE = 100
SINCE = 20
"""The latest CI results since its start shown per test variant of an entry."""
MAX_TESTS = 10
"""The test variants of one entry whose CI results are read."""


def lift_condition(entry: QuarantineEntry, settings: Settings) -> str:
    """What ends `entry`, in words, from the rules the workers follow
    (`flaketriage.workers.upkeep`, `flaketriage.workers.pipeline`) and the settings."""
    if entry.by_hand:
        if entry.expires_at is None:
            return "Until lifted by hand (no rerun lifts a quarantine made by hand)."
        if entry.expired():
            return (
                f"Expired at {when(entry.expires_at)} UTC: it no longer forgives any failure. "
                "Un-quarantine it to remove the entry."
            )
        return (
            f"Until {when(entry.expires_at)} UTC, or lifted by hand "
            "(no rerun lifts a quarantine made by hand)."
        )
    clean = clean_replays(settings.min_flaky_rate, settings.alpha)
    order = (
        " in the order that made it fail"
        if entry.evidence.verdict == CaseVerdict.ORDER_DEPENDENT.value
        else " in isolation"
    )
    replays = f"{clean} replays in a row" if clean else "its replays"
    return (
        f"Replayed{order} every {duration(settings.rerun_every_s)}; lifted when a rerun passes "
        f"{replays} without reproducing the failure: the sequential test then says its failure rate "
        f"is below {settings.min_flaky_rate:.0%} (wrong at most {settings.alpha:.0%} of the time). "
        "Or lifted by hand."
    )


@dataclass(frozen=True)
class TestSince:
    """One test variant an entry covers, with its CI results since the entry began."""

    __test__ = False

    test_pk: int
    test_id: str
    variant: str
    results: list[Result]

    @property
    def summary(self) -> str:
        return summary(self.results)


MAX_RERUNS = 5
"""The latest isolation reruns shown per entry."""


@dataclass(frozen=True)
class Rerun:
    """One isolation rerun of an entry's failure (a ``rerun`` step of its case, scheduled by beat
    every ``FLAKETRIAGE_RERUN_EVERY_S``) and what it found."""

    at: datetime
    status: str
    state: str | None
    """What the rerun did with the entry, in the worker's words (``still flaky``)."""
    evidence: Evidence
    error: str | None

    @property
    def words(self) -> str:
        """The rerun's result in a sentence (without its time)."""
        if self.status == WorkStatus.FAILED.value:
            return f"failed: {self.error or 'no error recorded'}"
        if self.status != WorkStatus.DONE.value:
            return f"{self.status}, not finished yet"
        e = self.evidence
        counts = (
            f"{e.failures} of {e.replays} replays reproduced the failure"
            if e.replays is not None and e.failures is not None
            else "replays not recorded"
        )
        return f"{counts}: {self.state}" if self.state else counts


@dataclass
class EntryView:
    """One row of the quarantine table and what the page says about it."""

    fingerprint: str
    case_id: int | None
    clean_reruns: int
    updated_at: Any
    entry: QuarantineEntry | None
    """None for an entry this release cannot read (written by a newer one)."""
    lift: str = ""
    since: list[TestSince] = field(default_factory=list)
    reruns: list[Rerun] = field(default_factory=list)
    """Its latest isolation reruns since it began, newest first (at most `MAX_RERUNS`)."""

    @property
    def test_id(self) -> str | None:
        return self.entry.test_id if self.entry else None

    @property
    def expired(self) -> bool:
        return self.entry is not None and self.entry.expired()

    @property
    def variant(self) -> str:
        return variant_key(self.entry.variant) if self.entry and self.entry.variant else ""

    @property
    def issue_link(self) -> str | None:
        return web_link(self.entry.issue_url) if self.entry else None

    def chart(self, index: int) -> Markup | None:
        if self.entry is None or self.entry.by_hand:
            return None
        rate = self.entry.evidence.rate
        return rate_interval(
            rate.low,
            rate.estimate,
            rate.high,
            title=f"Failure rate of {self.test_id or self.fingerprint[:12]} with its interval",
            description=(
                f"Estimated failure rate {rate.estimate:.1%}, interval from {rate.low:.1%} to "
                f"{rate.high:.1%}, on an axis from 0% to 100%."
            ),
            ident=f"rate-{index}",
            width=240,
            height=56,
        )


@dataclass(frozen=True)
class QuarantinePage:
    entries: list[EntryView]
    total: int
    page: int

    @property
    def pages(self) -> int:
        return min(max(1, math.ceil(self.total / PAGE_SIZE)), MAX_PAGE)


def quarantine_page(session: Session, settings: Settings, page: int) -> QuarantinePage:
    total = int(session.scalar(select(func.count()).select_from(QuarantineRow)) or 0)
    rows = session.scalars(
        select(QuarantineRow)
        .order_by(QuarantineRow.updated_at.desc(), QuarantineRow.fingerprint)
        .limit(PAGE_SIZE)
        .offset((page - 1) * PAGE_SIZE)
    ).all()
    views = []
    for row in rows:
        try:
            entry: QuarantineEntry | None = QuarantineEntry.model_validate(row.entry)
        except ValidationError:
            entry = None
        view = EntryView(row.fingerprint, row.case_id, row.clean_reruns, row.updated_at, entry)
        view.lift = lift_condition(entry, settings) if entry else "Unknown: this entry could not be read."
        views.append(view)
    _add_history(session, views)
    _add_reruns(session, views)
    return QuarantinePage(views, total, page)


def _add_history(session: Session, views: list[EntryView]) -> None:
    """The CI results of each entry's tests since it began: one lookup of the tests, one of results."""
    named = {v.entry.test_id for v in views if v.entry and v.entry.test_id}
    if not named:
        return
    tests = session.execute(
        select(TestRow.id, TestRow.test_id, TestRow.variant_key)
        .where(TestRow.test_id.in_(sorted(named)))
        .order_by(TestRow.id)
        .limit(len(named) * MAX_TESTS)
    ).all()
    by_id: dict[str, list[tuple[int, str, dict[str, str] | None]]] = {}
    for pk, test, variant in tests:
        try:
            parsed: dict[str, str] | None = parse_variant(variant, where="a recorded variant")
        except ConfigError:
            parsed = None  # covered only by an entry for every variant
        by_id.setdefault(str(test), []).append((int(pk), str(variant), parsed))
    chosen: dict[str, list[tuple[int, str, str]]] = {}
    for view in views:
        entry = view.entry
        if entry is None or not entry.test_id:
            continue
        for pk, variant, parsed in by_id.get(entry.test_id, []):
            if len(chosen.get(view.fingerprint, [])) >= MAX_TESTS:
                break
            if variant_covers(entry.variant, parsed) if parsed is not None else not entry.variant:
                chosen.setdefault(view.fingerprint, []).append((pk, entry.test_id, variant))
    # One query; each entry's own start filters its tests' results below.
    starts = [v.entry.quarantined_at for v in views if v.entry and v.fingerprint in chosen]
    if not starts:
        return
    pks = [pk for picked in chosen.values() for pk, _, _ in picked]
    results = latest_results(session, pks, SINCE, since=min(starts))
    for view in views:
        if view.entry is None:
            continue
        start = view.entry.quarantined_at
        for pk, test, variant in chosen.get(view.fingerprint, []):
            mine = [r for r in results.get(pk, []) if r.received_at >= start]
            view.since.append(TestSince(pk, test, variant, mine))


def _add_reruns(session: Session, views: list[EntryView]) -> None:
    """Each entry's isolation reruns since it began: one query of the page's cases' ``rerun``
    steps (``work (case_id)``), the latest `MAX_RERUNS` of each case numbered by the database."""
    cases = {v.case_id for v in views if v.case_id is not None and v.entry and not v.entry.by_hand}
    if not cases:
        return
    newest = func.row_number().over(partition_by=Work.case_id, order_by=Work.id.desc())
    numbered = (
        select(
            Work.id,
            Work.case_id,
            Work.options,
            Work.status,
            Work.result,
            Work.error,
            Work.created_at,
            Work.finished_at,
            newest.label("n"),
        )
        .where(Work.case_id.in_(cases), Work.step == Step.RERUN.value)
        .subquery()
    )
    found: dict[int, list[Any]] = {}
    for row in session.execute(
        select(numbered).where(numbered.c.n <= MAX_RERUNS).order_by(numbered.c.id.desc())
    ):
        found.setdefault(int(row.case_id), []).append(row)
    for view in views:
        entry = view.entry
        if entry is None or view.case_id is None:
            continue
        for row in found.get(view.case_id, []):
            options = row.options if isinstance(row.options, dict) else {}
            if (
                options.get("fingerprint") not in (None, view.fingerprint)
                or row.created_at < entry.quarantined_at
            ):
                continue  # another entry of the case, or before this one began
            result = row.result if isinstance(row.result, dict) else {}
            state = result.get("state")
            view.reruns.append(
                Rerun(
                    row.finished_at or row.created_at,
                    str(row.status),
                    str(state) if isinstance(state, str) else None,
                    Evidence.of(result),
                    row.error,
                )
            )


def router(views: Views) -> APIRouter:
    routes = APIRouter()

    @routes.get("/quarantine", response_class=HTMLResponse)
    def quarantine(request: Request) -> HTMLResponse:
        text = request.query_params.get("page", "1").strip() or "1"
        page = (
            int(text)
            if text.isascii() and text.isdigit() and len(text) <= 6 and 1 <= int(text) <= MAX_PAGE
            else None
        )
        if page is None:
            return views.page(
                request,
                "quarantine.html",
                status_code=422,
                title="Quarantine",
                page_key="quarantine",
                problems=[f"page {text[:40]!r} is not a page: a whole number from 1 to {MAX_PAGE}"],
                results=None,
                settings=views.service.settings,
                max_reruns=MAX_RERUNS,
            )
        with views.service.database.session() as session:
            results = quarantine_page(session, views.service.settings, page)
        return views.page(
            request,
            "quarantine.html",
            title="Quarantine",
            page_key="quarantine",
            problems=[],
            results=results,
            settings=views.service.settings,
            max_reruns=MAX_RERUNS,
        )

    return routes
