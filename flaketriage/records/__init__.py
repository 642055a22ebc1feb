"""The service's records in SQL: cases, their occurrences, deliveries, work and replays, quarantine.

Shared by the orchestrator (which records what arrives) and the workers (which record what they did):
the database is the record, the broker only carries work. SQLite by default, PostgreSQL by URL;
the schema is created and upgraded by Alembic migrations (`flaketriage.records.database.Database`).
Needs the ``server`` extra (SQLAlchemy, Alembic); nothing here is imported by the CI side.
"""

from __future__ import annotations

from flaketriage.records.database import Database, database_url
from flaketriage.records.models import (
    Base,
    Case,
    CaseStatus,
    Delivery,
    Occurrence,
    QuarantineRow,
    ReplayRow,
    RunnerRow,
    Work,
    WorkStatus,
)

__all__ = [
    "Base",
    "Case",
    "CaseStatus",
    "Database",
    "Delivery",
    "Occurrence",
    "QuarantineRow",
    "ReplayRow",
    "RunnerRow",
    "Work",
    "WorkStatus",
    "database_url",
]
