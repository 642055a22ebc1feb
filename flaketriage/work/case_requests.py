"""The work a case's new standing asks for: its triage again (`retriage`), and the pull request
check runs a new verdict about its test changes (`refresh_checks`).

Shared by the workers (CI history sends a case back to triage and resolves fixed ones; a report or
a lift changes a verdict) and the orchestrator (the dashboard's re-triage and lift), so it lives in
the core, written once.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from flaketriage.records import Case, Occurrence
from flaketriage.records.models import CheckRunRow, ResultRow, TestRow, utc_now
from flaketriage.records.transitions import case_queued, case_suspected
from flaketriage.work.dispatch import Dispatcher, Outgoing
from flaketriage.work.messages import Queue, Step

REFRESH_DAYS = 14
"""A verdict updates the check runs of commits its test failed on in the last two weeks."""


def latest_bundle(session: Session, case_id: int) -> Occurrence | None:
    """The case's newest occurrence that names a bundle (what a triage of it replays), or None."""
    return session.scalars(
        select(Occurrence)
        .where(Occurrence.case_id == case_id, Occurrence.bundle_id.is_not(None))
        .order_by(Occurrence.id.desc())
        .limit(1)
    ).first()


def retriage(
    session: Session,
    dispatcher: Dispatcher,
    case: Case,
    bundle: Occurrence,
    *,
    why: str,
    options: dict[str, Any],
    suspected: bool = False,
) -> Outgoing | None:
    """Send `case` back to triage on `bundle` (`latest_bundle`): a new generation of it, queued
    (``suspected_flaky`` with `suspected`: CI history's doubt, until the replays answer it), and a
    triage recorded under the key ``triage:<case id>:<why>``, so asking twice for one reason gives
    one triage. The task to send once the session commits (None when the key was recorded before)."""
    case.generation += 1
    now = utc_now()
    if suspected:
        case_suspected(case, retriage_at=now)
    else:
        case_queued(case, triaged_at=now)
    _, sent = dispatcher.request(
        session,
        key=f"triage:{case.id}:{why}",
        step=Step.TRIAGE,
        queue=Queue.CPU,
        case_id=case.id,
        bundle_id=bundle.bundle_id,
        store_url=bundle.store_url,
        options=options,
    )
    return sent


def refresh_checks(
    session: Session, dispatcher: Dispatcher, case: Case, *, why: str
) -> list[Outgoing | None]:
    """Ask for the check runs a new verdict about `case` changes to be published again."""
    outgoing: list[Outgoing | None] = []
    for row in checks_to_refresh(session, case, since=utc_now() - timedelta(days=REFRESH_DAYS)):
        _, sent = dispatcher.request(
            session,
            key=f"check:{row.id}:case-{case.id}-{why}",
            step=Step.CHECK,
            queue=Queue.REPORT,
            options={"check_run": row.id},
        )
        outgoing.append(sent)
    return outgoing


def checks_to_refresh(session: Session, case: Case, *, since: datetime) -> list[CheckRunRow]:
    """The check runs of commits on which the case's test failed since `since`: what a new verdict
    about it changes."""
    if not case.test_id or not case.repository:
        return []
    commits = (
        select(ResultRow.commit)
        .join(TestRow, TestRow.id == ResultRow.test_pk)
        .where(
            TestRow.repository == case.repository,
            TestRow.test_id == case.test_id,
            ResultRow.received_at >= since,
        )
    )
    return list(
        session.scalars(
            select(CheckRunRow).where(
                CheckRunRow.repository == case.repository, CheckRunRow.head_sha.in_(commits)
            )
        )
    )
