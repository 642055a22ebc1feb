"""Triage: replay a bundle until the sequential test decides, minimize, and report.

The whole loop for one bundle, as the CLI and (later) the Celery task run it: verdict first,
minimization for deterministic or high-rate failures, then an issue or a quarantine entry.

A test bundle that recorded the tests run before it gets one more question: when it passes alone,
did an earlier test make it fail (order dependence)? The question is asked after
``deterministic_after`` (5) isolated replays without a reproduction. By then a failure that
reproduces alone at the highest flaky rate the policy promises to catch (50%) would have shown
with probability 1 - 0.5^5 ≈ 97%, the same certainty the deterministic verdict works with; asking
sooner wastes a run of the whole prefix on ordinary failures, asking later (after all 59 replays)
wastes 54 replays on a test that is simply order-dependent. One replay of the original order
then decides whether there is anything to search; the polluters found must reproduce again
``deterministic_after`` - 1 times in a row (5 in all with the search's own run), mirroring the
5 clean runs alone, before the verdict is ``order_dependent``.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flaketriage.bundle import load_manifest
from flaketriage.errors import MinimizeError
from flaketriage.fingerprint import FailureInfo
from flaketriage.manifest import Manifest
from flaketriage.store import Store
from flaketriage.workers.bundle_minimizer import BundleMinimizer, MinimizeResult
from flaketriage.workers.polluters import OrderTarget, PolluterSearch, search_polluters
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
    polluter_search: PolluterSearch | None = None

    @property
    def polluters(self) -> list[str]:
        """The tests an order-dependent failure needs to run first (empty for any other verdict)."""
        if self.verdict.verdict is not Verdict.ORDER_DEPENDENT or self.polluter_search is None:
            return []
        return list(self.polluter_search.polluters)

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
            "polluters": self.polluters,
            "polluter_search": self.polluter_search.to_json() if self.polluter_search else None,
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


class SequentialReplays:
    """Isolated replays fed to the sequential test; `run` can stop early and be resumed."""

    def __init__(self, replayer: Replayer, policy: VerdictPolicy, progress: ProgressFn | None = None) -> None:
        self.replayer = replayer
        self.policy = policy
        self.progress = progress
        self.test = SequentialTest(policy)
        self._findings: dict[str, Finding] = {}

    @property
    def findings(self) -> list[Finding]:
        return list(self._findings.values())

    def run(self, until: int | None = None) -> None:
        """Replay until the test is done (or, given `until`, until that many replays in all)."""
        limit = self.policy.max_replays if until is None else min(until, self.policy.max_replays)
        while not self.test.done and self.test.replays < limit:
            if self.progress:
                self.progress("replaying", self.test.replays, self.policy.max_replays)
            result = self.replayer.run()
            if result.outcome is Outcome.DIFFERENT and result.failure is not None:
                self._note(result.failure)
            self.test.add(result.outcome)

    def _note(self, f: FailureInfo) -> None:
        old = self._findings.get(f.fingerprint)
        summary = f"{f.exception_type}: {f.message}" if f.exception_type else (f.detail or f.kind)
        self._findings[f.fingerprint] = Finding(
            fingerprint=f.fingerprint,
            kind=f.kind,
            summary=summary[:200],
            count=(old.count if old else 0) + 1,
        )


def decide(
    replayer: Replayer, policy: VerdictPolicy, progress: ProgressFn | None = None
) -> tuple[VerdictResult, list[Finding]]:
    """Replay until the sequential test decides (or `policy.max_replays` runs)."""
    replays = SequentialReplays(replayer, policy, progress)
    replays.run()
    return replays.test.result(), replays.findings


def decide_order(
    replays: SequentialReplays, target: OrderTarget, progress: ProgressFn | None = None
) -> PolluterSearch | None:
    """Look for polluters once `deterministic_after` isolated replays reproduced nothing (None:
    the question did not arise). The isolated replays run first, through `replays`."""
    k = replays.policy.deterministic_after
    replays.run(until=k)
    test = replays.test
    if test.reproductions or test.replays < k:
        return None
    return search_polluters(
        replays.replayer,
        target,
        confirm_runs=k - 1,
        progress=(lambda msg: progress(msg, 0, 0)) if progress else None,
    )


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
        replays = SequentialReplays(replayer, policy, progress)
        target = OrderTarget.of(manifest)
        search = decide_order(replays, target, progress) if target is not None else None
        if search is not None and search.found:
            verdict = dataclasses.replace(
                replays.test.result(), verdict=Verdict.ORDER_DEPENDENT, decided=True
            )
        else:
            replays.run()
            verdict = replays.test.result()
        result = TriageResult(
            bundle_id=bundle_id, verdict=verdict, findings=replays.findings, polluter_search=search
        )
        if minimize and should_minimize(manifest, verdict):
            try:
                minimizer = BundleMinimizer(
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
    """An issue for a deterministic or order-dependent failure, a quarantine entry for a flaky one."""
    v = result.verdict
    if v.verdict in (Verdict.DETERMINISTIC, Verdict.ORDER_DEPENDENT) and sink is not None:
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
            polluters=result.polluters,
        )
        return sink.upsert(draft)
    if v.verdict is Verdict.FLAKY and quarantine is not None:
        return quarantine.add(
            manifest.failure.fingerprint,
            test_id=manifest.failure.test_id,
            command=shlex.join(manifest.command.argv),
            bundle_id=result.bundle_id,
            verdict_evidence={
                "replays": v.replays,
                "reproductions": v.reproductions,
                "rate": {"estimate": v.rate.estimate, "low": v.rate.low, "high": v.rate.high},
            },
            reason=f"flaky: reproduced {v.reproductions} of {v.replays} replays",
        )
    return None
