"""Reading runners for the API: the machines replays ran on, suspects first."""

from __future__ import annotations

from sqlalchemy import select

from flaketriage.orchestrator.api_models import GPUView, RunnerSummary
from flaketriage.records import Database, RunnerRow


def list_runners(
    database: Database, *, suspect: bool | None = None, limit: int = 1000
) -> list[RunnerSummary]:
    """Runners, suspects first, then the most recently seen; only suspects (or only the others)
    with `suspect`."""
    query = select(RunnerRow).order_by(RunnerRow.suspect.desc(), RunnerRow.last_seen.desc(), RunnerRow.id)
    if suspect is not None:
        query = query.where(RunnerRow.suspect.is_(suspect))
    with database.session() as session:
        return [
            RunnerSummary(
                id=row.id,
                host=row.host,
                gpus=[
                    GPUView(name=str(g.get("name", "unknown")), uuid=g.get("uuid")) for g in row.gpus or []
                ],
                driver=row.driver,
                first_seen=row.first_seen,
                last_seen=row.last_seen,
                replays=row.replays,
                environment_specific=row.environment_specific,
                suspect=row.suspect,
                last_case_id=row.last_case_id,
            )
            for row in session.scalars(query.limit(limit)).all()
        ]
