"""`Views`: the dashboard's templates (Jinja2, autoescaped) and what every page is rendered with."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from flaketriage import __version__
from flaketriage.orchestrator.dashboard.access import PREFIX as PREFIX  # where the pages live
from flaketriage.orchestrator.dashboard.access import Access

if TYPE_CHECKING:
    from flaketriage.orchestrator.service import Service

NAVIGATION = (
    ("overview", "Overview", ""),
    ("cases", "Cases", "/cases"),
    ("tests", "Tests", "/tests"),
    ("grid", "Commits", "/grid"),
    ("quarantine", "Quarantine", "/quarantine"),
    ("runners", "Runners", "/runners"),
)
"""The pages in the navigation bar: (key, label, path under `PREFIX`)."""


def when(value: datetime | None) -> str:
    """A time as the pages show it (UTC, to the minute); an empty string for none."""
    if value is None:
        return ""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


def duration(seconds: float | None) -> str:
    """Seconds as a person reads them: ``42 s``, ``3.5 min``, ``2.1 h``; ``–`` for none."""
    if seconds is None:
        return "–"
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Views:
    """The template environment, the service the pages read, and who is looking (`Access`)."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.access = Access(service.settings)
        self.env = Environment(
            loader=PackageLoader("flaketriage.orchestrator.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["when"] = when
        self.env.filters["duration"] = duration
        self.env.globals.update(prefix=PREFIX, navigation=NAVIGATION, version=__version__)

    def page(self, request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        """`template` rendered with `context`, the viewer and the form token of this request."""
        viewer = self.access.viewer(request)
        context.setdefault("flash", self.access.flash(request))
        html = self.env.get_template(template).render(
            request=request,
            viewer=viewer,
            csrf_token=self.access.csrf_token(request),
            query=dict(request.query_params),
            **context,
        )
        response = HTMLResponse(html, status_code=status_code, headers=self.access.page_headers())
        self.access.finish(request, response)
        return response
