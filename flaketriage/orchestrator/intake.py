"""Intake: what arrives becomes records first, then work.

One delivery (an event, a GitHub or Sentry webhook) carries zero or more `Sighting`s of failures.
`Intake.record` writes the delivery, each sighting's case and occurrence, and the triages they start,
in one transaction; only after it commits are the tasks sent. A delivery seen before does nothing:
it writes no case, occurrence or work, whatever failures it names (a repeated id with another body).

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

from sqlalchemy import Connection, update
from sqlalchemy.exc import IntegrityError

from flaketriage.errors import RecordsError
from flaketriage.failure.normalize import normalize_message
from flaketriage.orchestrator.case_batch import CaseBatch, CaseRow, NewCase
from flaketriage.records import CaseStatus, Database, Delivery
from flaketriage.records.bulk import insert_query, one_of
from flaketriage.records.database import Query, deferred, fetch
from flaketriage.records.models import utc_now
from flaketriage.records.provenance import branch_of, run_url_of
from flaketriage.records.text import storable_json, storable_text
from flaketriage.records.transitions import case_follows, case_queued
from flaketriage.settings import Settings
from flaketriage.work.dispatch import Dispatcher, Outgoing, TaskSender, WorkRequest
from flaketriage.work.messages import Queue, Step

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
    """What replays of its bundle are matched against."""
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
    identity: str | None = None
    """The key of its case where that is not the fingerprint (a pytest test's exception through its
    code path: `flaketriage.bundle.manifest.Failure.identity`)."""

    @property
    def case_identity(self) -> str:
        """What its case is found by: `identity`, else the fingerprint (a case recorded before cases
        had identities is found by its fingerprint too, and adopts the identity: `CaseBatch`)."""
        return self.identity or self.fingerprint


@dataclass(frozen=True)
class IntakeResult:
    outcome: IntakeOutcome
    cases: tuple[int, ...] = ()
    work: tuple[int, ...] = ()


Item = tuple[str, str, str, Sequence[Sighting]]
"""One delivery: its source, its id at the source, its kind, and the failures it reports."""

_ATTEMPTS = 3
"""Tries of one delivery's transaction when a concurrent one commits a row it also inserts."""


def _optional_text(text: str | None, longest: int | None = None) -> str | None:
    """`text` as a column holds it; None when it is longer than the column (a cut name is a wrong one)."""
    if text is None:
        return None
    text = storable_text(text)
    return None if longest is not None and len(text) > longest else text


def _storable(sighting: Sighting) -> Sighting:
    """`sighting` as the records hold it, whatever route it came by: its columns without NUL or lone
    surrogates (a command's undecodable bytes are in its title), its JSON without lone surrogates,
    NaN or infinities (`flaketriage.records.text`)."""
    return replace(
        sighting,
        fingerprint=storable_text(sighting.fingerprint),
        identity=_optional_text(sighting.identity),
        cause_key=_optional_text(sighting.cause_key),
        title=storable_text(sighting.title)[:500],
        test_id=_optional_text(sighting.test_id),
        job=_optional_text(sighting.job),
        repository=_optional_text(sighting.repository, 200),
        store_url=_optional_text(sighting.store_url),
        provenance=storable_json(sighting.provenance),
        reply_to=storable_json(sighting.reply_to),
    )


def _merge(occurrence: dict[str, Any], sighting: Sighting) -> None:
    """Add what a second sighting of the same case in the same delivery knows to its occurrence."""
    occurrence["bundle_id"] = occurrence["bundle_id"] or sighting.bundle_id
    occurrence["store_url"] = occurrence["store_url"] or sighting.store_url
    occurrence["test_id"] = occurrence["test_id"] or sighting.test_id
    occurrence["provenance"] = sighting.provenance | dict(occurrence["provenance"])
    occurrence["run_url"] = run_url_of(occurrence["provenance"])
    occurrence["branch"] = branch_of(occurrence["provenance"])


def cause_key(kind: str, exception_type: str | None, message: str | None) -> str | None:
    """What many failing tests share when one cause breaks them all: the exception and its message,
    without the test. Only test failures have one: the fingerprint of any other failure already
    names its code path, and two programs failing alike elsewhere are two findings, not a storm."""
    if kind != "test" or (not exception_type and not message):
        return None
    text = f"{kind}|{exception_type or ''}|{normalize_message(message or '')}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_ACCEPTED = {
    name: update(Delivery).where(id_in).values(outcome=IntakeOutcome.ACCEPTED.value)
    for name, id_in in one_of(Delivery.id, "ids").items()
}


@dataclass
class _Triage:
    """A triage a sighting starts: its work is asked for once the case has its id."""

    case: CaseRow
    key: str
    """The work key without the case: ``triage:<case id>:<key>``."""
    sighting: Sighting
    options: dict[str, Any]

    @property
    def work_key(self) -> str:
        return f"triage:{self.case.id}:{self.key}"

    def request(self) -> WorkRequest:
        return WorkRequest(
            key=self.work_key,
            step=Step.TRIAGE,
            queue=Queue.CPU,
            case_id=self.case.id,
            bundle_id=self.sighting.bundle_id,
            store_url=self.sighting.store_url,
            options=self.options,
        )


@dataclass
class _Delivery:
    id: int
    row: dict[str, Any]
    """The delivery's row as inserted; its outcome is final once its work is asked for."""
    cases: list[CaseRow] = field(default_factory=list)
    triages: list[_Triage] = field(default_factory=list)
    work: tuple[int, ...] = ()


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
        results, outgoing = self.commit_batch(items)
        self.dispatcher.send(outgoing)
        return results

    def commit_batch(self, items: Sequence[Item]) -> tuple[list[IntakeResult], list[Outgoing]]:
        """`record_batch` but for the sending: the results, and the tasks to send (`Dispatcher.send`)
        before anyone is told the deliveries were accepted."""
        prepared = [
            (
                source,
                storable_text(delivery_id)[:128],
                storable_text(kind)[:64],
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
        return results, outgoing

    def _record_once(self, items: Sequence[Item]) -> tuple[list[IntakeResult], list[Outgoing]]:
        """One transaction of a few statements, whatever the batch holds: the rules run on the rows
        in memory (`CaseBatch`), and what they wrote goes back in a statement or two per table."""
        now = self.clock()
        rows = _delivery_rows(items, now)
        with self.database.transaction() as conn:
            # The deliveries are inserted first: a repeated one (recorded before, or by a concurrent
            # transaction) is the one the unique index skips, found without a query whose plan
            # could go wrong on a table the planner has no statistics of yet. In the same round trip
            # as the cases' reads.
            along = []
            if rows:
                along.append(
                    insert_query(
                        conn,
                        Delivery,
                        list(rows.values()),
                        returning=("id", "source", "delivery_id"),
                        skip_conflicts_on=("source", "delivery_id"),
                    )
                )
            first = _first_sightings(items)
            batch, given = CaseBatch.load(conn, first, now, self.storm_window, along=along)
            new = {(src, did): (id_, rows[src, did]) for written in given for id_, src, did in written}
            added = [new.pop((source, delivery_id), None) for source, delivery_id, _, _ in items]
            recorded = [item for item, row in zip(items, added, strict=True) if row is not None]
            kept = _first_sightings(recorded)
            if list(kept.items()) != list(first.items()):
                # A repeated delivery (recorded before, by a concurrent transaction, or earlier in
                # this batch) writes nothing, whatever it sights: read again for the failures of the
                # deliveries recorded now alone, so that no case is made, nor identity adopted, for
                # a delivery that is not recorded (it would be a case without an occurrence).
                batch, _ = CaseBatch.load(conn, kept, now, self.storm_window)
            deliveries: list[_Delivery | None] = []
            for (source, delivery_id, _, sightings), row in zip(items, added, strict=True):
                if row is None:  # recorded before, or earlier in this batch
                    deliveries.append(None)
                    continue
                delivery = _Delivery(*row)
                seen: dict[int, dict[str, Any]] = {}
                for sighting in sightings:
                    case = batch.sighted[sighting.case_identity]
                    triage = self._sight(batch, source, delivery_id, sighting, case, seen)
                    if case not in delivery.cases:
                        delivery.cases.append(case)
                    if triage is not None:
                        delivery.triages.append(triage)
                deliveries.append(delivery)
            batch.create_new(conn)  # the cases have their ids from here on
            outgoing = self._start(conn, [d for d in deliveries if d is not None])
            accepted = [d.id for d in deliveries if d is not None and d.work]
            with deferred(conn):  # nothing reads these back: they go with the COMMIT
                if accepted:
                    fetch(conn, Query(_ACCEPTED[conn.dialect.name], {"ids": accepted}))
                batch.write_back(conn)
        results = [
            IntakeResult(IntakeOutcome.DUPLICATE)
            if d is None
            else IntakeResult(IntakeOutcome(d.row["outcome"]), tuple(c.id for c in d.cases), d.work)
            for d in deliveries
        ]
        return results, outgoing

    def _start(self, conn: Connection, deliveries: Sequence[_Delivery]) -> list[Outgoing]:
        """Ask for the work of every triage, in one statement; the tasks to send for the work
        created now (a triage asked for again, or recorded before, is started once)."""
        created = self.dispatcher.request_many(
            conn, [triage.request() for d in deliveries for triage in d.triages]
        )
        outgoing: list[Outgoing] = []
        for delivery in deliveries:
            works: list[int] = []
            for triage in delivery.triages:
                sent = created.pop(triage.work_key, None)
                if sent is None:
                    continue
                works.append(sent.order.work_id)
                outgoing.append(sent)
                case_queued(triage.case)
            if works:
                delivery.row["outcome"] = IntakeOutcome.ACCEPTED.value
            delivery.work = tuple(works)
        return outgoing

    # -- one sighting ---------------------------------------------------------------------------
    def _sight(
        self,
        batch: CaseBatch,
        source: str,
        delivery_id: str,
        sighting: Sighting,
        case: CaseRow,
        seen: dict[int, dict[str, Any]],
    ) -> _Triage | None:
        new = batch.is_new(case) and case.occurrences == 0  # created by the batch, sighted first now
        if case.id in seen:
            # One delivery, one occurrence per case: a Sentry event whose exception is the tagged
            # bundle's, or a check run naming two bundles of one failure, sees the case twice.
            _merge(seen[case.id], sighting)
        else:
            case.occurrences += 1
            case.last_seen = batch.now
            seen[case.id] = {
                "source": source,
                "delivery_id": delivery_id,
                "bundle_id": sighting.bundle_id,
                "store_url": sighting.store_url,
                "test_id": sighting.test_id,
                "provenance": sighting.provenance,
                "run_url": run_url_of(sighting.provenance),
                "branch": branch_of(sighting.provenance),
                "received_at": batch.now,
            }
            batch.add_occurrence(case, seen[case.id])
        if not sighting.bundle_id or sighting.trigger == "never":
            return None
        key = self._triage_key(batch, case, new, sighting, delivery_id)
        if key is None:
            return None
        options: dict[str, Any] = {"minimize": self.minimize}
        if sighting.reply_to:
            options["reply_to"] = sighting.reply_to
        # Later sightings in this batch see the triage this one starts, as they would have seen it
        # committed had they come one at a time: a case triaged itself follows no storm leader (a
        # storm follower that a request triages leads the storms after it).
        case_queued(case, triaged_at=batch.now)
        return _Triage(case, key, sighting, options)

    def _triage_key(
        self, batch: CaseBatch, case: CaseRow, new: bool, sighting: Sighting, delivery_id: str
    ) -> str | None:
        """The key (less ``triage:<case id>:``) of the triage this sighting starts, or None."""
        if sighting.trigger == "always":
            # Keys are at most 200 characters; a delivery id may be 128.
            request = hashlib.sha256(delivery_id.encode("utf-8")).hexdigest()[:32]
            return f"{sighting.bundle_id}:request:{request}"
        if new or case.status == CaseStatus.OPEN.value:
            leader = self._storm_leader(batch, case)
            if leader is not None:
                case_follows(case, leader)
                return None
            return f"g{case.generation}"
        status, last = case.status, case.last_triage_at
        leader = batch.by_id.get(case.storm_of) if case.storm_of is not None else None
        if leader is not None and last is None:
            # A storm follower was never triaged itself: its leader's triage stands for it.
            status, last = leader.status, leader.last_triage_at
        stale = last is None or batch.now - last > self.retriage_after
        if status in (CaseStatus.FIXED.value, CaseStatus.FAILED.value) or stale:
            case.generation += 1
            return f"g{case.generation}"
        return None

    def _storm_leader(self, batch: CaseBatch, case: CaseRow) -> CaseRow | None:
        if not case.cause_key or self.storm_window <= timedelta(0):
            return None
        return batch.storm_leader(case, self.storm_window)


def _first_sightings(items: Sequence[Item]) -> dict[str, NewCase]:
    """By case identity, in the order first sighted: what a case made by that sighting is made with."""
    first: dict[str, NewCase] = {}
    for _, _, _, sightings in items:
        for s in sightings:
            if s.case_identity not in first:
                first[s.case_identity] = NewCase(
                    s.fingerprint,
                    s.cause_key,
                    s.kind,
                    s.title[:500],
                    s.test_id,
                    s.job,
                    s.repository,
                    identity=s.case_identity,
                )
    return first


def build_intake(settings: Settings, database: Database, sender: TaskSender) -> Intake:
    """The intake the settings describe, recording in `database` and sending through `sender`
    (the receiver's, and its intake process's)."""
    dispatcher = Dispatcher(
        database,
        sender,
        sweep_after_s=settings.sweep_after_s,
        replay_grace_s=settings.replay_timeout_s + settings.sweep_after_s,
    )
    return Intake(
        database,
        dispatcher,
        retriage_after_s=settings.retriage_after_h * 3600,
        storm_window_s=settings.storm_window_s,
    )


def _delivery_rows(items: Sequence[Item], now: datetime) -> dict[tuple[str, str], dict[str, Any]]:
    """The rows of the deliveries in `items`, by source and id (a delivery repeated within `items`
    once, the first). Their outcome until work is asked for: recorded or ignored (`_ACCEPTED` marks
    those that started work)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for source, delivery_id, kind, sightings in items:
        outcome = IntakeOutcome.RECORDED if sightings else IntakeOutcome.IGNORED
        rows.setdefault(
            (source, delivery_id),
            {
                "source": source,
                "delivery_id": delivery_id,
                "kind": kind,
                "outcome": outcome.value,
                "received_at": now,
            },
        )
    return rows
