"""The quarantine in the service's records: what ``GET /v1/quarantine`` serves.

The same entries as the JSON file (`flaketriage.workers.quarantine.file.Quarantine`), refreshed the same
way (`refreshed_entry`), kept as rows so that workers on many machines share one list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import select

from flaketriage.quarantine import (
    DEFAULT_SCOPE,
    EntryScope,
    QuarantineEntry,
    QuarantineEvidence,
    refreshed_entry,
)
from flaketriage.records import Database, QuarantineRow
from flaketriage.records.models import utc_now
from flaketriage.workers.report.base import ReportRef, check_fingerprint


class RecordsQuarantine:
    """A `QuarantineWriter` on the records; entries name `case_id` when given."""

    def __init__(
        self,
        database: Database,
        case_id: int | None = None,
        *,
        order_dependent: bool = True,
        scope: EntryScope = DEFAULT_SCOPE,
    ) -> None:
        self.database = database
        self.case_id = case_id
        self.order_dependent = order_dependent
        """Quarantine order-dependent tests too (``FLAKETRIAGE_QUARANTINE_ORDER_DEPENDENT``)."""
        self.scope = scope
        """What of a failure's variant and fingerprint its entry is limited to (`EntryScope`)."""

    def add(
        self,
        fingerprint: str,
        *,
        test_id: str | None,
        command: str,
        bundle_id: str,
        evidence: QuarantineEvidence,
        reason: str,
        issue_url: str | None = None,
        polluters: Sequence[str] = (),
        tests: Sequence[str] = (),
        variant: Mapping[str, str] | None = None,
    ) -> ReportRef:
        check_fingerprint(fingerprint)
        now = utc_now()
        with self.database.session() as session:
            query = select(QuarantineRow).where(QuarantineRow.fingerprint == fingerprint)
            if not self.database.is_sqlite:
                query = query.with_for_update()
            row = session.scalars(query).first()
            old = QuarantineEntry.model_validate(row.entry) if row is not None else None
            entry = refreshed_entry(
                old,
                fingerprint=fingerprint,
                test_id=test_id,
                command=command,
                bundle_id=bundle_id,
                evidence=evidence,
                reason=reason,
                issue_url=issue_url,
                polluters=polluters,
                tests=tests,
                variant=self.scope.variant_of(variant),
                signatures=self.scope.signatures_of(fingerprint, tests),
                now=now,
            )
            data = entry.model_dump(mode="json")
            if row is None:
                session.add(
                    QuarantineRow(
                        fingerprint=fingerprint,
                        case_id=self.case_id,
                        entry=data,
                        clean_reruns=0,
                        updated_at=now,
                    )
                )
            else:
                row.entry, row.updated_at, row.clean_reruns = data, now, 0
        return ReportRef(kind="quarantine", location=f"quarantine:{fingerprint}", created=old is None)

    def remove(self, fingerprint: str) -> bool:
        with self.database.session() as session:
            row = session.get(QuarantineRow, fingerprint)
            if row is None:
                return False
            session.delete(row)
        return True
