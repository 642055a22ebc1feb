"""The dashboard: server-rendered pages over the cases and the CI history, served by the receiver.

`mount` adds its routes to the receiver's app. Every page is a module of its own that owns its
queries and its routes (`overview`, `cases`, `case`, `tests`, `grid`, `quarantine`, `runners`);
`actions` owns the forms that change things, `access` who may read and act (sessions, tokens,
CSRF), `sign_in` the routes that sign people in (a token, a GitHub OAuth App) and out, `views` the
templates, `charts` the SVG drawn on the server. Static files (a vendored htmx and the style
sheet) are served from the package: nothing is fetched from a CDN.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from flaketriage.orchestrator.service import Service


def mount(app: FastAPI, service: Service) -> None:
    """Add the dashboard's pages, actions and static files to `app`."""
    from fastapi import Depends
    from fastapi.responses import RedirectResponse
    from fastapi.staticfiles import StaticFiles

    from flaketriage.orchestrator.dashboard import (
        actions,
        case,
        cases,
        grid,
        overview,
        quarantine,
        runners,
        sign_in,
        tests,
    )
    from flaketriage.orchestrator.dashboard.views import PREFIX, Views

    views = Views(service)
    app.mount(
        f"{PREFIX}/static",
        StaticFiles(packages=[("flaketriage.orchestrator.dashboard", "static")]),
        name="dashboard-static",
    )
    sign_in.install(app, views)
    # The sign-in page and the actions (which check their own forms) are open; every page is read
    # only by those `Access.reader` lets read.
    for module in (sign_in, actions):
        app.include_router(module.router(views), prefix=PREFIX, include_in_schema=False)
    reader = [Depends(views.access.reader)]
    for module in (overview, cases, case, tests, grid, quarantine, runners):
        app.include_router(module.router(views), prefix=PREFIX, include_in_schema=False, dependencies=reader)

    for path in ("/", "/ui"):
        app.add_api_route(
            path,
            lambda: RedirectResponse(PREFIX, status_code=307),
            methods=["GET"],
            include_in_schema=False,
        )
