"""Intake: what arrives becomes records first, then work.

One delivery (an event, a GitHub or Sentry webhook) carries zero or more `Sighting`s of failures.
`Intake.record` writes the delivery, each sighting's case and occurrence, and the triages they start,
in one transaction; only after it commits are the tasks sent. A delivery seen before does nothing.

When a failure starts a triage:

* a new case starts one, unless a case of the same cause (same exception and message, another test)
  started one within the storm window: then it follows that one (a storm of one root cause across
  hundreds of tests is triaged once);
* a known case starts none, unless it was closed as fixed (it reopens), it failed, or its last
  triage is older than the re-triage window;
* an explicit request (a ``/flaketriage triage`` comment, a labelled issue) always starts one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from flaketriage.dispatch import Dispatcher, Outgoing
from flaketriage.errors import RecordsError
from flaketriage.normalize import normalize_message
from flaketriage.records import Case, CaseStatus, Database, Delivery, Occurrence
from flaketriage.records.models import utc_now
from flaketriage.work import Queue, Step

Trigger = Literal["auto", "always", "never"]


class IntakeOutcome(StrEnum):
    ACCEPTED = "accepted"
    """Recorded, and work was started."""
    RECORDED = "recorded"
    """Recorded; no new work (a known failure, or nothing to replay)."""
    DUPLICATE = "duplicate"
    IGNORED = "ignored"


@dataclass(frozen=True)
class Sighting:
    """One failure as a source reports it."""

    fingerprint: str
    kind: Literal["bundle", "workflow", "sentry"]
    title: str
    cause_key: str | None = None
    test_id: str | None = None
    job: str | None = None
    repository: str | None = None
    bundle_id: str | None = None
    store_url: str | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    trigger: Trigger = "auto"
    reply_to: dict[str, Any] | None = None
    """Where to comment the result (``{"repository": "o/r", "issue": 12}``) when one was asked for."""


@dataclass(frozen=True)
class IntakeResult:
    outcome: IntakeOutcome
    cases: tuple[int, ...] = ()
    work: tuple[int, ...] = ()


def cause_key(kind: str, exception_type: str | None, message: str | None) -> str | None:
    """The failure without the test that hit it; None when there is too little to tell causes apart."""
    if not exception_type and not message:
        return None
    text = f"{kind}|{exception_type or ''}|{normalize_message(message or '')}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Intake:
    """Records deliveries in `database` and starts triages through `dispatcher`."""

    def __init__(
        self,
        database: Database,
        dispatcher: Dispatcher,
        *,
        retriage_after_s: float,
        storm_window_s: float,
        minimize: bool = True,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.database = database
        self.dispatcher = dispatcher
        self.retriage_after = timedelta(seconds=retriage_after_s)
        self.storm_window = timedelta(seconds=storm_window_s)
        self.minimize = minimize
        self.clock = clock

    def record(self, source: str, delivery_id: str, kind: str, sightings: Sequence[Sighting]) -> IntakeResult:
        """Record one delivery; raises `RecordsError` (nothing recorded) when the database fails."""
        outgoing: list[Outgoing | None] = []
        try:
            with self.database.session() as session:
                if session.scalars(
                    select(Delivery.id).where(Delivery.source == source, Delivery.delivery_id == delivery_id)
                ).first():
                    return IntakeResult(IntakeOutcome.DUPLICATE)
                outcome = IntakeOutcome.RECORDED if sightings else IntakeOutcome.IGNORED
                session.add(
                    Delivery(
                        source=source,
                        delivery_id=delivery_id,
                        kind=kind,
                        outcome=outcome.value,
                        received_at=self.clock(),
                    )
                )
                session.flush()  # a concurrent duplicate fails here, before any case is touched
                cases: list[int] = []
                works: list[int] = []
                for sighting in sightings:
                    case, sent = self._sight(session, source, delivery_id, sighting)
                    cases.append(case.id)
                    if sent is not None:
                        works.append(sent.order.work_id)
                        outgoing.append(sent)
                if works:
                    outcome = IntakeOutcome.ACCEPTED
                    session.execute(
                        update(Delivery)
                        .where(Delivery.source == source, Delivery.delivery_id == delivery_id)
                        .values(outcome=outcome.value)
                        .execution_options(synchronize_session=False)
                    )
        except RecordsError as exc:
            if isinstance(exc.__cause__, IntegrityError):
                return IntakeResult(IntakeOutcome.DUPLICATE)
            raise
        self.dispatcher.send(outgoing)
        return IntakeResult(outcome, tuple(cases), tuple(works))

    # -- one sighting ---------------------------------------------------------------------------
    def _sight(
        self, session: Session, source: str, delivery_id: str, sighting: Sighting
    ) -> tuple[Case, Outgoing | None]:
        now = self.clock()
        query = select(Case).where(Case.fingerprint == sighting.fingerprint)
        if not self.database.is_sqlite:
            query = query.with_for_update()
        case = session.scalars(query).first()
        new = case is None
        if case is None:
            case = Case(
                fingerprint=sighting.fingerprint,
                cause_key=sighting.cause_key,
                kind=sighting.kind,
                title=sighting.title[:500],
                test_id=sighting.test_id,
                job=sighting.job,
                repository=sighting.repository,
                status=CaseStatus.OPEN.value,
                first_seen=now,
                last_seen=now,
                occurrences=0,
                generation=0,
            )
            session.add(case)
            session.flush()
        case.occurrences += 1
        case.last_seen = now
        session.add(
            Occurrence(
                case_id=case.id,
                source=source,
                delivery_id=delivery_id,
                bundle_id=sighting.bundle_id,
                store_url=sighting.store_url,
                test_id=sighting.test_id,
                provenance=sighting.provenance,
                received_at=now,
            )
        )
        if not sighting.bundle_id or sighting.trigger == "never":
            return case, None
        key = self._triage_key(session, case, new, sighting, delivery_id, now)
        if key is None:
            return case, None
        options: dict[str, Any] = {"minimize": self.minimize}
        if sighting.reply_to:
            options["reply_to"] = sighting.reply_to
        _, sent = self.dispatcher.request(
            session,
            key=key,
            step=Step.TRIAGE,
            queue=Queue.CPU,
            case_id=case.id,
            bundle_id=sighting.bundle_id,
            store_url=sighting.store_url,
            options=options,
        )
        if sent is not None:
            case.status = CaseStatus.QUEUED.value
            case.error = None
            case.storm_of = None
            case.last_triage_at = now
        return case, sent

    def _triage_key(
        self, session: Session, case: Case, new: bool, sighting: Sighting, delivery_id: str, now: datetime
    ) -> str | None:
        """The key of the triage this sighting starts, or None when it starts none."""
        if sighting.trigger == "always":
            return f"triage:{case.id}:{sighting.bundle_id}:request:{delivery_id}"
        if new or case.status == CaseStatus.OPEN.value:
            leader = self._storm_leader(session, case, now)
            if leader is not None:
                case.storm_of = leader.id
                case.status = leader.status
                return None
            return f"triage:{case.id}:g{case.generation}"
        last = case.last_triage_at
        stale = last is None or now - last > self.retriage_after
        if case.status in (CaseStatus.FIXED.value, CaseStatus.FAILED.value) or stale:
            case.generation += 1
            return f"triage:{case.id}:g{case.generation}"
        return None

    def _storm_leader(self, session: Session, case: Case, now: datetime) -> Case | None:
        if not case.cause_key or self.storm_window <= timedelta(0):
            return None
        return session.scalars(
            select(Case)
            .where(
                Case.cause_key == case.cause_key,
                Case.id != case.id,
                Case.storm_of.is_(None),
                Case.last_triage_at >= now - self.storm_window,
            )
            .order_by(Case.id)
            .limit(1)
        ).first()
