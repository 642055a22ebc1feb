"""What garbage collection keeps whatever its age: the bundles quarantined failures and open cases
refer to, in the quarantine file and, where the service keeps records, in its database.

``flaketriage gc`` and the service's scheduled collection (`flaketriage.workers.upkeep`) both ask
`retained_bundles`, so the two can never disagree about what is in use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flaketriage.dependencies import require
from flaketriage.errors import QuarantineError
from flaketriage.quarantine import QuarantineDocument
from flaketriage.settings import Settings

if TYPE_CHECKING:
    from flaketriage.records import Database

SERVICE_DB = "service.db"
"""The embedded service's records beside a local store (`Settings.resolved_database_url`)."""


def retained_bundles(settings: Settings, database: Database | None) -> set[str]:
    """The bundles to keep: every one the quarantine file names, and with `database` (the service's
    records) the bundles of open cases and of its quarantine rows."""
    keep: set[str] = set()
    path = quarantine_file(settings)
    if path is not None:
        keep |= quarantine_file_bundles(path)
    if database is not None:
        keep |= recorded_bundles(database)
    return keep


def quarantine_file(settings: Settings) -> Path | None:
    """The quarantine file: ``FLAKETRIAGE_QUARANTINE_FILE``, else ``<store>/quarantine.json`` for a
    local store; None for a store elsewhere with no file set."""
    if settings.quarantine_file is not None:
        return settings.quarantine_file
    root = settings.local_store()
    return None if root is None else root / "quarantine.json"


def quarantine_file_bundles(path: Path) -> set[str]:
    """Every bundle the quarantine file at `path` names (none when there is no file); a damaged
    file is a `QuarantineError`, since what it keeps cannot be told."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return set()
    except OSError as exc:
        raise QuarantineError(
            f"cannot read the quarantine file {path} ({exc.strerror or exc}), so the bundles it keeps are "
            "unknown; fix its permissions, or set FLAKETRIAGE_QUARANTINE_FILE"
        ) from exc
    document = QuarantineDocument.from_json(raw, where=f"the quarantine file {path}")
    return {b for entry in document.entries.values() for b in (entry.bundle_id, *entry.bundles)}


def service_database(settings: Settings) -> Database | None:
    """The service's records when there are any: ``FLAKETRIAGE_DATABASE_URL``, or the embedded
    service's ``<store>/service.db`` when it exists. Needs the ``server`` extra."""
    url = settings.database_url
    if not url:
        root = settings.local_store()
        if root is None or not (root / SERVICE_DB).is_file():
            return None
        url = settings.resolved_database_url()
    require("sqlalchemy", "server", "reading the service's records (FLAKETRIAGE_DATABASE_URL)")
    from flaketriage.records import Database

    return Database(url)


def recorded_bundles(database: Database) -> set[str]:
    """The bundles of the service's open cases (any status but ``fixed``) and of its quarantine rows."""
    from sqlalchemy import select

    from flaketriage.records import Case, CaseStatus, Occurrence, QuarantineRow

    with database.session() as session:
        keep = set(
            session.scalars(
                select(Occurrence.bundle_id)
                .join(Case, Case.id == Occurrence.case_id)
                .where(Occurrence.bundle_id.is_not(None), Case.status != CaseStatus.FIXED.value)
            ).all()
        )
        entries = session.scalars(select(QuarantineRow.entry)).all()
    for entry in entries:
        keep |= _entry_bundles(entry)
    return {k for k in keep if k}


def _entry_bundles(entry: Any) -> set[str]:
    """The bundles a quarantine row names, read leniently: a row this version cannot validate still
    keeps what it names."""
    if not isinstance(entry, Mapping):
        return set()
    bundles = entry.get("bundles")
    named: Iterable[object] = [entry.get("bundle_id"), *(bundles if isinstance(bundles, list) else ())]
    return {b for b in named if isinstance(b, str)}
