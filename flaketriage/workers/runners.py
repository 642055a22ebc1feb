"""The service's runner records: the machines replays ran on, and hardware attribution of a verdict.

Every replay a worker records also records its runner (`record_replay`: first and last seen, how
many replays). When a triage decides, `attribute_triage` compares reproductions across the runners
its replays ran on (`flaketriage.workers.attribution`); an environment-specific verdict counts
against the runners it reproduced on (and the original runner, when it reproduced on machines like
it), and a runner counted `suspect_after` times is flagged as suspect, so it can be drained.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from flaketriage.bundle.manifest import Manifest
from flaketriage.records import RunnerRow
from flaketriage.records.models import utc_now
from flaketriage.workers.attribution import Attribution, RunnerIdentity, attribute, tally


def record_replay(session: Session, identity: RunnerIdentity, replays: int = 1) -> None:
    """Note that `identity` ran `replays` replays now (one statement, safe against a worker on the
    same machine doing the same at the same time)."""
    _upsert(session, identity, replays=replays, environment_specific=0, case_id=None, suspect_after=None)


def attribute_triage(
    session: Session,
    manifest: Manifest,
    replays: Iterable[tuple[str | None, str | None]],
    *,
    alpha: float,
) -> Attribution | None:
    """The attribution of a triage's ``(runner, outcome)`` replays, or None when they all ran on
    one runner (there is nothing to compare)."""
    pairs = list(replays)
    runners = {runner for runner, _ in pairs if runner is not None}
    if len(runners) < 2:
        return None
    original = RunnerIdentity.of_hardware(manifest.hardware, manifest.provenance.host)
    rows = session.scalars(select(RunnerRow).where(RunnerRow.id.in_(runners))).all()
    identities = {row.id: identity_of(row) for row in rows}
    return attribute(original, tally(pairs, original, identities), alpha)


def record_attribution(
    session: Session,
    attribution: Attribution,
    manifest: Manifest,
    *,
    case_id: int | None,
    suspect_after: int,
) -> list[str]:
    """Count an environment-specific verdict against its suspects; returns the runner ids counted."""
    if not attribution.specific:
        return []
    counted = list(attribution.suspects)
    original = RunnerIdentity.of_hardware(manifest.hardware, manifest.provenance.host)
    if attribution.side == "original" and original.id not in counted:
        counted.append(original.id)  # the machine it was captured on, even when no worker runs there
    known = {row.id: row for row in session.scalars(select(RunnerRow).where(RunnerRow.id.in_(counted))).all()}
    for runner in counted:
        row = known.get(runner)
        identity = identity_of(row) if row is not None else original if runner == original.id else None
        if identity is None:
            continue  # a runner that never registered: nothing to flag
        _upsert(
            session,
            identity,
            replays=0,
            environment_specific=1,
            case_id=case_id,
            suspect_after=suspect_after,
        )
    return counted


def identity_of(row: RunnerRow) -> RunnerIdentity:
    return RunnerIdentity.from_json({"host": row.host, "gpus": row.gpus or [], "driver": row.driver})


def suspects(session: Session) -> Sequence[RunnerRow]:
    return session.scalars(select(RunnerRow).where(RunnerRow.suspect.is_(True)).order_by(RunnerRow.id)).all()


def _upsert(
    session: Session,
    identity: RunnerIdentity,
    *,
    replays: int,
    environment_specific: int,
    case_id: int | None,
    suspect_after: int | None,
) -> None:
    now = utc_now()
    table = RunnerRow.__table__
    values: dict[str, Any] = {
        "id": identity.id,
        "host": identity.host[:200],
        "gpus": identity.to_json()["gpus"],
        "driver": identity.driver,
        "first_seen": now,
        "last_seen": now,
        "replays": replays,
        "environment_specific": environment_specific,
        "suspect": suspect_after is not None and environment_specific >= suspect_after,
        "last_case_id": case_id,
    }
    changes: dict[str, Any] = {"replays": table.c.replays + replays}
    if replays:
        changes["last_seen"] = now
    if environment_specific:
        total = table.c.environment_specific + environment_specific
        changes["environment_specific"] = total
        changes["last_case_id"] = case_id
        if suspect_after is not None:
            changes["suspect"] = or_(table.c.suspect, total >= suspect_after)
    dialect = session.get_bind().dialect.name
    insert = sqlite_insert if dialect == "sqlite" else postgresql_insert
    statement = insert(RunnerRow).values(**values)
    session.execute(statement.on_conflict_do_update(index_elements=[table.c.id], set_=changes))
