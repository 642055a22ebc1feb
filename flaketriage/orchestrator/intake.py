"""Intake: what arrives becomes records first, then work.

One delivery (an event, a GitHub or Sentry webhook) carries zero or more `Sighting`s of failures.
`Intake.record` writes the delivery, each sighting's case and occurrence, and the triages they start,
in one transaction; only after it commits are the tasks sent. A delivery seen before does nothing.

When a failure starts a triage:

* a new case starts one, unless a failing test of the same cause (same exception and message,
  another test) started one within the storm window: then it follows that one (a storm of one root
  cause across hundreds of tests is triaged once);
* a known case starts none, unless it was closed as fixed (it reopens), it failed, or its last
  triage is older than the re-triage window (a storm follower's last triage is its leader's);
* an explicit request (a ``/flaketriage triage`` comment, a labelled issue) always starts one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from sqlalchemy import Connection, bindparam, func, insert, select, tuple_, update
from sqlalchemy.exc import IntegrityError

from flaketriage.dispatch import Dispatcher, Outgoing, WorkRequest
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


Item = tuple[str, str, str, Sequence[Sighting]]
"""One delivery: its source, its id at the source, its kind, and the failures it reports."""

_ATTEMPTS = 3
"""Tries of one delivery's transaction when a concurrent one commits a row it also inserts."""


def _column_text(text: str) -> str:
    # PostgreSQL text cannot hold NUL; the replacement character shows where one was.
    return text.replace("\x00", "\ufffd")


def _optional_text(text: str | None, longest: int | None = None) -> str | None:
    """`text` as a column holds it; None when it is longer than the column (a cut name is a wrong one)."""
    if text is None:
        return None
    text = _column_text(text)
    return None if longest is not None and len(text) > longest else text


def _storable(sighting: Sighting) -> Sighting:
    """`sighting` as the columns hold it (JSON columns keep NUL as ``\\u0000``, so provenance stays)."""
    return replace(
        sighting,
        title=_column_text(sighting.title)[:500],
        test_id=_optional_text(sighting.test_id),
        job=_optional_text(sighting.job),
        repository=_optional_text(sighting.repository, 200),
        store_url=_optional_text(sighting.store_url),
    )


def _merge(occurrence: dict[str, Any], sighting: Sighting) -> None:
    """Add what a second sighting of the same case in the same delivery knows to its occurrence."""
    occurrence["bundle_id"] = occurrence["bundle_id"] or sighting.bundle_id
    occurrence["store_url"] = occurrence["store_url"] or sighting.store_url
    occurrence["test_id"] = occurrence["test_id"] or sighting.test_id
    occurrence["provenance"] = sighting.provenance | dict(occurrence["provenance"])


def cause_key(kind: str, exception_type: str | None, message: str | None) -> str | None:
    """What many failing tests share when one cause breaks them all: the exception and its message,
    without the test. Only test failures have one: the fingerprint of any other failure already
    names its code path, and two programs failing alike elsewhere are two findings, not a storm."""
    if kind != "test" or (not exception_type and not message):
        return None
    text = f"{kind}|{exception_type or ''}|{normalize_message(message or '')}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_STATE = (
    Case.id,
    Case.fingerprint,
    Case.cause_key,
    Case.status,
    Case.error,
    Case.generation,
    Case.storm_of,
    Case.last_triage_at,
    Case.occurrences,
    Case.last_seen,
)
"""The columns of a case the triage rules read; all but the first three are written back."""


@dataclass
class _CaseRow:
    """A case as one transaction sees it: read once, changed in memory, written back at the end."""

    id: int
    fingerprint: str
    cause_key: str | None
    status: str
    error: str | None
    generation: int
    storm_of: int | None
    last_triage_at: datetime | None
    occurrences: int
    last_seen: datetime

    @classmethod
    def of(cls, row: Sequence[Any]) -> _CaseRow:
        """The case in `row`, a row of the `_STATE` columns."""
        return cls(*row)

    def changes(self) -> dict[str, Any]:
        """The parameters of `_WRITE_BACK` for this case."""
        return {
            "case_id": self.id,
            "status": self.status,
            "error": self.error,
            "generation": self.generation,
            "storm_of": self.storm_of,
            "last_triage_at": self.last_triage_at,
            "occurrences": self.occurrences,
            "last_seen": self.last_seen,
        }


_WRITE_BACK = update(Case).where(Case.id == bindparam("case_id"))
"""Executed with `_CaseRow.changes` of every case a batch sighted: the other keys are the SET clause."""


@dataclass
class _Batch:
    """What one transaction knows of the cases: every case it sights (created when missing, locked on
    PostgreSQL), the storm leaders those follow, and per cause the first case outside the batch that
    could lead a storm. Rows outside the batch are only read; the batch's own are changed here."""

    now: datetime
    sighted: dict[str, _CaseRow]
    """By fingerprint, in the order they were first sighted."""
    by_id: dict[int, _CaseRow]
    """The sighted cases, and the others the rules may read (leaders)."""
    new: set[int]
    """Cases created by this batch whose first sighting is still to come."""
    outside_leaders: dict[str, _CaseRow] = field(default_factory=dict)
    """Per cause, the first case outside the batch that leads a storm now (if any)."""
    by_cause: dict[str, list[_CaseRow]] = field(default_factory=dict)
    """The sighted cases by cause, in id order: the batch's own storm leader candidates."""
    occurrences: list[dict[str, Any]] = field(default_factory=list)

    def storm_leader(self, case: _CaseRow, window: timedelta) -> _CaseRow | None:
        """The first case of `case`'s cause triaged within `window` that follows no other: what a
        query would find had every change so far been written (the batch's own as they are now)."""
        assert case.cause_key is not None
        since = self.now - window
        leader = self.outside_leaders.get(case.cause_key)
        for other in self.by_cause.get(case.cause_key, ()):
            if leader is not None and other.id > leader.id:
                break
            if (
                other.id != case.id
                and other.storm_of is None
                and other.last_triage_at is not None
                and other.last_triage_at >= since
            ):
                return other
        return leader


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
        return self.record_batch([(source, delivery_id, kind, sightings)])[0]

    def record_batch(self, items: Sequence[Item]) -> list[IntakeResult]:
        """Record deliveries in one transaction (in order, as if one after another) and send their
        work once it commits. `RecordsError`: nothing was recorded; `BrokerError`: all was recorded,
        and the sweep sends the work when the broker is back."""
        prepared = [
            (
                source,
                _column_text(delivery_id)[:128],
                _column_text(kind)[:64],
                [_storable(s) for s in sightings],
            )
            for source, delivery_id, kind, sightings in items
        ]
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                results, outgoing = self._record_once(prepared)
                break
            except RecordsError as exc:
                # Another transaction committed a row this one also inserts: the same delivery (the
                # next attempt finds it and answers duplicate) or the first case of the same failure
                # (the next attempt adds to it). Either way, trying again sees what that one wrote.
                if not isinstance(exc.__cause__, IntegrityError) or attempt == _ATTEMPTS:
                    raise
        self.dispatcher.send(outgoing)
        return results

    def _record_once(self, items: Sequence[Item]) -> tuple[list[IntakeResult], list[Outgoing]]:
        """One transaction of a few statements, whatever the batch holds: the rules run on the rows
        in memory, and what they wrote goes back in one statement per table."""
        with self.database.transaction() as conn:
            known = _known_deliveries(conn, items)
            batch = self._batch(conn, items)
            deliveries: list[tuple[dict[str, Any] | None, list[int], list[WorkRequest]]] = []
            for source, delivery_id, kind, sightings in items:
                if (source, delivery_id) in known:
                    deliveries.append((None, [], []))
                    continue
                known.add((source, delivery_id))
                delivery = {
                    "source": source,
                    "delivery_id": delivery_id,
                    "kind": kind,
                    "outcome": (IntakeOutcome.RECORDED if sightings else IntakeOutcome.IGNORED).value,
                    "received_at": batch.now,
                }
                seen: dict[int, dict[str, Any]] = {}
                case_ids: list[int] = []
                requests: list[WorkRequest] = []
                for sighting in sightings:
                    case = batch.sighted[sighting.fingerprint]
                    request = self._sight(batch, source, delivery_id, sighting, case, seen)
                    if case.id not in case_ids:
                        case_ids.append(case.id)
                    if request is not None:
                        requests.append(request)
                deliveries.append((delivery, case_ids, requests))
            created = self.dispatcher.request_many(conn, [r for _, _, rs in deliveries for r in rs])
            outgoing: list[Outgoing] = []
            results: list[IntakeResult] = []
            for recorded, case_ids, requests in deliveries:
                if recorded is None:
                    results.append(IntakeResult(IntakeOutcome.DUPLICATE))
                    continue
                works: list[int] = []
                for request in requests:
                    sent = created.pop(request.key, None)
                    if sent is None:
                        continue  # recorded before, or asked for again in this batch: started once
                    works.append(sent.order.work_id)
                    outgoing.append(sent)
                    started = batch.by_id[request.case_id or 0]
                    started.status, started.error, started.storm_of = CaseStatus.QUEUED.value, None, None
                if works:
                    recorded["outcome"] = IntakeOutcome.ACCEPTED.value
                outcome = IntakeOutcome(recorded["outcome"])
                results.append(IntakeResult(outcome, tuple(case_ids), tuple(works)))
            rows = [recorded for recorded, _, _ in deliveries if recorded is not None]
            if rows:
                conn.execute(insert(Delivery), rows)
            if batch.occurrences:
                conn.execute(insert(Occurrence), batch.occurrences)
            if batch.sighted:
                conn.execute(_WRITE_BACK, [case.changes() for case in batch.sighted.values()])
        return results, outgoing

    # -- the cases of a batch ------------------------------------------------------------------
    def _batch(self, conn: Connection, items: Sequence[Item]) -> _Batch:
        """Every case the batch sights, by fingerprint (locked on PostgreSQL), the missing ones
        created in one statement; then what the rules may read besides: leaders, storm candidates."""
        now = self.clock()
        first: dict[str, Sighting] = {}
        for _, _, _, sightings in items:
            for sighting in sightings:
                first.setdefault(sighting.fingerprint, sighting)
        found: dict[str, _CaseRow] = {}
        if first:
            query = select(*_STATE).where(Case.fingerprint.in_(sorted(first))).order_by(Case.id)
            if not self.database.is_sqlite:
                query = query.with_for_update()
            found = {row.fingerprint: _CaseRow.of(row) for row in conn.execute(query)}
        missing = [s for fingerprint, s in first.items() if fingerprint not in found]
        new = _create_cases(conn, missing, now)
        sighted = {fingerprint: found.get(fingerprint) or new[fingerprint] for fingerprint in first}
        batch = _Batch(
            now=now,
            sighted=sighted,
            by_id={case.id: case for case in sighted.values()},
            new={case.id for case in new.values()},
        )
        self._load_leaders(conn, batch)
        return batch

    def _load_leaders(self, conn: Connection, batch: _Batch) -> None:
        """The leaders the batch's followers follow, and per cause the first case outside the batch
        that leads a storm now: rows outside the batch do not change while it runs."""
        followed = {c.storm_of for c in batch.sighted.values() if c.storm_of is not None} - batch.by_id.keys()
        if followed:
            for row in conn.execute(select(*_STATE).where(Case.id.in_(sorted(followed)))):
                batch.by_id[row.id] = _CaseRow.of(row)
        if self.storm_window <= timedelta(0):
            return
        for case in sorted(batch.sighted.values(), key=lambda c: c.id):
            if case.cause_key is not None:
                batch.by_cause.setdefault(case.cause_key, []).append(case)
        if not batch.by_cause:
            return
        first = (
            select(func.min(Case.id))
            .where(
                Case.cause_key.in_(sorted(batch.by_cause)),
                Case.id.not_in(sorted(c.id for c in batch.sighted.values())),
                Case.storm_of.is_(None),
                Case.last_triage_at >= batch.now - self.storm_window,
            )
            .group_by(Case.cause_key)
        )
        for row in conn.execute(select(*_STATE).where(Case.id.in_(first.scalar_subquery()))):
            leader = batch.by_id.setdefault(row.id, _CaseRow.of(row))
            batch.outside_leaders[str(leader.cause_key)] = leader

    # -- one sighting ---------------------------------------------------------------------------
    def _sight(
        self,
        batch: _Batch,
        source: str,
        delivery_id: str,
        sighting: Sighting,
        case: _CaseRow,
        seen: dict[int, dict[str, Any]],
    ) -> WorkRequest | None:
        new = case.id in batch.new
        batch.new.discard(case.id)
        if case.id in seen:
            # One delivery, one occurrence per case: a Sentry event whose exception is the tagged
            # bundle's, or a check run naming two bundles of one failure, sees the case twice.
            _merge(seen[case.id], sighting)
        else:
            case.occurrences += 1
            case.last_seen = batch.now
            seen[case.id] = {
                "case_id": case.id,
                "source": source,
                "delivery_id": delivery_id,
                "bundle_id": sighting.bundle_id,
                "store_url": sighting.store_url,
                "test_id": sighting.test_id,
                "provenance": sighting.provenance,
                "received_at": batch.now,
            }
            batch.occurrences.append(seen[case.id])
        if not sighting.bundle_id or sighting.trigger == "never":
            return None
        key = self._triage_key(batch, case, new, sighting, delivery_id)
        if key is None:
            return None
        options: dict[str, Any] = {"minimize": self.minimize}
        if sighting.reply_to:
            options["reply_to"] = sighting.reply_to
        # Later sightings in this batch see the triage this one starts, as they would have seen it
        # committed had they come one at a time.
        case.status, case.last_triage_at = CaseStatus.QUEUED.value, batch.now
        return WorkRequest(
            key=key,
            step=Step.TRIAGE,
            queue=Queue.CPU,
            case_id=case.id,
            bundle_id=sighting.bundle_id,
            store_url=sighting.store_url,
            options=options,
        )

    def _triage_key(
        self, batch: _Batch, case: _CaseRow, new: bool, sighting: Sighting, delivery_id: str
    ) -> str | None:
        """The key of the triage this sighting starts, or None when it starts none."""
        if sighting.trigger == "always":
            # Keys are at most 200 characters; a delivery id may be 128.
            request = hashlib.sha256(delivery_id.encode("utf-8")).hexdigest()[:32]
            return f"triage:{case.id}:{sighting.bundle_id}:request:{request}"
        if new or case.status == CaseStatus.OPEN.value:
            leader = self._storm_leader(batch, case)
            if leader is not None:
                case.storm_of = leader.id
                case.status = leader.status
                return None
            return f"triage:{case.id}:g{case.generation}"
        status, last = case.status, case.last_triage_at
        leader = batch.by_id.get(case.storm_of) if case.storm_of is not None else None
        if leader is not None and last is None:
            # A storm follower was never triaged itself: its leader's triage stands for it.
            status, last = leader.status, leader.last_triage_at
        stale = last is None or batch.now - last > self.retriage_after
        if status in (CaseStatus.FIXED.value, CaseStatus.FAILED.value) or stale:
            case.generation += 1
            return f"triage:{case.id}:g{case.generation}"
        return None

    def _storm_leader(self, batch: _Batch, case: _CaseRow) -> _CaseRow | None:
        if not case.cause_key or self.storm_window <= timedelta(0):
            return None
        return batch.storm_leader(case, self.storm_window)


def _known_deliveries(conn: Connection, items: Sequence[Item]) -> set[tuple[str, str]]:
    pairs = {(source, delivery_id) for source, delivery_id, _, _ in items}
    found = conn.execute(
        select(Delivery.source, Delivery.delivery_id).where(
            tuple_(Delivery.source, Delivery.delivery_id).in_(sorted(pairs))
        )
    )
    return {(source, delivery_id) for source, delivery_id in found}


def _create_cases(conn: Connection, sightings: Sequence[Sighting], now: datetime) -> dict[str, _CaseRow]:
    """New cases for the first sightings of failures no case has yet, in one statement, by fingerprint."""
    if not sightings:
        return {}
    rows = [
        {
            "fingerprint": s.fingerprint,
            "cause_key": s.cause_key,
            "kind": s.kind,
            "title": s.title[:500],
            "test_id": s.test_id,
            "job": s.job,
            "repository": s.repository,
            "status": CaseStatus.OPEN.value,
            "first_seen": now,
            "last_seen": now,
            "occurrences": 0,
            "generation": 0,
        }
        for s in sightings
    ]
    ids = conn.execute(insert(Case).returning(Case.id, sort_by_parameter_order=True), rows).scalars().all()
    return {
        s.fingerprint: _CaseRow(
            id=case_id,
            fingerprint=s.fingerprint,
            cause_key=s.cause_key,
            status=CaseStatus.OPEN.value,
            error=None,
            generation=0,
            storm_of=None,
            last_triage_at=None,
            occurrences=0,
            last_seen=now,
        )
        for s, case_id in zip(sightings, ids, strict=True)
    }
