"""The dashboard: server-rendered pages over the cases and the CI history, served by the receiver.

`mount` adds its routes to the receiver's app. Every page is a module of its own that owns its
queries and its routes (`overview`, `cases`, `case`, `tests`, `grid`, `quarantine`, `runners`);
`actions` owns the forms that change things, `access` who may read and act (tokens, the GitHub
login, CSRF), `views` the templates, `charts` the SVG drawn on the server. Static files (a
vendored htmx and the style sheet) are served from the package: nothing is fetched from a CDN.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from flaketriage.orchestrator.service import Service


def mount(app: FastAPI, service: Service) -> None:
    """Add the dashboard's pages, actions and static files to `app`."""
    from fastapi.responses import RedirectResponse
    from fastapi.staticfiles import StaticFiles

    from flaketriage.orchestrator.dashboard import (
        access,
        actions,
        case,
        cases,
        grid,
        overview,
        quarantine,
        runners,
        tests,
    )
    from flaketriage.orchestrator.dashboard.views import PREFIX, Views

    views = Views(service)
    app.mount(
        f"{PREFIX}/static",
        StaticFiles(packages=[("flaketriage.orchestrator.dashboard", "static")]),
        name="dashboard-static",
    )
    for module in (access, overview, cases, case, tests, grid, quarantine, runners, actions):
        app.include_router(module.router(views), prefix=PREFIX, include_in_schema=False)

    for path in ("/", "/ui"):
        app.add_api_route(
            path,
            lambda: RedirectResponse(PREFIX, status_code=307),
            methods=["GET"],
            include_in_schema=False,
        )
