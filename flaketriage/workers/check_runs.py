"""A commit's pull request check run, gathered from the records: what failed in the CI runs of that
commit, and what flaketriage knows about each failure (quarantined, flaky, real, being triaged,
new). Rendering and publishing are `flaketriage.workers.report.checks`'."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from flaketriage.quarantine import QuarantineEntry
from flaketriage.records import Case, CaseStatus, QuarantineRow
from flaketriage.records.models import CheckRunRow, ResultRow, TestRow, UploadRow
from flaketriage.results.model import Outcome
from flaketriage.settings import Settings
from flaketriage.variant import parse_variant, variant_covers
from flaketriage.workers.report.checks import CheckFailure, CheckSink, CheckSummary

MAX_LISTED = 1000
"""Failures a check run lists at most (rendering cuts further to GitHub's size limits)."""

_REAL = {"deterministic", "environment_specific", "different_failure"}
_FLAKY = {"flaky", "order_dependent"}
_UNDER_WAY = {
    CaseStatus.QUEUED.value,
    CaseStatus.TRIAGING.value,
    CaseStatus.SUSPECTED_FLAKY.value,
    CaseStatus.OPEN.value,
}


def gather(
    session: Session, row: CheckRunRow, *, case_url: str | None = None, details_url: str | None = None
) -> CheckSummary:
    """The check run of `row`'s commit, as the records say now. `case_url` (with ``{id}``) links
    each failure's case; `details_url` is where the check run's "Details" leads."""
    uploads = list(
        session.scalars(
            select(UploadRow).where(UploadRow.repository == row.repository, UploadRow.commit == row.head_sha)
        )
    )
    calm = [u.id for u in uploads if not u.storm]
    jobs = {u.id: u.job or "job" for u in uploads}
    failing = session.execute(
        select(TestRow.test_id, TestRow.variant_key, ResultRow.outcome, ResultRow.upload_pk)
        .join(TestRow, TestRow.id == ResultRow.test_pk)
        .where(
            ResultRow.upload_pk.in_(calm),
            ResultRow.outcome.in_([Outcome.FAILED.value, Outcome.ERROR.value])
            | (ResultRow.failed_attempts > 0),
        )
        .order_by(TestRow.test_id)
        .limit(MAX_LISTED * 4)
    ).all()
    grouped: dict[tuple[str, str], dict[str, Any]] = {}
    for test_id, variant, outcome, upload_pk in failing:
        entry = grouped.setdefault((test_id, variant), {"jobs": [], "retried": True})
        entry["jobs"].append(jobs.get(upload_pk, "job"))
        entry["retried"] = entry["retried"] and not Outcome(outcome).failing
    held = _quarantine(session)
    cases = _cases(session, row.repository, {t for t, _ in grouped})
    failures = [
        _failure(test_id, variant, info, held.get(test_id, []), cases.get(test_id), case_url)
        for (test_id, variant), info in list(grouped.items())[:MAX_LISTED]
    ]
    return CheckSummary(
        repository=row.repository,
        head_sha=row.head_sha,
        pull_request=row.pull_request,
        tests=sum(u.tests for u in uploads),
        failures=tuple(failures),
        storm_jobs=tuple(sorted({u.job or "job" for u in uploads if u.storm})),
        details_url=details_url,
    )


def _quarantine(session: Session) -> dict[str, list[QuarantineEntry]]:
    """The entries in force by test (an expired one no longer quarantines its test in CI)."""
    by_test: dict[str, list[QuarantineEntry]] = {}
    for q in session.scalars(select(QuarantineRow)):
        entry = QuarantineEntry.model_validate(q.entry)
        if entry.expired():
            continue
        for test in {entry.test_id, *entry.tests} - {None}:
            by_test.setdefault(str(test), []).append(entry)
    return by_test


def _cases(session: Session, repository: str, tests: set[str]) -> dict[str, Case]:
    """The newest case about each test (a bundle's over one history opened)."""
    found: dict[str, Case] = {}
    if not tests:
        return found
    rows = session.scalars(
        select(Case)
        .where(Case.repository == repository, Case.test_id.in_(sorted(tests)))
        .order_by(Case.last_seen.desc())
    )
    for case in rows:
        test = str(case.test_id)
        if test not in found or (found[test].kind == "history" and case.kind != "history"):
            found[test] = case
    return found


def _failure(
    test_id: str,
    variant: str,
    info: dict[str, Any],
    entries: list[QuarantineEntry],
    case: Case | None,
    case_url: str | None,
) -> CheckFailure:
    actual = parse_variant(variant, where="a recorded variant")
    covering = [e for e in entries if variant_covers(getattr(e, "variant", None) or {}, actual)]
    link = case_url.format(id=case.id) if case_url and case is not None else None
    common: dict[str, Any] = {
        "test_id": test_id,
        "variant": variant,
        "case_url": link,
        "message": None,
        "jobs": tuple(dict.fromkeys(info["jobs"])),
        "passed_on_retry": bool(info["retried"]),
    }
    if covering:
        e = covering[0]
        held = None if e.by_hand else (e.evidence.rate.estimate, e.evidence.rate.low, e.evidence.rate.high)
        return CheckFailure(state="quarantined", rate=held, issue_url=e.issue_url, **common)
    if case is None:
        return CheckFailure(state="new", rate=None, issue_url=None, **common)
    rate: tuple[float, float, float] | None = _rate(case.evidence)
    if case.status == CaseStatus.FIXED.value:
        return CheckFailure(state="new", rate=None, issue_url=case.report_url, **common)
    if case.status in _UNDER_WAY or not case.verdict:
        return CheckFailure(state="triaging", rate=None, issue_url=case.report_url, **common)
    if case.verdict in _FLAKY:
        return CheckFailure(state="flaky", rate=rate, issue_url=case.report_url, **common)
    if case.verdict in _REAL:
        return CheckFailure(state="real", rate=rate, issue_url=case.report_url, **common)
    return CheckFailure(state="triaging", rate=rate, issue_url=case.report_url, **common)


def _rate(evidence: dict[str, Any] | None) -> tuple[float, float, float] | None:
    rate = (evidence or {}).get("failure_rate")
    if not isinstance(rate, dict):
        return None
    try:
        return float(rate["estimate"]), float(rate["low"]), float(rate["high"])
    except (KeyError, TypeError, ValueError):
        return None


def publish(session: Session, row: CheckRunRow, sink: CheckSink, settings: Settings) -> str:
    """Gather and publish `row`'s check run (in place when it was published before); the state."""
    base = (settings.resolved_service_url() or "").rstrip("/")
    summary = gather(
        session,
        row,
        case_url=f"{base}/v1/cases/{{id}}" if base else None,
        details_url=f"{base}/v1/tests?repository={row.repository}" if base else None,
    )
    ref = sink.publish(summary, row.location)
    row.kind, row.location, row.url = ref.kind, ref.location, ref.url
    return f"check run {ref.kind} {ref.location}: {len(summary.failures)} failure(s)"
