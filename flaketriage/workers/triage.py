"""Triage: replay a bundle until the sequential test decides, minimize, and report.

The whole loop for one bundle, as the CLI and (later) the Celery task run it: verdict first,
minimization for deterministic or high-rate failures, then an issue or a quarantine entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flaketriage.bundle import load_manifest
from flaketriage.errors import MinimizeError
from flaketriage.manifest import Manifest
from flaketriage.store import Store
from flaketriage.workers.minimize import Minimizer, MinimizeResult
from flaketriage.workers.quarantine import Quarantine
from flaketriage.workers.replay import Replayer
from flaketriage.workers.report import IssueSink, ReportRef
from flaketriage.workers.report.render import render_issue
from flaketriage.workers.sandbox import Sandbox
from flaketriage.workers.verdict import Outcome, SequentialTest, Verdict, VerdictPolicy, VerdictResult

MINIMIZE_MIN_RATE = 0.5
"""A flaky failure is minimized only when it reproduces at least this often: below it, every
candidate needs so many clean replays that minimization costs more than it tells."""


@dataclass(frozen=True)
class Finding:
    """A different failure seen during replays: reported, never counted as a reproduction."""

    fingerprint: str
    kind: str
    summary: str
    count: int


@dataclass
class TriageResult:
    """Everything `flaketriage triage --json` prints."""

    bundle_id: str
    verdict: VerdictResult
    findings: list[Finding] = field(default_factory=list)
    minimized: MinimizeResult | None = None
    minimize_error: str | None = None
    report: ReportRef | None = None

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        return {
            "bundle": self.bundle_id,
            "verdict": str(v.verdict),
            "decided": v.decided,
            "replays": v.replays,
            "failures": v.reproductions,
            "passes": v.passes,
            "different_failures": v.different,
            "failure_rate": {"estimate": v.rate.estimate, "low": v.rate.low, "high": v.rate.high},
            "findings": [f.__dict__ for f in self.findings],
            "minimal_bundle": self.minimized.bundle_id if self.minimized else None,
            "minimal": (
                {
                    "data": {p: {"kept": k, "of": n} for p, (k, n) in self.minimized.data.items()},
                    "args": {a: {"from": f, "to": t} for a, (f, t) in self.minimized.args.items()},
                    "oracle_calls": self.minimized.oracle_calls,
                    "replays": self.minimized.replays,
                }
                if self.minimized
                else None
            ),
            "minimize_error": self.minimize_error,
            "report": (
                {"kind": self.report.kind, "location": self.report.location, "created": self.report.created}
                if self.report
                else {"kind": "none", "location": None, "created": False}
            ),
        }


ProgressFn = Callable[[str, int, int], None]


def decide(
    replayer: Replayer, policy: VerdictPolicy, progress: ProgressFn | None = None
) -> tuple[VerdictResult, list[Finding]]:
    """Replay until the sequential test decides (or `policy.max_replays` runs)."""
    test = SequentialTest(policy)
    findings: dict[str, Finding] = {}
    for i in range(policy.max_replays):
        if progress:
            progress("replaying", i, policy.max_replays)
        result = replayer.run()
        if result.outcome is Outcome.DIFFERENT and result.failure is not None:
            f = result.failure
            old = findings.get(f.fingerprint)
            summary = f"{f.exception_type}: {f.message}" if f.exception_type else (f.detail or f.kind)
            findings[f.fingerprint] = Finding(
                fingerprint=f.fingerprint,
                kind=f.kind,
                summary=summary[:200],
                count=(old.count if old else 0) + 1,
            )
        test.add(result.outcome)
        if test.done:
            break
    return test.result(), list(findings.values())


def should_minimize(manifest: Manifest, verdict: VerdictResult) -> bool:
    reducible = any(d.reducible and d.items > 1 for d in manifest.data)
    if verdict.verdict is Verdict.DETERMINISTIC:
        return True
    return verdict.verdict is Verdict.FLAKY and verdict.rate.estimate >= MINIMIZE_MIN_RATE and reducible


def triage(
    store: Store,
    ident: str,
    *,
    sandbox: Sandbox,
    policy: VerdictPolicy,
    sink: IssueSink | None,
    quarantine: Quarantine | None,
    minimize: bool = False,
    timeout_s: float | None = None,
    memory_mb: int | None = None,
    progress: ProgressFn | None = None,
) -> TriageResult:
    """The whole loop for one bundle."""
    manifest = load_manifest(store, ident)
    bundle_id = manifest.bundle_id
    with Replayer(store, manifest, sandbox, timeout_s=timeout_s, memory_mb=memory_mb) as replayer:
        verdict, findings = decide(replayer, policy, progress)
        result = TriageResult(bundle_id=bundle_id, verdict=verdict, findings=findings)
        if minimize and should_minimize(manifest, verdict):
            try:
                minimizer = Minimizer(
                    store,
                    replayer,
                    bundle_id,
                    verdict.rate.estimate,
                    progress=(lambda msg: progress(msg, 0, 0)) if progress else None,
                )
                result.minimized = minimizer.run()
            except MinimizeError as exc:
                result.minimize_error = str(exc)
    result.report = report(store, manifest, result, sink, quarantine)
    return result


def report(
    store: Store,
    manifest: Manifest,
    result: TriageResult,
    sink: IssueSink | None,
    quarantine: Quarantine | None,
) -> ReportRef | None:
    """An issue for a deterministic failure, a quarantine entry for a flaky one."""
    v = result.verdict
    if v.verdict is Verdict.DETERMINISTIC and sink is not None:
        minimal = result.minimized
        draft = render_issue(
            store,
            manifest,
            result.bundle_id,
            v,
            minimal=minimal.manifest if minimal else None,
            minimal_bundle_id=minimal.bundle_id if minimal else None,
            store_location=store.location,
            findings=[f"{f.summary} ({f.count}×, fingerprint {f.fingerprint[:12]})" for f in result.findings],
        )
        return sink.upsert(draft)
    if v.verdict is Verdict.FLAKY and quarantine is not None:
        return quarantine.add(
            manifest.failure.fingerprint,
            test_id=manifest.failure.test_id,
            command=" ".join(manifest.command.argv),
            bundle_id=result.bundle_id,
            verdict_evidence={
                "replays": v.replays,
                "reproductions": v.reproductions,
                "rate": {"estimate": v.rate.estimate, "low": v.rate.low, "high": v.rate.high},
            },
            reason=f"flaky: reproduced {v.reproductions} of {v.replays} replays",
        )
    return None
