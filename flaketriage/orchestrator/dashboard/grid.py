"""The commit grid, as PyTorch's HUD draws it: a branch's latest commits (rows, newest first) by
its jobs (columns, each job in each variant), a cell saying how that job went on that commit
(passed, N failed, passed on retry, not run) and leading to its CI run; and one upload's failing
tests (`/grid/uploads/{id}`), where a cell leads when its run has no web address.

Drawn from the uploads alone, which carry their totals: the branch's latest `MAX_UPLOADS` through
``result_uploads (repository, branch, id)`` (migration 0007), never the test results; an upload's
failing tests are one scan of ``test_results (upload_pk)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from flaketriage.orchestrator.dashboard.case import parse_case_id, web_link
from flaketriage.orchestrator.dashboard.cases import recent_branches
from flaketriage.orchestrator.dashboard.query import read_filters
from flaketriage.records.models import ResultRow, TestRow, UploadRow
from flaketriage.records.text import storable_text

if TYPE_CHECKING:
    from datetime import datetime

    from flaketriage.orchestrator.dashboard.views import Views

COMMITS = 30
"""The latest commits of the branch the grid shows."""
MAX_UPLOADS = 2000
"""The latest uploads of the branch read to find them."""
MAX_JOBS = 40
MAX_FAILING = 200
"""The failing tests an upload's page lists."""
STATES = {
    "passed": ("✓", "passed"),
    "failed": ("✗", "failed"),
    "retried": ("↻", "passed on retry"),
    "storm": ("⚠", "storm (most tests failed: an outage)"),
    "missing": ("·", "not run"),
}
"""Each state of a cell: its symbol and its words (the legend)."""


@dataclass(frozen=True)
class Job:
    name: str
    variant: str

    @property
    def label(self) -> str:
        return f"{self.name} ({self.variant})" if self.variant else self.name


@dataclass(frozen=True)
class GridCell:
    """One job's latest upload on one commit."""

    upload: int
    state: str
    """A key of `STATES`."""
    failures: int
    tests: int
    attempts: int
    """Uploads of this job on this commit (a rerun of the job uploads again)."""
    run_url: str | None

    @property
    def words(self) -> str:
        if self.state in ("failed", "storm"):
            return f"{self.failures} failed" + (" (storm)" if self.state == "storm" else "")
        return STATES[self.state][1]

    @property
    def symbol(self) -> str:
        return STATES[self.state][0]

    @property
    def link(self) -> str | None:
        return web_link(self.run_url)


@dataclass(frozen=True)
class Commit:
    sha: str
    seen: datetime
    cells: dict[Job, GridCell]


@dataclass(frozen=True)
class Grid:
    repository: str
    branch: str
    commits: list[Commit]
    jobs: list[Job]
    more_jobs: int


def state_of(failures: int, passed_on_retry: int, storm: bool) -> str:
    if storm:
        return "storm"
    if failures:
        return "failed"
    return "retried" if passed_on_retry else "passed"


def latest_place(session: Session) -> tuple[str, str]:
    """The repository and branch of the most recent upload (("", "") without one)."""
    row = session.execute(
        select(UploadRow.repository, UploadRow.branch)
        .where(UploadRow.branch.is_not(None))
        .order_by(UploadRow.id.desc())
        .limit(1)
    ).first()
    return (str(row[0]), str(row[1])) if row else ("", "")


def grid_of(session: Session, repository: str, branch: str) -> Grid:
    rows = session.execute(
        select(
            UploadRow.id,
            UploadRow.commit,
            UploadRow.job,
            UploadRow.variant_key,
            UploadRow.tests,
            UploadRow.failures,
            UploadRow.passed_on_retry,
            UploadRow.storm,
            UploadRow.run_url,
            UploadRow.received_at,
        )
        .where(UploadRow.repository == repository, UploadRow.branch == branch)
        .order_by(UploadRow.id.desc())
        .limit(MAX_UPLOADS)
    ).all()
    commits: dict[str, Commit] = {}
    attempts: dict[tuple[str, Job], int] = {}
    for r in rows:  # newest first: a commit's and a cell's first upload is its latest
        sha = r.commit or "unknown commit"
        if sha not in commits:
            if len(commits) == COMMITS:
                continue
            commits[sha] = Commit(sha, r.received_at, {})
        job = Job(r.job or "unnamed job", r.variant_key or "")
        attempts[(sha, job)] = attempts.get((sha, job), 0) + 1
        if job not in commits[sha].cells:
            state = state_of(r.failures, r.passed_on_retry, r.storm)
            commits[sha].cells[job] = GridCell(r.id, state, r.failures, r.tests, 0, r.run_url)
    for (sha, job), n in attempts.items():
        cell = commits[sha].cells[job]
        commits[sha].cells[job] = GridCell(
            cell.upload, cell.state, cell.failures, cell.tests, n, cell.run_url
        )
    jobs = sorted({job for c in commits.values() for job in c.cells}, key=lambda j: (j.name, j.variant))
    return Grid(repository, branch, list(commits.values()), jobs[:MAX_JOBS], max(len(jobs) - MAX_JOBS, 0))


@dataclass(frozen=True)
class Failing:
    test_pk: int
    test_id: str
    outcome: str
    attempts: int


def failing_tests(session: Session, upload_pk: int) -> list[Failing]:
    rows = session.execute(
        select(ResultRow.test_pk, TestRow.test_id, ResultRow.outcome, ResultRow.attempts)
        .join(TestRow, TestRow.id == ResultRow.test_pk)
        .where(ResultRow.upload_pk == upload_pk, ResultRow.outcome.in_(("failed", "error")))
        .order_by(ResultRow.id)
        .limit(MAX_FAILING)
    ).all()
    return [Failing(int(pk), str(t), str(o), int(a)) for pk, t, o, a in rows]


def _filters(params: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    values, problems = read_filters(params, ("repository", "branch"), {}, most_pages=1)
    return {name: values.get(name, "") for name in ("repository", "branch")}, problems


def router(views: Views) -> APIRouter:
    routes = APIRouter()

    @routes.get("/grid", response_class=HTMLResponse)
    def grid(request: Request) -> HTMLResponse:
        values, problems = _filters(request.query_params)
        drawn = None
        with views.service.database.session() as session:
            if not problems:
                repository, branch = values["repository"], values["branch"]
                if not repository or not branch:
                    latest_repository, latest_branch = latest_place(session)
                    if not repository and not branch:
                        repository, branch = latest_repository, latest_branch
                    branch = branch or "main"
                    repository = repository or latest_repository
                values = {"repository": repository, "branch": branch}
                drawn = grid_of(session, repository, branch) if repository else None
            branches = recent_branches(session)
        return views.page(
            request,
            "grid.html",
            status_code=422 if problems else 200,
            title="Commits",
            page_key="grid",
            values=values,
            problems=problems,
            grid=drawn,
            states=STATES,
            branches=branches,
            commits=COMMITS,
        )

    @routes.get("/grid/uploads/{upload_pk}", response_class=HTMLResponse)
    def upload(request: Request, upload_pk: str) -> HTMLResponse:
        ident = parse_case_id(upload_pk)
        row, failing = None, []
        if ident is not None:
            with views.service.database.session() as session:
                row = session.get(UploadRow, ident)
                if row is not None:
                    failing = failing_tests(session, ident)
        if row is None:
            return views.page(
                request,
                "upload_missing.html",
                status_code=404,
                title="No such upload",
                page_key="grid",
                asked=storable_text(upload_pk),
            )
        return views.page(
            request,
            "upload.html",
            title=f"Upload {row.id}",
            page_key="grid",
            upload=row,
            link=web_link(row.run_url),
            failing=failing,
            max_failing=MAX_FAILING,
            state=STATES[state_of(row.failures, row.passed_on_retry, row.storm)],
        )

    return routes
