"""The dashboard's actions: re-triage a case, quarantine a test by hand, lift a quarantine, remove
one (un-quarantine).

Each is a POST of a form (`Access.check_form`: a person signed in, the session's form token, from
this site) answered with a 303 back to the page it came from, which shows what was done; each is
logged with who did it, and asking twice does what asking once did, saying so.

- **Re-triage** sends a case back to triage on its latest bundle, as CI history does
  (`flaketriage.work.case_requests.retriage`): a new generation, queued, a triage recorded and sent.
  A case already waiting for or in a triage is left alone.
- **Quarantine by hand** writes an entry naming the test, the runs it covers (a variant pattern),
  its owner and expiry, with the reason "by hand by <person>" (`flaketriage.quarantine.hand_entry`);
  ``GET /v1/quarantine`` serves it and CI forgives the test's failures until it expires.
- **Lift**: the test is fixed. The entry ends and its case is marked fixed, keeping its verdict, as
  an isolation rerun that no longer reproduces it would (its issue, if any, is left open).
- **Un-quarantine**: the entry was a mistake (or a hand quarantine no longer wanted). It ends, and
  its case keeps its status and verdict.

Lifting and removing ask for the check runs of the test's commits to be published again
(`refresh_checks`), since what they say about it changed.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from flaketriage.errors import BrokerError, ConfigError, RecordsError, RequestRefusedError
from flaketriage.orchestrator.dashboard.access import PREFIX, Viewer, local_path, log
from flaketriage.quarantine import FINGERPRINT_PATTERN, QuarantineEntry, hand_entry, hand_fingerprint
from flaketriage.records import Case, CaseStatus, QuarantineRow, Work, WorkStatus
from flaketriage.records.models import utc_now
from flaketriage.records.transitions import case_lifted
from flaketriage.variant import parse_variant, variant_key
from flaketriage.work.case_requests import latest_bundle, refresh_checks, retriage
from flaketriage.work.dispatch import Outgoing
from flaketriage.work.messages import Step

if TYPE_CHECKING:
    from flaketriage.orchestrator.dashboard.views import Views
    from flaketriage.orchestrator.service import Service

MAX_CASE_ID = 2**31 - 1
MAX_TEST_ID = 1000
"""The longest test id a hand quarantine takes (a pytest node id with its parameters)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?")
_PENDING = (WorkStatus.QUEUED.value, WorkStatus.RUNNING.value, WorkStatus.WAITING.value)


class ActionRefused(RequestRefusedError):
    """A dashboard action's form holds a value it cannot take, or names nothing there is: nothing
    was changed, and the page it came from (or `back`) says why."""

    def __init__(self, detail: str, *, back: str | None = None) -> None:
        super().__init__(detail)
        self.back = back


def _no_case(case_id: int | None) -> ActionRefused:
    return ActionRefused(f"there is no case {case_id}", back=f"{PREFIX}/cases")


@dataclass(frozen=True)
class Outcome:
    """What an action did, in words for the page it returns to (`back`)."""

    message: str
    back: str
    changed: bool = True


Action = Callable[["Service", Viewer, dict[str, str]], Outcome]


# -- reading the form -----------------------------------------------------------------------------
def case_id_of(form: dict[str, str], *, required: bool = True) -> int | None:
    text = form.get("case_id", "").strip()
    if not text and not required:
        return None
    if text.isascii() and text.isdigit() and len(text) <= 10 and 1 <= int(text) <= MAX_CASE_ID:
        return int(text)
    raise ActionRefused(f"{_shown(text) or 'no case'} is not a case number", back=f"{PREFIX}/cases")


def fingerprint_of(form: dict[str, str]) -> str | None:
    text = form.get("fingerprint", "").strip()
    if not text:
        return None
    if not re.fullmatch(FINGERPRINT_PATTERN, text):
        raise ActionRefused(f"{_shown(text)} is not a quarantine entry's key (a fingerprint)")
    return text


def text_of(form: dict[str, str], name: str, what: str, *, longest: int) -> str:
    """A field of text: trimmed, 1 to `longest` characters, no control characters."""
    text = " ".join(form.get(name, "").split())
    if not text:
        raise ActionRefused(f"give {what}")
    if len(text) > longest or _CONTROL.search(text):
        raise ActionRefused(f"{what} must be at most {longest} characters, without control characters")
    return text


def expiry_of(text: str, *, now: datetime, most_days: int) -> datetime:
    """When a hand quarantine ends: a date (``2025-07-01``: the end of that day, UTC) or a UTC time
    (``2025-07-01T18:00``, what a ``datetime-local`` field sends), after `now` and at most
    `most_days` ahead."""
    text = text.strip()
    try:
        if _DATE.fullmatch(text):
            expires = datetime.fromisoformat(text).replace(tzinfo=UTC) + timedelta(days=1)
        elif _TIME.fullmatch(text):
            expires = datetime.fromisoformat(text).replace(tzinfo=UTC)
        else:
            raise ValueError(text)
    except ValueError:
        raise ActionRefused(
            f"{_shown(text) or 'no expiry'} is not an expiry: give a date (2025-07-01) or a UTC time "
            "(2025-07-01T18:00)"
        ) from None
    if expires <= now:
        raise ActionRefused(f"the expiry {expires:%Y-%m-%d %H:%M} UTC has passed already")
    if expires > now + timedelta(days=most_days):
        raise ActionRefused(
            f"the expiry may be at most {most_days} days ahead (FLAKETRIAGE_DASHBOARD_QUARANTINE_MAX_DAYS)"
        )
    return expires


def _shown(text: str) -> str:
    """A value the person sent, as a message quotes it: short, control characters escaped."""
    cut = text if len(text) <= 60 else text[:60] + "…"
    return repr(cut) if cut else ""


# -- the actions ----------------------------------------------------------------------------------
def retriage_case(service: Service, viewer: Viewer, form: dict[str, str]) -> Outcome:
    case_id = case_id_of(form)
    assert case_id is not None
    back = f"{PREFIX}/cases/{case_id}"
    database = service.database
    with database.session() as session:
        case = session.get(Case, case_id, with_for_update=not database.is_sqlite)
        if case is None:
            raise _no_case(case_id)
        if _triage_pending(session, case):
            return Outcome(
                f"Case {case_id} is already waiting for its triage: nothing more was asked.", back, False
            )
        bundle = latest_bundle(session, case_id)
        if bundle is None:
            raise ActionRefused(f"case {case_id} has no bundle to replay (no occurrence of it captured one)")
        sent = retriage(
            session,
            service.dispatcher,
            case,
            bundle,
            why=f"dashboard-{secrets.token_hex(8)}",
            options={"minimize": service.intake.minimize, "reason": "dashboard", "by": viewer.label},
        )
        generation = case.generation
    note = _send(service, [sent])
    return Outcome(f"Case {case_id} is queued for triage again (generation {generation}).{note}", back)


def _triage_pending(session: Session, case: Case) -> bool:
    if case.status in (CaseStatus.QUEUED.value, CaseStatus.TRIAGING.value):
        return True
    pending = select(Work.id).where(
        Work.case_id == case.id, Work.step == Step.TRIAGE.value, Work.status.in_(_PENDING)
    )
    return session.scalars(pending.limit(1)).first() is not None


def quarantine_by_hand(service: Service, viewer: Viewer, form: dict[str, str]) -> Outcome:
    settings = service.settings
    case_id = case_id_of(form, required=False)
    now = utc_now()
    owner = text_of(form, "owner", "an owner (who answers for the quarantine)", longest=100)
    expires = expiry_of(form.get("expires", ""), now=now, most_days=settings.dashboard_quarantine_max_days)
    try:
        variant = parse_variant(form.get("variant", ""), where="the variant")
    except ConfigError as exc:
        raise ActionRefused(str(exc)) from None
    database = service.database
    with database.session() as session:
        case = session.get(Case, case_id) if case_id is not None else None
        if case_id is not None and case is None:
            raise _no_case(case_id)
        if case is not None and not case.test_id:
            raise ActionRefused(f"case {case_id} names no test: CI quarantines tests, by their node id")
        test_id = (
            str(case.test_id)
            if case is not None
            else text_of(form, "test_id", "a test id", longest=MAX_TEST_ID)
        )
        fingerprint = hand_fingerprint(test_id, variant)
        query = select(QuarantineRow).where(QuarantineRow.fingerprint == fingerprint)
        row = session.scalars(query if database.is_sqlite else query.with_for_update()).first()
        old = QuarantineEntry.model_validate(row.entry) if row is not None else None
        entry = hand_entry(
            old, test_id=test_id, variant=variant, owner=owner, expires_at=expires, by=viewer.label, now=now
        )
        data = entry.model_dump(mode="json")
        if row is None:
            row = QuarantineRow(
                fingerprint=fingerprint, case_id=case_id, entry=data, clean_reruns=0, updated_at=now
            )
            session.add(row)
        else:
            row.entry, row.updated_at = data, now
            row.case_id = case_id if case_id is not None else row.case_id
    where = f" on {variant_key(variant)}" if variant else ""
    what = "Quarantined" if old is None else "Quarantine updated:"
    back = (
        f"{PREFIX}/cases/{case_id}"
        if case_id is not None
        else local_path(form.get("next"), f"{PREFIX}/quarantine")
    )
    return Outcome(f"{what} {test_id}{where}, owner {owner}, until {expires:%Y-%m-%d %H:%M} UTC.", back)


def lift(service: Service, viewer: Viewer, form: dict[str, str]) -> Outcome:
    return _end(service, viewer, form, fixed=True)


def unquarantine(service: Service, viewer: Viewer, form: dict[str, str]) -> Outcome:
    return _end(service, viewer, form, fixed=False)


def _end(service: Service, viewer: Viewer, form: dict[str, str], *, fixed: bool) -> Outcome:
    """End the entry `form` names (by ``fingerprint``), or every entry of its case (``case_id``):
    lifted (`fixed`: their cases are fixed) or removed (their cases stand as they are)."""
    fingerprint = fingerprint_of(form)
    case_id = case_id_of(form, required=fingerprint is None)
    default = (
        f"{PREFIX}/cases/{case_id}" if case_id is not None and fingerprint is None else f"{PREFIX}/quarantine"
    )
    back = local_path(form.get("next"), default)
    outgoing: list[Outgoing | None] = []
    database = service.database
    with database.session() as session:
        rows = _entries(session, fingerprint, case_id, lock=not database.is_sqlite)
        if not rows:
            named = f"case {case_id}" if fingerprint is None else f"entry {fingerprint[:12]}"
            done = "lifted" if fixed else "removed"
            return Outcome(f"Nothing to do: {named} is not quarantined (already {done}?).", back, False)
        tests = sorted({_test_of(row) for row in rows})
        cases = {row.case_id for row in rows if row.case_id is not None}
        if fingerprint is None and case_id is not None:
            cases.add(case_id)  # its own fingerprint's entry may have been written without it
        for row in rows:
            session.delete(row)
        why = f"{'lift' if fixed else 'unquarantine'}-{secrets.token_hex(6)}"
        for case in session.scalars(select(Case).where(Case.id.in_(sorted(cases)))):
            if fixed:
                case_lifted(case)
            outgoing += refresh_checks(session, service.dispatcher, case, why=why)
    note = _send(service, outgoing)
    if fixed:
        fixed_cases = f"; case {', '.join(map(str, sorted(cases)))} marked fixed" if cases else ""
        return Outcome(f"Lifted the quarantine of {', '.join(tests)}{fixed_cases}.{note}", back)
    kept = f"; case {', '.join(map(str, sorted(cases)))} keeps its verdict" if cases else ""
    return Outcome(f"Removed the quarantine of {', '.join(tests)}{kept}.{note}", back)


def _entries(
    session: Session, fingerprint: str | None, case_id: int | None, *, lock: bool
) -> list[QuarantineRow]:
    """The entries to end: the one of `fingerprint`, else those of case `case_id`; held (`lock`)
    so that two people ending one entry end it once."""
    if fingerprint is not None:
        row = session.get(QuarantineRow, fingerprint, with_for_update=lock)
        return [row] if row is not None else []
    case = session.get(Case, case_id)
    if case is None:
        raise _no_case(case_id)
    # The case page's rule: the entry of its fingerprint, and those written for it.
    query = select(QuarantineRow).where(
        or_(QuarantineRow.fingerprint == case.fingerprint, QuarantineRow.case_id == case.id)
    )
    query = query.order_by(QuarantineRow.fingerprint).limit(100)
    return list(session.scalars(query.with_for_update() if lock else query))


def _test_of(row: QuarantineRow) -> str:
    entry: dict[str, Any] = row.entry if isinstance(row.entry, dict) else {}
    return str(entry.get("test_id") or row.fingerprint[:12])


def _send(service: Service, outgoing: list[Outgoing | None]) -> str:
    """Hand the committed work to the broker; a note when it is down (the sweep sends it later)."""
    try:
        service.dispatcher.send(outgoing)
    except BrokerError as exc:
        log.warning("dashboard: recorded, but the broker is down: %s", exc)
        return " The broker is down: the work is recorded and will be sent when it is back."
    return ""


# -- the routes -----------------------------------------------------------------------------------
ACTIONS: dict[str, tuple[Action, str]] = {
    "retriage": (retriage_case, "re-triage"),
    "quarantine": (quarantine_by_hand, "quarantine by hand"),
    "lift": (lift, "lift"),
    "unquarantine": (unquarantine, "un-quarantine"),
}
"""The actions by the last part of their path (``POST /dashboard/actions/<name>``), and their name
in the log."""


def router(views: Views) -> APIRouter:
    """``POST /dashboard/actions/{retriage,quarantine,lift,unquarantine}``."""
    routes = APIRouter()
    access = views.access

    async def run(request: Request, name: str) -> Response:
        action, called = ACTIONS[name]
        form = await access.form(request)
        viewer = access.check_form(request, form, back=_back(form))
        try:
            outcome = await anyio.to_thread.run_sync(partial(action, views.service, viewer, form))
        except ActionRefused as exc:
            back = exc.back or _back(form)
            log.info("dashboard: %s: %s refused: %s", viewer.label, called, exc)
            return access.redirect(request, back, f"Nothing was done: {exc}.")
        except RecordsError as exc:
            log.warning("dashboard: %s: %s failed, the database refused: %s", viewer.label, called, exc)
            return access.redirect(
                request,
                _back(form),
                "Nothing was done: the database is unavailable or refused the change; try again.",
            )
        log.info("dashboard: %s: %s: %s", viewer.label, called, outcome.message)
        return access.redirect(request, outcome.back, outcome.message)

    def endpoint(name: str) -> Callable[[Request], Any]:
        async def act(request: Request) -> Response:
            return await run(request, name)

        return act

    for name in ACTIONS:
        routes.add_api_route(f"/actions/{name}", endpoint(name), methods=["POST"], name=f"dashboard-{name}")
    return routes


def _back(form: dict[str, str]) -> str:
    """Where a refused action returns: the page it names, its case's, else the quarantine page."""
    try:
        case = case_id_of(form, required=False)
    except ActionRefused as exc:
        return exc.back or f"{PREFIX}/cases"
    default = f"{PREFIX}/cases/{case}" if case is not None else f"{PREFIX}/quarantine"
    return local_path(form.get("next"), default)
