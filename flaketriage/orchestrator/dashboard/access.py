"""`Access`: who is looking at the dashboard, what they may do, and the forms' CSRF tokens.

Reading is open to anyone who reaches the service by default (a trusted network); acting needs a
viewer who logged in. This first cut lets everyone read and nobody act.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request

if TYPE_CHECKING:
    from flaketriage.orchestrator.dashboard.views import Views
    from flaketriage.settings import Settings


@dataclass(frozen=True)
class Viewer:
    """Who made a request: ``name`` is None for an anonymous reader."""

    name: str | None = None
    can_act: bool = False


class Access:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def viewer(self, request: Request) -> Viewer:
        return Viewer()

    def csrf_token(self, request: Request) -> str:
        return ""

    def page_headers(self) -> dict[str, str]:
        """Headers every page is sent with: no framing by other sites, no sniffing, no caching."""
        return {
            "X-Frame-Options": "DENY",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin",
            "Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
            "script-src 'self'; frame-ancestors 'none'; form-action 'self'",
        }


def router(views: Views) -> APIRouter:
    """The login and logout routes."""
    return APIRouter()
