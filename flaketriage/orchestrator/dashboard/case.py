"""One case's page: what it is, its verdict with the failure rate's interval, the minimal
reproduction, the commands that reproduce it, where its bundle, report and CI runs are, and a
timeline of its latest occurrences and replays.

Everything it reads is bounded whatever the case gathered: its latest `LATEST_OCCURRENCES`
occurrences (``occurrences (case_id, id)``) and `LATEST_REPLAYS` replays, its latest work, with a
count of the rest; the other cases of its latest CI runs through ``occurrences (run_url, case_id)``.
Its verdict comes from the evidence its last triage recorded (`TriageResult.to_json()`), read
field by field: a result recorded by an older release, or cut short, shows what it has.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from flaketriage.orchestrator.api_models import CaseImpact
from flaketriage.orchestrator.dashboard.cases import tests_of, verdict_label
from flaketriage.orchestrator.dashboard.charts import rate_interval
from flaketriage.orchestrator.history import case_impact
from flaketriage.records import Case, Occurrence, QuarantineRow, ReplayRow, Work
from flaketriage.records.models import UploadRow
from flaketriage.records.text import storable_json, storable_text

if TYPE_CHECKING:
    from flaketriage.orchestrator.dashboard.views import Views

LATEST_OCCURRENCES = 20
LATEST_REPLAYS = 30
LATEST_WORK = 10
MAX_LINKED = 20
MAX_CASE_ID = 2**31 - 1
"""The largest id a case can have (an INTEGER key): a larger one names no case."""

_LINK = re.compile(r"https?://[^\s\x00-\x1f\x7f<>\"'`\\]+", re.ASCII)


def web_link(url: object) -> str | None:
    """`url` when it is an http(s) URL a page may link to; None for anything else (a
    ``javascript:`` URL, a path, text with spaces or control characters)."""
    if isinstance(url, str) and len(url) <= 2000 and _LINK.fullmatch(url):
        return url
    return None


def parse_case_id(text: str) -> int | None:
    """The case id a path names, or None when it names none (not a whole number, or out of range)."""
    if text.isascii() and text.isdigit() and len(text) <= 10:
        value = int(text)
        if 1 <= value <= MAX_CASE_ID:
            return value
    return None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True)
class Rate:
    """The failure rate's estimate and its interval."""

    low: float
    estimate: float
    high: float

    def chart(self) -> Markup:
        return rate_interval(
            self.low,
            self.estimate,
            self.high,
            title="Failure rate with its interval",
            description=(
                f"Estimated failure rate {self.estimate:.1%}, interval from {self.low:.1%} "
                f"to {self.high:.1%}, on an axis from 0% to 100%."
            ),
            ident="rate-chart",
        )


@dataclass(frozen=True)
class Minimal:
    """What minimization recorded: the minimal bundle, and what it kept of each input."""

    bundle: str | None
    data: list[tuple[str, int | None, int | None]]
    """(path, items kept, items before)."""
    args: list[tuple[str, str, str]]
    """(option, value before, value after)."""
    oracle_calls: int | None
    replays: int | None


@dataclass(frozen=True)
class Evidence:
    """A case's evidence (`TriageResult.to_json()`) as the page shows it."""

    verdict: str | None = None
    decided: bool | None = None
    replays: int | None = None
    failures: int | None = None
    passes: int | None = None
    different_failures: int | None = None
    rate: Rate | None = None
    bundle: str | None = None
    minimal: Minimal | None = None
    minimize_error: str | None = None
    report_kind: str | None = None
    report_location: str | None = None
    polluters: list[str] = field(default_factory=list)
    order_cause: str | None = None
    findings: list[tuple[str, str, int | None]] = field(default_factory=list)
    """(kind, summary, count) of the other failures and problems met."""
    hang: str | None = None
    hardware_difference: str | None = None
    cost: dict[str, float | None] = field(default_factory=dict)
    """``cpu_s``, ``gpu_s``, ``wall_s`` and ``budget_s`` of the triage, where recorded."""
    budget_spent: bool = False

    @classmethod
    def of(cls, data: Any) -> Evidence:
        """Read field by field: whatever is missing or of the wrong type is left out."""
        if not isinstance(data, Mapping):
            return cls()
        rate = _mapping(data.get("failure_rate"))
        low, est, high = (_float(rate.get(k)) for k in ("low", "estimate", "high"))
        report, cost = _mapping(data.get("report")), _mapping(data.get("cost"))
        findings = [
            (str(f.get("kind") or "finding"), str(f.get("summary") or ""), _int(f.get("count")))
            for f in _list(data.get("findings"))[:20]
            if isinstance(f, Mapping)
        ]
        return cls(
            verdict=_text(data.get("verdict")),
            decided=data.get("decided") if isinstance(data.get("decided"), bool) else None,
            replays=_int(data.get("replays")),
            failures=_int(data.get("failures")),
            passes=_int(data.get("passes")),
            different_failures=_int(data.get("different_failures")),
            rate=Rate(low, est, high) if None not in (low, est, high) else None,  # type: ignore[arg-type]
            bundle=_text(data.get("bundle")),
            minimal=_minimal(data.get("minimal"), _text(data.get("minimal_bundle"))),
            minimize_error=_text(data.get("minimize_error")),
            report_kind=_text(report.get("kind")) if report.get("kind") != "none" else None,
            report_location=_text(report.get("location")),
            polluters=[p for p in _list(data.get("polluters"))[:50] if isinstance(p, str)],
            order_cause=_text(data.get("order_cause")),
            findings=findings,
            hang=_text(data.get("hang")),
            hardware_difference=_text(data.get("hardware_difference")),
            cost={k: _float(cost.get(k)) for k in ("cpu_s", "gpu_s", "wall_s", "budget_s") if k in cost},
            budget_spent=cost.get("budget_spent") is True,
        )


def _minimal(data: Any, bundle: str | None) -> Minimal | None:
    if not isinstance(data, Mapping):
        return None
    kept, args = _mapping(data.get("data")), _mapping(data.get("args"))
    return Minimal(
        bundle=bundle,
        data=[
            (str(path), _int(v.get("kept")), _int(v.get("of")))
            for path, v in sorted(kept.items())[:50]
            if isinstance(v, Mapping)
        ],
        args=[
            (str(flag), str(v.get("from", "")), str(v.get("to", "")))
            for flag, v in sorted(args.items())[:50]
            if isinstance(v, Mapping)
        ],
        oracle_calls=_int(data.get("oracle_calls")),
        replays=_int(data.get("replays")),
    )


@dataclass(frozen=True)
class Event:
    """One line of the timeline: an occurrence or a replay."""

    at: datetime
    kind: str
    """``occurrence`` or ``replay``."""
    what: str
    outcome: str | None = None
    link: str | None = None
    link_text: str | None = None
    detail: str | None = None


@dataclass(frozen=True)
class CIRun:
    url: str
    link: str | None
    """`url` when the page may link to it."""
    branch: str | None
    commit: str | None
    seen: datetime


@dataclass
class CaseDetails:
    case: Case
    evidence: Evidence
    occurrences: list[Occurrence]
    replays: list[tuple[ReplayRow, str]]
    """The latest replays, newest first, with the step of their work."""
    replay_count: int
    work: list[Work]
    work_count: int
    impact: CaseImpact
    quarantine: QuarantineRow | None
    linked: list[tuple[int, str, str | None]]
    """Other cases of the same CI runs: (id, title, verdict)."""
    bundle: str | None
    store: str | None
    test_pk: int | None = None
    """Its test's CI history (the first of its variants), when there is one."""
    uploads: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    """The branch and commit of each of its runs CI history has an upload of, by run URL."""

    @property
    def runs(self) -> list[CIRun]:
        """The CI runs of its latest occurrences, newest first, each once."""
        seen: dict[str, CIRun] = {}
        for o in self.occurrences:
            provenance = o.provenance if isinstance(o.provenance, dict) else {}
            url = o.run_url or _text(provenance.get("run_url"))
            if url and url not in seen:
                branch, commit = self.uploads.get(url, (None, None))
                seen[url] = CIRun(url, web_link(url), o.branch or branch, commit, o.received_at)
        return list(seen.values())

    @property
    def timeline(self) -> list[Event]:
        events = [_occurrence_event(o) for o in self.occurrences]
        events += [_replay_event(r, step) for r, step in self.replays]
        return sorted(events, key=lambda e: e.at, reverse=True)

    @property
    def earlier_occurrences(self) -> int:
        return max(self.case.occurrences - len(self.occurrences), 0)

    @property
    def earlier_replays(self) -> int:
        return max(self.replay_count - len(self.replays), 0)

    @property
    def reproduce(self) -> list[str]:
        """The commands that reproduce the case from its bundle (docs/commands)."""
        if not self.bundle:
            return []
        repro = (self.evidence.minimal.bundle if self.evidence.minimal else None) or self.bundle
        store = shlex.quote(self.store) if self.store else None
        lines = []
        if store:
            lines.append(
                f"export FLAKETRIAGE_STORE={store}  # or pull: flaketriage bundle pull {repro} --from {store}"
            )
        lines.append(f"flaketriage bundle export {repro} repro && (cd repro && bash run.sh)")
        lines.append(f"flaketriage triage {self.bundle}")
        lines.append(f"flaketriage cases show {self.case.id}")
        return lines


def _occurrence_event(o: Occurrence) -> Event:
    provenance = o.provenance if isinstance(o.provenance, dict) else {}
    url = o.run_url or _text(provenance.get("run_url"))
    job = _text(provenance.get("job")) or _text(provenance.get("workflow")) or _text(provenance.get("check"))
    what = (
        f"occurrence from {o.source}"
        + (f", job {job}" if job else "")
        + (f", branch {o.branch}" if o.branch else "")
    )
    return Event(
        at=o.received_at,
        kind="occurrence",
        what=what,
        link=web_link(url),
        link_text="CI run" if url else None,
        detail=f"bundle {o.bundle_id}" if o.bundle_id else None,
    )


def _replay_event(r: ReplayRow, step: str) -> Event:
    cost = []
    if r.cpu_s is not None:
        cost.append(f"{r.cpu_s:.1f} CPU s")
    if r.gpu_s:
        cost.append(f"{r.gpu_s:.1f} GPU s")
    return Event(
        at=r.finished_at or r.created_at,
        kind="replay",
        what=f"{step} replay {r.idx}" + (f" on {r.runner}" if r.runner else ""),
        outcome=r.outcome or "running",
        detail=", ".join(cost + ([r.summary] if r.summary else [])) or None,
    )


def load_case(session: Session, case_id: int) -> CaseDetails | None:
    """The case and what its page shows, in a bounded query per table."""
    case = session.get(Case, case_id)
    if case is None:
        return None
    occurrences = list(
        session.scalars(
            select(Occurrence)
            .where(Occurrence.case_id == case_id)
            .order_by(Occurrence.id.desc())
            .limit(LATEST_OCCURRENCES)
        )
    )
    replays = [
        (r, str(step))
        for r, step in session.execute(
            select(ReplayRow, Work.step)
            .join(Work, Work.id == ReplayRow.work_id)
            .where(Work.case_id == case_id)
            .order_by(ReplayRow.id.desc())
            .limit(LATEST_REPLAYS)
        )
    ]
    replay_count = int(
        session.scalar(
            select(func.count(ReplayRow.id))
            .join(Work, Work.id == ReplayRow.work_id)
            .where(Work.case_id == case_id)
        )
        or 0
    )
    work = list(
        session.scalars(
            select(Work).where(Work.case_id == case_id).order_by(Work.id.desc()).limit(LATEST_WORK)
        )
    )
    work_count = int(session.scalar(select(func.count(Work.id)).where(Work.case_id == case_id)) or 0)
    quarantine = session.scalars(
        select(QuarantineRow)
        .where(or_(QuarantineRow.fingerprint == case.fingerprint, QuarantineRow.case_id == case_id))
        .limit(1)
    ).first()
    runs = sorted({o.run_url for o in occurrences if o.run_url})
    uploads: dict[str, tuple[str | None, str | None]] = {}
    if runs:
        for url, branch, commit in session.execute(
            select(UploadRow.run_url, UploadRow.branch, UploadRow.commit)
            .where(UploadRow.run_url.in_(runs))
            .order_by(UploadRow.id)
            .limit(LATEST_OCCURRENCES * 10)
        ):
            uploads.setdefault(str(url), (branch, commit))
    linked = (
        [
            (int(i), str(t), v)
            for i, t, v in session.execute(
                select(Case.id, Case.title, Case.verdict)
                .where(
                    Case.id.in_(
                        select(Occurrence.case_id).where(
                            Occurrence.run_url.is_not(None),
                            Occurrence.run_url.in_(runs),
                            Occurrence.case_id != case_id,
                        )
                    )
                )
                .order_by(Case.id)
                .limit(MAX_LINKED)
            )
        ]
        if runs
        else []
    )
    evidence = Evidence.of(storable_json(case.evidence))
    with_bundle = next((o for o in occurrences if o.bundle_id), None)
    latest_work = next((w for w in work if w.bundle_id), None)
    bundle = (
        evidence.bundle
        or (with_bundle.bundle_id if with_bundle else None)
        or (latest_work.bundle_id if latest_work else None)
    )
    store = (with_bundle.store_url if with_bundle else None) or (
        latest_work.store_url if latest_work else None
    )
    return CaseDetails(
        case=case,
        evidence=evidence,
        occurrences=occurrences,
        replays=replays,
        replay_count=replay_count,
        work=work,
        work_count=work_count,
        impact=case_impact(session, case),
        quarantine=quarantine,
        linked=linked,
        bundle=bundle,
        store=store,
        uploads=uploads,
        test_pk=tests_of(session, [(case.repository, case.test_id)]).get(
            (case.repository, case.test_id), (None,)
        )[0],
    )


def router(views: Views) -> APIRouter:
    routes = APIRouter()

    @routes.get("/cases/{case_id}", response_class=HTMLResponse)
    def case_page(request: Request, case_id: str) -> HTMLResponse:
        ident = parse_case_id(case_id)
        details = None
        if ident is not None:
            with views.service.database.session() as session:  # rows stay readable after it
                details = load_case(session, ident)
        if details is None:
            return views.page(
                request,
                "case_missing.html",
                status_code=404,
                title="No such case",
                page_key="cases",
                asked=storable_text(case_id),
            )
        return views.page(
            request,
            "case.html",
            title=f"Case {details.case.id}",
            page_key="cases",
            details=details,
            case=details.case,
            evidence=details.evidence,
            verdict_label=verdict_label,
            web_link=web_link,
        )

    return routes
