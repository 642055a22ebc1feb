"""The dashboard's actions (being built)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter

if TYPE_CHECKING:
    from flaketriage.orchestrator.dashboard.views import Views


def router(views: Views) -> APIRouter:
    return APIRouter()
