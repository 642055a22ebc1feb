"""The overview: the page a team opens every morning."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import func, select

from flaketriage.records import Case, CaseStatus

if TYPE_CHECKING:
    from flaketriage.orchestrator.dashboard.views import Views


def router(views: Views) -> APIRouter:
    routes = APIRouter()

    @routes.get("", response_class=HTMLResponse)
    def overview(request: Request) -> HTMLResponse:
        with views.service.database.session() as session:
            waiting = session.scalar(
                select(func.count()).select_from(Case).where(Case.status == CaseStatus.QUEUED.value)
            )
        return views.page(request, "overview.html", title="Overview", page_key="overview", waiting=waiting)

    return routes
