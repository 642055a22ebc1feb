"""Where cases and work rows go: every change of a case's or a work row's status, by name.

A case goes ``open | queued → triaging → decided → reported`` (or ``failed``, or ``fixed`` when an
isolation rerun, or a person, lifts its quarantine); a storm follower takes its leader's status
and verdict. A work row goes ``queued → running → done`` (or ``failed``), a triage through
``waiting`` while its replays are out. The orchestrator (a case is queued, or follows a storm
leader; the dashboard's re-triage and lift) and the workers (every step after) change them here
and nowhere else.

Each function is one write and asks nothing of the database: the ``session`` ones are one UPDATE
statement (a conditional one where the status it starts from matters), the others change a row the
caller holds (an ORM row, or the intake's `CaseRow`), written with the caller's transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import update
from sqlalchemy.orm import Session

from flaketriage.records.models import Case, CaseStatus, Work, WorkStatus, utc_now


class CaseState(Protocol):
    """The columns of a case the intake changes (an ORM `Case` or the intake's own row)."""

    id: int
    status: str
    error: str | None
    storm_of: int | None
    last_triage_at: datetime | None


# -- work -----------------------------------------------------------------------------------------
def work_queued(session: Session, work_id: int, *, queue: str) -> None:
    """The step is moved to `queue` and waits there to be taken again (sent now)."""
    values = {"queue": queue, "status": WorkStatus.QUEUED.value, "heartbeat_at": None, "sent_at": utc_now()}
    _set_work(session, work_id, **values)


def work_waiting(session: Session, work_id: int) -> None:
    """The triage waits for its replays (sent out now): the last to finish sends it on."""
    _set_work(session, work_id, status=WorkStatus.WAITING.value, heartbeat_at=None, sent_at=utc_now())


def work_done(session: Session, work_id: int, *, result: dict[str, Any]) -> None:
    """The step is done, with `result`."""
    values = {
        "status": WorkStatus.DONE.value,
        "result": result,
        "finished_at": utc_now(),
        "heartbeat_at": None,
    }
    _set_work(session, work_id, **values)


def work_row_done(work: Work, *, result: dict[str, Any]) -> None:
    """`work_done` of a row the session holds."""
    work.result = result
    work.status = WorkStatus.DONE.value
    work.finished_at = utc_now()
    work.heartbeat_at = None


def work_resent(work: Work, *, now: datetime) -> None:
    """The step is handed to the broker again (it waited too long, or its worker's lease ran out:
    then it is queued again)."""
    work.sent_at = now
    if work.status == WorkStatus.RUNNING.value:
        work.status = WorkStatus.QUEUED.value


def _set_work(session: Session, work_id: int, **values: Any) -> None:
    session.execute(
        update(Work).where(Work.id == work_id).values(**values).execution_options(synchronize_session=False)
    )


# -- cases ----------------------------------------------------------------------------------------
def case_queued(case: CaseState, *, triaged_at: datetime | None = None) -> None:
    """A triage of the case is asked for (at `triaged_at`, when given): it follows no storm leader
    and its last error is gone."""
    case.status = CaseStatus.QUEUED.value
    if triaged_at is not None:
        case.last_triage_at = triaged_at
    case.error, case.storm_of = None, None


def case_follows(case: CaseState, leader: CaseState) -> None:
    """The case joins `leader`'s triage (one cause, another test) and stands where it stands."""
    case.storm_of = leader.id
    case.status = leader.status


def case_suspected(case: CaseState, *, retriage_at: datetime | None = None) -> None:
    """CI history suspects the case's test of flakiness (it failed and passed on one commit, or its
    outcome flips); with `retriage_at`, a triage of its bundle is asked for then, to confirm it."""
    if retriage_at is not None:
        case_queued(case, triaged_at=retriage_at)
    case.status = CaseStatus.SUSPECTED_FLAKY.value


def case_triaging(session: Session, case_id: int | None) -> None:
    """The case's triage started: only from ``queued`` or ``suspected_flaky`` (a case decided
    meanwhile stays decided)."""
    _set_case_status(
        session, case_id, CaseStatus.TRIAGING, only_from=(CaseStatus.QUEUED, CaseStatus.SUSPECTED_FLAKY)
    )


def case_decided(case: Case, *, verdict: str | None, evidence: dict[str, Any]) -> None:
    """A triage decided the case (`verdict` None: its budget stopped it first), on `evidence`
    (its `TriageResult.to_json()`)."""
    case.verdict = verdict
    case.status = CaseStatus.DECIDED.value
    case.evidence = evidence


def case_reported(
    session: Session, case: Case, *, evidence: dict[str, Any], report: tuple[str, str] | None
) -> None:
    """The case's verdict is reported (`report`: the kind and location of what was filed, None when
    nothing was); the cases that joined its triage take its status, verdict and report, and so do
    the cases CI history opened about its test (``history``, still ``suspected_flaky``): the replays
    of a captured failure of that test answered their suspicion."""
    case.evidence = evidence
    case.status = CaseStatus.REPORTED.value
    if report is not None:
        case.report_kind, case.report_url = report
    if case.kind != "history" and case.test_id is not None:
        session.execute(
            update(Case)
            .where(
                Case.kind == "history",
                Case.status == CaseStatus.SUSPECTED_FLAKY.value,
                Case.test_id == case.test_id,
                Case.repository.is_not_distinct_from(case.repository),
            )
            .values(storm_of=case.id)
            .execution_options(synchronize_session=False)
        )
    session.execute(
        update(Case)
        .where(Case.storm_of == case.id)
        .values(
            status=case.status,
            verdict=case.verdict,
            report_kind=case.report_kind,
            report_url=case.report_url,
        )
        .execution_options(synchronize_session=False)
    )


def case_fixed(case: Case, *, verdict: str) -> None:
    """Isolated reruns, or CI runs on its branch, no longer reproduce the case's failure: it is
    fixed (recorded with `verdict`), and its quarantine is lifted."""
    case.status, case.verdict = CaseStatus.FIXED.value, verdict


def case_lifted(case: Case) -> None:
    """A person lifted the case's quarantine (the dashboard): it is fixed, as an isolation rerun
    would have found it, and keeps its verdict (no replay said otherwise)."""
    case.status = CaseStatus.FIXED.value


def case_failed(case: Case, *, error: str) -> None:
    """A step of the case failed with `error`."""
    case.status, case.error = CaseStatus.FAILED.value, error


def _set_case_status(
    session: Session, case_id: int | None, status: CaseStatus, *, only_from: tuple[CaseStatus, ...]
) -> None:
    """`status`, for a case whose status is one of `only_from` (one conditional UPDATE)."""
    if case_id is None:
        return
    session.execute(
        update(Case)
        .where(Case.id == case_id, Case.status.in_([s.value for s in only_from]))
        .values(status=status.value)
        .execution_options(synchronize_session=False)
    )
