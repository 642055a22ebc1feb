"""The cases one batch of deliveries reads and writes, in a few statements whatever the batch holds.

`CaseBatch.load` reads, in one round trip, every case the batch sights (locked on PostgreSQL) and
per cause the first case outside the batch that leads a storm. The storm leaders that sighted cases
follow, when there are any, are read after. The rules then change the rows in memory. A case the
batch creates gets a provisional id (negative, in the order the batch first sights the new cases),
and `create_new` inserts it once, as the rules left it, its real id the one the INSERT gives (in the
same order). Ids are taken only for the cases created: a batch whose deliveries turn out to be
repeats takes none, as the same deliveries one at a time take none. `write_back` adds the
occurrences and updates what changed.

The rules see what a query would see had every change so far been written: the batch's own rows as
they are in memory, the others as read (no other writer changes them meanwhile: the batch's are
locked, and a storm candidate outside it is only read).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, func, select

from flaketriage.records import Case, CaseStatus, Occurrence
from flaketriage.records.bulk import insert_rows, one_of, update_rows
from flaketriage.records.database import Query, fetch_together

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
    Case.identity,
)
"""The columns of a case the rules read; all but the first three may change (the identity only from
None or the fingerprint, to the one a sighting brings: `CaseBatch.load`)."""


@dataclass(eq=False)
class CaseRow:
    """A case as one batch sees it. Its id is provisional (negative) until `CaseBatch.create_new`."""

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
    identity: str | None
    stored: dict[str, Any] | None = field(default=None, repr=False)
    """`changes()` as the database holds them; None while the case is not written yet."""

    @classmethod
    def of(cls, row: Sequence[Any]) -> CaseRow:
        """The case in `row`, a row of the `_STATE` columns (as SQLAlchemy or the driver reads
        it), as stored."""
        case = cls(*row)
        # The driver's timestamps are in the session's zone; SQLAlchemy's are UTC already.
        if case.last_triage_at is not None:
            case.last_triage_at = case.last_triage_at.astimezone(UTC)
        case.last_seen = case.last_seen.astimezone(UTC)
        case.stored = case.changes()
        return case

    def changes(self) -> dict[str, Any]:
        """The columns that may change, with the id (as `update_rows` takes them)."""
        return {
            "id": self.id,
            "status": self.status,
            "error": self.error,
            "generation": self.generation,
            "storm_of": self.storm_of,
            "last_triage_at": self.last_triage_at,
            "occurrences": self.occurrences,
            "last_seen": self.last_seen,
            "identity": self.identity,
        }

    def adopts(self, identity: str) -> bool:
        """Whether this case, found by its fingerprint, takes `identity` as its own: only while it
        has none but its fingerprint (recorded before identities, or by a sighting without one)."""
        return self.identity in (None, self.fingerprint) and identity != self.fingerprint


# Built once per dialect: building and compiling a statement anew costs more than running it.
_IN_BATCH = {
    name: identity_in | fingerprint_in
    for (name, identity_in), fingerprint_in in zip(
        one_of(Case.identity, "identities").items(),
        one_of(Case.fingerprint, "fingerprints").values(),
        strict=True,
    )
}
"""A case the batch sights: by its identity, or (recorded before it had one) by its fingerprint."""
_LOCK_CASES = {
    name: select(*_STATE)
    .where(in_batch)
    .order_by(Case.id)
    .with_for_update()  # SQLite has no row locks: BEGIN IMMEDIATE keeps other writers out already
    for name, in_batch in _IN_BATCH.items()
}
_READ_CASES = {name: select(*_STATE).where(id_in) for name, id_in in one_of(Case.id, "ids").items()}
_FIRST_LEADERS = {
    name: select(*_STATE).where(
        Case.id.in_(
            select(func.min(Case.id))
            .where(
                cause_in,
                ~batch_in,
                Case.storm_of.is_(None),
                Case.last_triage_at >= bindparam("since"),
            )
            .group_by(Case.cause_key)
            .scalar_subquery()
        )
    )
    for (name, cause_in), batch_in in zip(
        one_of(Case.cause_key, "causes").items(),
        # A case without an identity (written outside the intake) is keyed by its fingerprint: so a
        # NULL identity is never "not in the batch" by default.
        (
            identity_in | fingerprint_in
            for identity_in, fingerprint_in in zip(
                one_of(func.coalesce(Case.identity, Case.fingerprint), "identities").values(),
                one_of(Case.fingerprint, "fingerprints").values(),
                strict=True,
            )
        ),
        strict=True,
    )
}
"""Per cause, the first case outside the batch (found by none of its identities or fingerprints)
that leads a storm since ``since``."""


@dataclass(frozen=True)
class NewCase:
    """What a case is created with, from the first sighting of its failure."""

    fingerprint: str
    cause_key: str | None
    kind: str
    title: str
    test_id: str | None
    job: str | None
    repository: str | None
    identity: str | None = None
    """What the case is found by (`Sighting.case_identity`); None: its fingerprint."""

    @property
    def key(self) -> str:
        return self.identity or self.fingerprint


@dataclass
class CaseBatch:
    """Every case one batch sights (by fingerprint), and the others the rules may read."""

    now: datetime
    sighted: dict[str, CaseRow]
    """By case identity (`Sighting.case_identity`), in the order they were first sighted."""
    by_id: dict[int, CaseRow]
    """The sighted cases and the others the rules may read (leaders), by id (provisional or not)."""
    new: dict[int, NewCase]
    """What the cases to create are created with, by provisional id, in the order of those ids."""
    outside_leaders: dict[str, CaseRow] = field(default_factory=dict)
    """Per cause, the first case outside the batch that leads a storm now (if any)."""
    by_cause: dict[str, list[CaseRow]] = field(default_factory=dict)
    """The sighted cases by cause, existing ones by id, then the new ones: the order of their ids."""
    occurrences: list[tuple[CaseRow, dict[str, Any]]] = field(default_factory=list)

    @classmethod
    def load(
        cls,
        conn: Connection,
        first: Mapping[str, NewCase],
        now: datetime,
        storm_window: timedelta,
        *,
        along: Sequence[Query] = (),
    ) -> tuple[CaseBatch, list[list[tuple[Any, ...]]]]:
        """The cases of the failures in `first` (by case identity: what each is created with, if new),
        locked; with
        the leaders they follow, and the storm candidates outside the batch within `storm_window`.
        The reads go in one round trip (`fetch_together`), after `along`, whose rows come back too."""
        if not first:
            return cls(now=now, sighted={}, by_id={}, new={}), fetch_together(conn, along)
        dialect = conn.dialect.name
        fingerprints = _keys(first, [made.fingerprint for made in first.values()])
        causes = sorted({made.cause_key for made in first.values() if made.cause_key is not None})
        reads = [Query(_LOCK_CASES[dialect], fingerprints)]
        leaders = storm_window > timedelta(0) and bool(causes)
        if leaders:
            since = now - storm_window
            reads.append(Query(_FIRST_LEADERS[dialect], {"causes": causes, "since": since} | fingerprints))
        answers = fetch_together(conn, [*along, *reads])
        given, answers = answers[: len(along)], answers[len(along) :]
        new: dict[int, NewCase] = {}
        sighted = _match(list(map(CaseRow.of, answers[0])), first, now, new)
        batch = cls(now=now, sighted=sighted, by_id={c.id: c for c in sighted.values()}, new=new)
        followed = {c.storm_of for c in sighted.values() if c.storm_of is not None} - batch.by_id.keys()
        if followed:  # a storm's follower sighted again: its leader, read now
            for row in fetch_together(conn, [Query(_READ_CASES[dialect], {"ids": sorted(followed)})])[0]:
                batch.by_id[row[0]] = CaseRow.of(row)
        batch._add_leaders(conn, storm_window, answers[1] if leaders else [], set(causes))
        return batch, given

    def _add_leaders(
        self, conn: Connection, storm_window: timedelta, rows: list[tuple[Any, ...]], asked: set[str]
    ) -> None:
        if storm_window <= timedelta(0):
            return
        for case in sorted(self.sighted.values(), key=_id_order):
            if case.cause_key is not None:
                self.by_cause.setdefault(case.cause_key, []).append(case)
        missing = sorted(self.by_cause.keys() - asked)
        if missing:  # a case stored with another cause than its sighting's: asked for now
            since = self.now - storm_window
            keys = _keys(self.sighted, [c.fingerprint for c in self.sighted.values()])
            query = Query(_FIRST_LEADERS[conn.dialect.name], {"causes": missing, "since": since} | keys)
            rows = rows + fetch_together(conn, [query])[0]
        for row in rows:
            leader = self.by_id.setdefault(row[0], CaseRow.of(row))
            self.outside_leaders[str(leader.cause_key)] = leader

    def is_new(self, case: CaseRow) -> bool:
        """Whether `case` is created by this batch (and not written yet)."""
        return case.stored is None

    def storm_leader(self, case: CaseRow, window: timedelta) -> CaseRow | None:
        """The first case (by id) of `case`'s cause triaged within `window` that follows no other."""
        assert case.cause_key is not None
        since = self.now - window
        leader = self.outside_leaders.get(case.cause_key)
        for other in self.by_cause.get(case.cause_key, ()):
            if leader is not None and _id_order(other) > _id_order(leader):
                break
            if (
                other is not case
                and other.storm_of is None
                and other.last_triage_at is not None
                and other.last_triage_at >= since
            ):
                return other
        return leader

    def add_occurrence(self, case: CaseRow, row: dict[str, Any]) -> None:
        """An occurrence of `case` to insert (its ``case_id`` is filled in then)."""
        self.occurrences.append((case, row))

    def create_new(self, conn: Connection) -> None:
        """Insert the cases this batch creates, as the rules left them, in one statement; every
        provisional id becomes the real one. A new case following a leader the batch also creates
        is inserted without it (no id to name yet) and points to it in `write_back`."""
        if not self.new:
            return
        cases = [self.by_id[provisional] for provisional in self.new]
        rows = []
        for case, made in zip(cases, self.new.values(), strict=True):
            case.stored = case.changes() | {"storm_of": case.storm_of if (case.storm_of or 0) > 0 else None}
            rows.append(
                {
                    "fingerprint": made.fingerprint,
                    "identity": made.key,
                    "cause_key": made.cause_key,
                    "kind": made.kind,
                    "title": made.title,
                    "test_id": made.test_id,
                    "job": made.job,
                    "repository": made.repository,
                    "first_seen": self.now,
                }
                | {k: v for k, v in case.stored.items() if k != "id"}
            )
        # The INSERT takes the ids: taken before it (in the round trip of `load`), those of a
        # batch whose deliveries were repeats would be taken for nothing, and the cases of the same
        # deliveries recorded one at a time or together would be numbered differently.
        created = insert_rows(conn, Case, rows, returning=("id", "fingerprint"))
        ids = {fingerprint: id_ for id_, fingerprint in created}
        real = {provisional: ids[made.fingerprint] for provisional, made in self.new.items()}
        for case in cases:
            case.id = real[case.id]
            assert case.stored is not None
            case.stored["id"] = case.id
        for case in self.by_id.values():
            if case.storm_of is not None and case.storm_of < 0:
                case.storm_of = real[case.storm_of]
        self.by_id = {case.id: case for case in self.by_id.values()}
        self.new = {}

    def write_back(self, conn: Connection) -> None:
        """Insert the occurrences and update the cases that changed since read or created."""
        insert_rows(conn, Occurrence, [row | {"case_id": case.id} for case, row in self.occurrences])
        update_rows(conn, Case, [c.changes() for c in self.sighted.values() if c.changes() != c.stored])


def _keys(identities: Iterable[str], fingerprints: Iterable[str]) -> dict[str, list[str]]:
    """The parameters that name the batch's cases (`_IN_BATCH`): its identities and fingerprints."""
    return {"identities": sorted(identities), "fingerprints": sorted(set(fingerprints))}


def _match(
    found: Sequence[CaseRow], first: Mapping[str, NewCase], now: datetime, new: dict[int, NewCase]
) -> dict[str, CaseRow]:
    """The case of each failure in `first` (by case identity, in order), from the cases `found`:
    the one with its identity, else the one with its fingerprint (which adopts the identity while
    it has none of its own), else one made now (provisional, with what it is made with in `new`).
    Two failures of one fingerprint with two identities share the fingerprint's case: a case has
    one fingerprint, the first bundle's its replays match."""
    by_identity = {case.identity: case for case in found if case.identity is not None}
    by_fingerprint = {case.fingerprint: case for case in found}
    sighted: dict[str, CaseRow] = {}
    for identity, made in first.items():
        case = by_identity.get(identity) or by_fingerprint.get(made.fingerprint)
        if case is None:
            case = _provisional(-1 - len(new), made, now)
            new[case.id] = made
            by_fingerprint[made.fingerprint] = case
        elif case.identity != identity and case.adopts(identity):
            by_identity.pop(case.identity or "", None)
            case.identity = identity
            if case.id in new:
                new[case.id] = replace(new[case.id], identity=identity)
        by_identity.setdefault(identity, case)
        sighted[identity] = case
    return sighted


def _provisional(provisional_id: int, made: NewCase, now: datetime) -> CaseRow:
    return CaseRow(
        id=provisional_id,
        fingerprint=made.fingerprint,
        cause_key=made.cause_key,
        status=CaseStatus.OPEN.value,
        error=None,
        generation=0,
        storm_of=None,
        last_triage_at=None,
        occurrences=0,
        last_seen=now,
        identity=made.key,
    )


def _id_order(case: CaseRow) -> tuple[bool, int]:
    """Where `case` sorts by id: existing cases by id, then the new ones in the order of their
    provisional ids (real ones will be larger than any id read, and follow that order)."""
    return (case.id < 0, abs(case.id))
