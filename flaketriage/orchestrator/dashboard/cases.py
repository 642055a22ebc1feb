"""The cases list: filtered by verdict, status, repository, branch, test and fingerprint, sorted by
when last seen or by impact (occurrences, CI time lost), a page of `PAGE_SIZE` at a time.

The filters are a GET form, so a filtered list is a link; htmx swaps the results in place (and
pushes the URL) where JavaScript runs. A verdict, status, sort or page that is not one of those
allowed answers 422 with the allowed values, never a 500.

A case has no branch of its own. What knows one: a results upload (``result_uploads.branch``),
which names its run the way a failure's provenance does (``occurrences.run_url``), and a failed
workflow run (``occurrences.branch``, its ``head_branch``). A case is on a branch when one of its
occurrences came from one of the branch's latest `RUNS_PER_BRANCH` runs, or is one of the latest
`RUNS_PER_BRANCH` workflow failures on it: two bounded index range scans, whatever the number of
occurrences (migration 0006).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.orm import Session

from flaketriage.orchestrator.api_models import CaseVerdict
from flaketriage.orchestrator.dashboard.query import in_place, read_filters
from flaketriage.records import Case, CaseStatus, Occurrence
from flaketriage.records.models import TestRow, UploadRow

if TYPE_CHECKING:
    from flaketriage.orchestrator.dashboard.views import Views

PAGE_SIZE = 50
MAX_PAGE = 200
"""The last page the list goes to (10,000 cases): past it, narrow the filters."""
RUNS_PER_BRANCH = 1000
"""The latest runs of a branch (and workflow failures on it) whose cases the branch filter finds."""
UNDECIDED = "none"
"""The verdict filter's value for cases without a verdict."""
VERDICTS = (*(v.value for v in CaseVerdict), UNDECIDED)
STATUSES = tuple(s.value for s in CaseStatus)
SORTS = {"last_seen": "last seen", "occurrences": "occurrences", "ci_lost": "CI time lost"}
"""The orders the list takes, each newest or largest first, with its label."""
TEXT_FILTERS = ("repository", "branch", "test", "fingerprint")


def verdict_label(verdict: str | None) -> str:
    """A verdict as the pages spell it: ``order dependent``; ``undecided`` for none."""
    return verdict.replace("_", " ") if verdict and verdict != UNDECIDED else "undecided"


@dataclass(frozen=True)
class CaseFilters:
    """What the list shows: each filter ``""`` when not given."""

    verdict: str = ""
    status: str = ""
    repository: str = ""
    branch: str = ""
    test: str = ""
    fingerprint: str = ""
    sort: str = "last_seen"
    page: int = 1

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> tuple[CaseFilters, list[str]]:
        """The filters of a query string, and what is wrong with it (each problem says what is
        allowed); a wrong value is left out of the filters. Unknown parameters are ignored; NUL
        and lone surrogates, which no query can hold, become U+FFFD (and so match nothing)."""
        values, problems = read_filters(
            params,
            ("verdict", "status", *TEXT_FILTERS, "sort", "page"),
            {"verdict": VERDICTS, "status": STATUSES, "sort": tuple(SORTS)},
            most_pages=MAX_PAGE,
        )
        return cls(**values), problems

    @property
    def active(self) -> bool:
        return any(getattr(self, name) for name in ("verdict", "status", *TEXT_FILTERS))

    def link(self, **changes: Any) -> str:
        """The query string of these filters with `changes` (``?verdict=flaky&page=2``); defaults
        left out."""
        changed = replace(self, **changes)
        pairs = [
            (name, str(getattr(changed, name)))
            for name in ("verdict", "status", *TEXT_FILTERS, "sort", "page")
            if getattr(changed, name) not in ("", None)
            and getattr(changed, name) != getattr(CaseFilters, name)
        ]
        return "?" + urlencode(pairs) if pairs else "?"

    def conditions(self) -> list[ColumnElement[bool]]:
        found: list[ColumnElement[bool]] = []
        if self.verdict == UNDECIDED:
            found.append(Case.verdict.is_(None))
        elif self.verdict:
            found.append(Case.verdict == self.verdict)
        if self.status:
            found.append(Case.status == self.status)
        if self.repository:
            found.append(Case.repository == self.repository)
        if self.test:
            found.append(Case.test_id.icontains(self.test, autoescape=True))
        if self.fingerprint:
            found.append(
                or_(
                    Case.fingerprint.startswith(self.fingerprint, autoescape=True),
                    Case.identity.startswith(self.fingerprint, autoescape=True),
                )
            )
        if self.branch:
            found.append(on_branch(self.branch, self.repository or None))
        return found


def on_branch(branch: str, repository: str | None = None) -> ColumnElement[bool]:
    """Cases with an occurrence from one of the latest `RUNS_PER_BRANCH` runs CI history knows on
    `branch` (of `repository`, when given), or among the latest workflow failures naming it."""
    runs = select(UploadRow.run_url).where(UploadRow.branch == branch, UploadRow.run_url.is_not(None))
    if repository:
        runs = runs.where(UploadRow.repository == repository)
    runs = runs.order_by(UploadRow.id.desc()).limit(RUNS_PER_BRANCH)
    in_runs = select(Occurrence.case_id).where(Occurrence.run_url.is_not(None), Occurrence.run_url.in_(runs))
    named = (
        select(Occurrence.case_id)
        .where(Occurrence.branch.is_not(None), Occurrence.branch == branch)
        .order_by(Occurrence.id.desc())
        .limit(RUNS_PER_BRANCH)
    )
    return or_(Case.id.in_(in_runs), Case.id.in_(named))


def ci_lost_of_case() -> Any:
    """A case's test's CI seconds lost in every variant (0 without CI history), for ``ORDER BY``:
    one probe of ``tests (test_id)`` per case."""
    return (
        select(func.coalesce(func.sum(TestRow.lost_s), 0.0))
        .where(TestRow.test_id == Case.test_id, TestRow.repository == Case.repository)
        .correlate(Case)
        .scalar_subquery()
    )


def tests_of(
    session: Session, keys: Sequence[tuple[str | None, str | None]]
) -> dict[tuple[str | None, str | None], tuple[int, float]]:
    """For each (repository, test id) of `keys` CI history has, its first test row's id and the
    CI seconds it lost in every variant: one lookup by ``tests (test_id)``."""
    ids = sorted({test for _, test in keys if test})
    if not ids:
        return {}
    rows = session.execute(
        select(TestRow.repository, TestRow.test_id, func.min(TestRow.id), func.sum(TestRow.lost_s))
        .where(TestRow.test_id.in_(ids))
        .group_by(TestRow.repository, TestRow.test_id)
    ).all()
    return {(repo, test): (int(pk), float(lost or 0.0)) for repo, test, pk, lost in rows}


@dataclass(frozen=True)
class CaseLine:
    """One row of the list."""

    id: int
    title: str
    test_id: str | None
    repository: str | None
    verdict: str | None
    status: str
    occurrences: int
    last_seen: Any
    ci_lost_s: float | None
    """None without CI history of its test."""
    test_pk: int | None


@dataclass(frozen=True)
class CasePage:
    lines: list[CaseLine]
    total: int
    filters: CaseFilters

    @property
    def pages(self) -> int:
        return min(max(1, math.ceil(self.total / PAGE_SIZE)), MAX_PAGE)

    @property
    def first(self) -> int:
        return (self.filters.page - 1) * PAGE_SIZE + 1 if self.lines else 0

    @property
    def last(self) -> int:
        return (self.filters.page - 1) * PAGE_SIZE + len(self.lines)


def order_of(sort: str) -> tuple[Any, ...]:
    """The ``ORDER BY`` of a sort (largest or newest first, then the newest case)."""
    if sort == "occurrences":
        return (Case.occurrences.desc(), Case.id.desc())
    if sort == "ci_lost":
        return (ci_lost_of_case().desc(), Case.occurrences.desc(), Case.id.desc())
    return (Case.last_seen.desc(), Case.id.desc())


def case_page(session: Session, filters: CaseFilters) -> CasePage:
    """The page of cases `filters` ask for: one count, one page of rows, one lookup of their tests."""
    conditions = filters.conditions()
    total = int(session.scalar(select(func.count()).select_from(Case).where(*conditions)) or 0)
    rows = session.execute(
        select(
            Case.id,
            Case.title,
            Case.test_id,
            Case.repository,
            Case.verdict,
            Case.status,
            Case.occurrences,
            Case.last_seen,
        )
        .where(*conditions)
        .order_by(*order_of(filters.sort))
        .limit(PAGE_SIZE)
        .offset((filters.page - 1) * PAGE_SIZE)
    ).all()
    history = tests_of(session, [(r.repository, r.test_id) for r in rows])
    lines = []
    for r in rows:
        pk, lost = history.get((r.repository, r.test_id), (None, None))
        lines.append(
            CaseLine(
                id=r.id,
                title=r.title,
                test_id=r.test_id,
                repository=r.repository,
                verdict=r.verdict,
                status=r.status,
                occurrences=r.occurrences,
                last_seen=r.last_seen,
                ci_lost_s=lost,
                test_pk=pk,
            )
        )
    return CasePage(lines, total, filters)


def repositories(session: Session, limit: int = 200) -> list[str]:
    """The repositories cases name, for the filter's suggestions."""
    return list(
        session.scalars(
            select(Case.repository)
            .where(Case.repository.is_not(None))
            .distinct()
            .order_by(Case.repository)
            .limit(limit)
        )
    )


def recent_branches(session: Session, uploads: int = 500) -> list[str]:
    """The branches of the latest `uploads` results uploads, for the filter's suggestions."""
    latest = (
        select(UploadRow.branch)
        .where(UploadRow.branch.is_not(None))
        .order_by(UploadRow.id.desc())
        .limit(uploads)
    )
    inner = latest.subquery()
    return sorted(str(b) for b in session.scalars(select(inner.c.branch).distinct()))


def router(views: Views) -> APIRouter:
    routes = APIRouter()

    @routes.get("/cases", response_class=HTMLResponse)
    def cases(request: Request) -> HTMLResponse:
        filters, problems = CaseFilters.parse(request.query_params)
        partial = in_place(request)
        with views.service.database.session() as session:
            page = None if problems else case_page(session, filters)
            suggestions = (
                {}
                if partial
                else {"repositories": repositories(session), "branches": recent_branches(session)}
            )
        return views.page(
            request,
            "partials/case_results.html" if partial else "cases.html",
            status_code=422 if problems else 200,
            title="Cases",
            page_key="cases",
            filters=filters,
            problems=problems,
            results=page,
            verdicts=VERDICTS,
            statuses=STATUSES,
            sorts=SORTS,
            verdict_label=verdict_label,
            page_size=PAGE_SIZE,
            **suggestions,
        )

    return routes
