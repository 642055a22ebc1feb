"""The runners page: the machines replays ran on (host, GPUs, driver), how many replays each ran,
how many environment-specific verdicts named it, whether it is suspect (to be drained and checked),
suspects first, and the case of its latest such verdict.

One bounded read of ``runners`` (`MAX_RUNNERS`, suspects first through ``runners (suspect)``): a
fleet has hundreds of machines, not millions.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from flaketriage.records import RunnerRow

if TYPE_CHECKING:
    from flaketriage.orchestrator.dashboard.views import Views

MAX_RUNNERS = 500


@dataclass(frozen=True)
class Runner:
    id: str
    host: str
    gpus: list[str]
    """Its GPU models, one per GPU."""
    driver: str | None
    replays: int
    environment_specific: int
    suspect: bool
    first_seen: datetime
    last_seen: datetime
    last_case_id: int | None

    @property
    def gpu_text(self) -> str:
        """``2 × NVIDIA H100``; ``none`` for a CPU runner."""
        if not self.gpus:
            return "none"
        return ", ".join(f"{n} × {name}" if n > 1 else name for name, n in Counter(self.gpus).items())


def runners(session: Session) -> tuple[list[Runner], int]:
    """The runners, suspects first, then the most recently seen; and how many there are."""
    total = int(session.scalar(select(func.count()).select_from(RunnerRow)) or 0)
    rows = session.scalars(
        select(RunnerRow)
        .order_by(RunnerRow.suspect.desc(), RunnerRow.last_seen.desc(), RunnerRow.id)
        .limit(MAX_RUNNERS)
    ).all()
    return [
        Runner(
            id=row.id,
            host=row.host,
            gpus=[
                str(g.get("name") or "unknown GPU") if isinstance(g, dict) else "unknown GPU"
                for g in (row.gpus if isinstance(row.gpus, list) else [])
            ],
            driver=row.driver,
            replays=row.replays,
            environment_specific=row.environment_specific,
            suspect=row.suspect,
            first_seen=row.first_seen,
            last_seen=row.last_seen,
            last_case_id=row.last_case_id,
        )
        for row in rows
    ], total


def router(views: Views) -> APIRouter:
    routes = APIRouter()

    @routes.get("/runners", response_class=HTMLResponse)
    def runners_page(request: Request) -> HTMLResponse:
        with views.service.database.session() as session:
            found, total = runners(session)
        return views.page(
            request,
            "runners.html",
            title="Runners",
            page_key="runners",
            runners=found,
            total=total,
            suspects=sum(1 for r in found if r.suspect),
            suspect_after=views.service.settings.runner_suspect_after,
        )

    return routes
