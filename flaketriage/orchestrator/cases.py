"""Reading cases for the API: summaries, one case in full, and the quarantine document."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import selectinload

from flaketriage.orchestrator.api_models import (
    CaseDetail,
    CaseSummary,
    OccurrenceView,
    ProgressView,
    ReplayView,
    TriageCostView,
    WorkView,
)
from flaketriage.orchestrator.history import case_impact
from flaketriage.orchestrator.run_links import linked_cases
from flaketriage.quarantine import QuarantineDocument, QuarantineEntry
from flaketriage.records import Case, Database, QuarantineRow, Work, WorkStatus
from flaketriage.records.text import storable_json


class CaseQuery:
    """Cases as the API answers them. Their stored JSON is shown through `storable_json`: a row
    written before the intake made text storable answers all the same."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def list(self, *, status: str | None, verdict: str | None, limit: int) -> list[CaseSummary]:
        query = select(Case).options(selectinload(Case.occurrence_rows)).order_by(Case.last_seen.desc())
        if status:
            query = query.where(Case.status == status)
        if verdict:
            query = query.where(Case.verdict == verdict)
        with self.database.session() as session:
            return [summary(case) for case in session.scalars(query.limit(limit)).all()]

    def get(self, case_id: int) -> CaseDetail | None:
        with self.database.session() as session:
            case = session.scalars(
                select(Case)
                .where(Case.id == case_id)
                .options(
                    selectinload(Case.occurrence_rows),
                    selectinload(Case.work_rows).selectinload(Work.replays),
                )
            ).first()
            if case is None:
                return None
            return CaseDetail(
                **summary(case).model_dump(),
                evidence=storable_json(case.evidence),
                cost=_cost(case.evidence),
                impact=case_impact(session, case),
                progress=progress_of(case.work_rows),
                linked_cases=linked_cases(session, case),
                occurrence_list=[
                    OccurrenceView(
                        source=o.source,
                        delivery_id=o.delivery_id,
                        bundle_id=o.bundle_id,
                        test_id=o.test_id,
                        provenance=storable_json(o.provenance),
                        received_at=o.received_at,
                    )
                    for o in case.occurrence_rows
                ],
                triage_runs=[
                    WorkView(
                        id=w.id,
                        step=w.step,
                        status=w.status,
                        bundle_id=w.bundle_id,
                        queue=w.queue,
                        attempts=w.attempts,
                        created_at=w.created_at,
                        started_at=w.started_at,
                        finished_at=w.finished_at,
                        result=storable_json(w.result),
                        error=w.error,
                        replays=[
                            ReplayView(
                                index=r.idx,
                                outcome=r.outcome,
                                fingerprint=r.fingerprint,
                                summary=r.summary,
                                duration_s=r.duration_s,
                                cpu_s=r.cpu_s,
                                gpu_s=r.gpu_s,
                                runner=r.runner,
                                worker=r.worker,
                            )
                            for r in w.replays
                        ],
                    )
                    for w in case.work_rows
                ],
            )


UNDER_WAY = (WorkStatus.QUEUED.value, WorkStatus.RUNNING.value, WorkStatus.WAITING.value)
"""Work statuses of a step not over (``waiting``: a triage whose replays are out)."""
_STEPS = {"triage": "verdict"}
"""The step a work row is, where its name is not the step's (a triage is the verdict's replays)."""


def progress_of(works: Sequence[Work]) -> ProgressView | None:
    """How far the latest step under way is: its name (the one a triage that runs in one task
    recorded, else the work's), and the replays of the latest triage done and planned."""
    active = [w for w in works if w.status in UNDER_WAY and w.step != "replay"]
    if not active:
        return None
    work = active[-1]
    triages = [w for w in works if w.step == "triage" and w.id <= work.id]
    replays = triages[-1].replays if triages else []
    done = sum(1 for r in replays if r.outcome is not None)
    recorded = (work.result or {}).get("progress") if work.status == WorkStatus.RUNNING.value else None
    recorded = recorded if isinstance(recorded, dict) else {}
    planned = recorded.get("planned")
    return ProgressView(
        step=str(recorded.get("step") or _STEPS.get(work.step, work.step)),
        replays_done=done,
        replays_planned=max(len(replays), done, planned if isinstance(planned, int) else 0),
        work_id=work.id,
    )


def _cost(evidence: dict[str, Any] | None) -> TriageCostView | None:
    """The triage's cost from its recorded result (results recorded before costs have none)."""
    cost = (evidence or {}).get("cost")
    return TriageCostView.model_validate(cost) if cost else None


def summary(case: Case) -> CaseSummary:
    bundles = list(dict.fromkeys(o.bundle_id for o in case.occurrence_rows if o.bundle_id))
    return CaseSummary(
        id=case.id,
        fingerprint=case.fingerprint,
        kind=case.kind,
        title=case.title,
        status=case.status,
        verdict=case.verdict,
        test_id=case.test_id,
        job=case.job,
        repository=case.repository,
        occurrences=case.occurrences,
        first_seen=case.first_seen,
        last_seen=case.last_seen,
        bundles=bundles,
        report_kind=case.report_kind,
        report_url=case.report_url,
        storm_of=case.storm_of,
        error=case.error,
    )


def quarantine_document(database: Database) -> QuarantineDocument:
    with database.session() as session:
        rows = session.scalars(select(QuarantineRow).order_by(QuarantineRow.fingerprint)).all()
        entries = {row.fingerprint: QuarantineEntry.model_validate(row.entry) for row in rows}
    return QuarantineDocument(entries=entries)
