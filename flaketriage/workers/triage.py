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

import contextlib
import dataclasses
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flaketriage.bundle.io import load_manifest
from flaketriage.bundle.manifest import Manifest
from flaketriage.bundle.variant import variant_of_manifest
from flaketriage.errors import BudgetSpentError, MinimizeError
from flaketriage.failure.fingerprint import FailureInfo
from flaketriage.settings import DEFAULT_OUTPUT_TAIL_LINES, DEFAULT_REPLAY_TIMEOUT_S
from flaketriage.store import Store
from flaketriage.text.os_strings import shell_join
from flaketriage.workers.attribution import Attribution
from flaketriage.workers.cost import CostMeter, TriageCost
from flaketriage.workers.findings import Finding, Findings
from flaketriage.workers.minimize.minimizer import BundleMinimizer, MinimizeResult
from flaketriage.workers.polluters import OrderTarget, PolluterSearch, search_polluters, search_setters
from flaketriage.workers.quarantine.file import (
    QuarantineWriter,
    evidence_of,
    failed_tests_of,
    quarantined_reason,
)
from flaketriage.workers.replay import ReplayContext, Replayer, ReplayResult, Variant
from flaketriage.workers.report import IssueDraft, IssueSink, ReportRef
from flaketriage.workers.report.render import order_command, render_issue
from flaketriage.workers.sandbox import Sandbox
from flaketriage.workers.verdict import Outcome, SequentialTest, Verdict, VerdictPolicy, VerdictResult

MINIMIZE_MIN_RATE = 0.5
"""A flaky failure is minimized only when it reproduces at least this often: below it, every
candidate needs so many clean replays that minimization costs more than it tells."""


@dataclass
class TriageResult:
    """Everything `flaketriage triage --json` prints, and what a triage task returns.

    ``to_json`` writes the object docs/commands/triage.md documents; ``from_json`` is its exact
    inverse (it raises KeyError or ValueError for an object ``to_json`` did not write), so a result
    survives a broker.
    """

    bundle_id: str
    verdict: VerdictResult
    findings: list[Finding] = field(default_factory=list)
    minimized: MinimizeResult | None = None
    minimize_error: str | None = None
    report: ReportRef | None = None
    polluter_search: PolluterSearch | None = None
    hang: str | None = None
    """When replays hung: the stacks dumped from the last one that reproduced the hang (or, when
    none did, the last that hung), the evidence of where (`flaketriage.process.hangs`)."""
    attribution: Attribution | None = None
    """The replays by runner, when they ran on more than one (the service): what an
    ``environment_specific`` verdict rests on."""
    telemetry: dict[str, Any] | None = None
    """A telemetry run's summary and the store objects of its time series and profile
    (`flaketriage.workers.telemetry`)."""
    hardware_difference: str | None = None
    """``ran on a different GPU: ...`` when the replays ran on GPUs other than the bundle's."""
    environment: dict[str, Any] | None = None
    """The environment the replays ran in (`Replayer.environment_summary`): ``mode`` (``bundle`` or
    ``worker``), and for ``bundle`` its key's ``digest``, ``python``, ``packages``, whether this
    triage ``built`` it and how long that took (``build_s``)."""
    cost: TriageCost | None = None
    """The CPU, GPU and wall seconds of its replays by phase, and its budget
    (`flaketriage.workers.cost`)."""

    @property
    def budget_spent(self) -> bool:
        """The budget stopped this triage before it was done: its verdict is undecided."""
        return self.cost is not None and self.cost.budget_spent

    @property
    def polluters(self) -> list[str]:
        """The tests an order-dependent failure needs to run first (empty for any other verdict):
        its polluters, or for a brittle test (``polluter_search.kind == "setters"``) the
        state-setters it needs to pass."""
        if self.verdict.verdict is not Verdict.ORDER_DEPENDENT or self.polluter_search is None:
            return []
        return list(self.polluter_search.polluters)

    @property
    def order_cause(self) -> str | None:
        """What the order does to an order-dependent test, in one line (`PolluterSearch.cause`)."""
        if self.verdict.verdict is not Verdict.ORDER_DEPENDENT or self.polluter_search is None:
            return None
        return self.polluter_search.cause()

    def to_json(self) -> dict[str, Any]:
        minimal = self.minimized.to_json() if self.minimized else None
        minimal_bundle = minimal.pop("bundle") if minimal else None  # printed beside, not inside
        report = (
            self.report.to_json() if self.report else {"kind": "none", "location": None, "created": False}
        )
        return {
            "bundle": self.bundle_id,
            **self.verdict.to_json(),
            "findings": [f.to_json() for f in self.findings],
            "polluters": self.polluters,
            "order_cause": self.order_cause,
            "polluter_search": self.polluter_search.to_json() if self.polluter_search else None,
            "minimal_bundle": minimal_bundle,
            "minimal": minimal,
            "minimize_error": self.minimize_error,
            "report": report,
            "hang": self.hang,
            "attribution": self.attribution.to_json() if self.attribution else None,
            "telemetry": self.telemetry,
            "hardware_difference": self.hardware_difference,
            "environment": self.environment,
            "cost": self.cost.to_json() if self.cost else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TriageResult:
        """The result `to_json` wrote (``polluters`` is derived, so it is not read)."""
        minimal, search, report = data["minimal"], data["polluter_search"], data["report"]
        return cls(
            bundle_id=data["bundle"],
            verdict=VerdictResult.from_json(data),
            findings=[Finding.from_json(f) for f in data["findings"]],
            minimized=(
                MinimizeResult.from_json({**minimal, "bundle": data["minimal_bundle"]})
                if minimal is not None
                else None
            ),
            minimize_error=data["minimize_error"],
            report=None if report["kind"] == "none" else ReportRef.from_json(report),
            polluter_search=PolluterSearch.from_json(search) if search is not None else None,
            # .get: results recorded before these keys existed read back without them.
            hang=data.get("hang"),
            attribution=Attribution.from_json(data["attribution"]) if data.get("attribution") else None,
            telemetry=data.get("telemetry"),
            hardware_difference=data.get("hardware_difference"),
            environment=data.get("environment"),
            cost=TriageCost.from_json(data["cost"]) if data.get("cost") else None,
        )


ProgressFn = Callable[[str, int, int], None]


class SequentialReplays:
    """Isolated replays fed to the sequential test; `run` can stop early and be resumed."""

    def __init__(
        self,
        replayer: Replayer,
        policy: VerdictPolicy,
        progress: ProgressFn | None = None,
        variant: Variant | None = None,
    ) -> None:
        self.replayer = replayer
        self.policy = policy
        self.progress = progress
        self.variant = variant
        """How every replay differs from the captured run (None: it is the captured run)."""
        self.test = SequentialTest(policy)
        self._findings = Findings()
        self.hang: str | None = None
        """The stacks of the last replay that reproduced a hang (else of the last that hung)."""
        self._hang_outcome: Outcome | None = None

    @property
    def findings(self) -> list[Finding]:
        return self._findings.found()

    def note_finding(self, finding: Finding) -> None:
        self._findings.add(finding)

    def run(self, until: int | None = None) -> None:
        """Replay until the test is done (or, given `until`, until that many replays in all)."""
        limit = self.policy.max_replays if until is None else min(until, self.policy.max_replays)
        meter = self._meter()
        with meter.during("verdict") if meter is not None else contextlib.nullcontext():
            self._run(limit)

    def _meter(self) -> CostMeter | None:
        # A stand-in replayer (a simulation's, a test's) may keep no meter.
        meter: CostMeter | None = getattr(self.replayer, "meter", None)
        return meter

    def _run(self, limit: int) -> None:
        meter = self._meter()
        while not self.test.done and self.test.replays < limit:
            if meter is not None and meter.exhausted():
                return  # the budget is spent: the test stays undecided, with the counts so far
            if self.progress:
                self.progress("replaying", self.test.replays, self.policy.max_replays)
            result = self.replayer.run() if self.variant is None else self.replayer.run(self.variant)
            self._note(result)
            self._note_hang(result.outcome, result.failure)
            self.test.add(result.outcome)

    def _note_hang(self, outcome: Outcome, failure: FailureInfo | None) -> None:
        if failure is None or failure.kind != "timeout" or not failure.traceback:
            return
        if outcome is Outcome.REPRODUCED or self._hang_outcome is not Outcome.REPRODUCED:
            self.hang, self._hang_outcome = failure.traceback, outcome

    def _note(self, result: ReplayResult) -> None:
        f = result.failure
        if result.outcome is Outcome.DIFFERENT and f is not None:
            summary = f"{f.exception_type}: {f.message}" if f.exception_type else (f.detail or f.kind)
            self._findings.replay(result.outcome, summary, fingerprint=f.fingerprint, kind=f.kind)
        else:
            self._findings.replay(result.outcome, result.reason, fingerprint=None, kind="environment")


def decide(
    replayer: Replayer,
    policy: VerdictPolicy,
    progress: ProgressFn | None = None,
    variant: Variant | None = None,
) -> tuple[VerdictResult, list[Finding]]:
    """Replay until the sequential test decides (or `policy.max_replays` runs), each replay the
    captured run or, given `variant`, that change to it."""
    replays = SequentialReplays(replayer, policy, progress, variant)
    replays.run()
    return replays.test.result(), replays.findings


def decide_order(
    replays: SequentialReplays, target: OrderTarget, progress: ProgressFn | None = None
) -> PolluterSearch | None:
    """Look for polluters once `deterministic_after` isolated replays all passed (None: the question
    did not arise). The isolated replays run first, through `replays`. A test that failed alone in
    another way never passed alone, so no order explains it: that failure is a finding of its own."""
    k = replays.policy.deterministic_after
    replays.run(until=k)
    test = replays.test
    if test.passes < k or not target.preceding:
        return None
    return search_polluters(
        replays.replayer,
        target,
        confirm_runs=k - 1,
        progress=(lambda msg: progress(msg, 0, 0)) if progress else None,
    )


def decide_setters(
    replays: SequentialReplays, target: OrderTarget, progress: ProgressFn | None = None
) -> PolluterSearch | None:
    """For a test that failed alone on every replay: does it pass after the session's other tests,
    and which does it need (its state-setters)? Asked only when the session was still to run tests
    after it (tests that ran before it were there when it failed); None when not asked."""
    verdict = replays.test.result()
    if verdict.verdict is not Verdict.DETERMINISTIC or verdict.passes or not target.following:
        return None
    return search_setters(
        replays.replayer,
        target,
        confirm_runs=replays.policy.deterministic_after - 1,
        progress=(lambda msg: progress(msg, 0, 0)) if progress else None,
    )


def drawn_seed_argv(manifest: Manifest) -> Callable[[], list[str]] | None:
    """The captured command with a freshly drawn seed each call, for a seed the session drew at
    random (pytest-randomly's, when no one set it); None when the bundle has no such seed."""
    if "pytest-randomly" not in manifest.seeds.drawn:
        return None
    flag = f"--randomly-seed={manifest.seeds.values.get('pytest-randomly')}"
    argv = list(manifest.command.argv)
    if flag not in argv:
        return None
    at = argv.index(flag)
    return lambda: [*argv[:at], f"--randomly-seed={secrets.randbelow(2**32)}", *argv[at + 1 :]]


def decide_seeds(
    replays: SequentialReplays, manifest: Manifest, progress: ProgressFn | None = None
) -> tuple[VerdictResult, Finding] | None:
    """For a failure that reproduced on every replay under the seed its session drew: does it also
    fail under the seeds other CI runs draw? The sequential test is asked again, each replay under
    a fresh seed; a failure that passes under some is flaky at the rate measured across seeds
    (what CI sees), with a finding naming the seed that fails every time. None when not asked or
    when it fails under every seed."""
    verdict = replays.test.result()
    fresh = drawn_seed_argv(manifest)
    if fresh is None or verdict.verdict is not Verdict.DETERMINISTIC or verdict.passes:
        return None
    test = SequentialTest(replays.policy)
    meter = replays._meter()
    with meter.during("verdict") if meter is not None else contextlib.nullcontext():
        while not test.done and test.replays < replays.policy.max_replays:
            if meter is not None and meter.exhausted():
                break
            if progress:
                progress("replaying under fresh seeds", test.replays, replays.policy.max_replays)
            test.add(replays.replayer.run(Variant(argv=fresh())).outcome)
    across = test.result()
    if not across.passes:
        return None
    seed = manifest.seeds.values.get("pytest-randomly")
    finding = Finding(
        fingerprint="seed:pytest-randomly",
        kind="seed",
        summary=(
            f"fails on every replay under its session's --randomly-seed={seed}; under fresh seeds it "
            f"failed {across.reproductions} of {across.replays} (each CI run draws another seed)"
        ),
        count=across.passes,
    )
    return dataclasses.replace(across, verdict=Verdict.FLAKY, decided=True), finding


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
    quarantine: QuarantineWriter | None,
    context: ReplayContext,
    minimize: bool = False,
    timeout_s: float | None = None,
    default_timeout_s: float = DEFAULT_REPLAY_TIMEOUT_S,
    memory_mb: int | None = None,
    tail_lines: int = DEFAULT_OUTPUT_TAIL_LINES,
    progress: ProgressFn | None = None,
    budget_s: float | None = None,
    on_replay: Callable[[str, ReplayResult], None] | None = None,
) -> TriageResult:
    """The whole loop for one bundle.

    Everything it uses comes in through its arguments (the machine's side through `context`), and
    it changes no process-wide state, so several triages can run at once in one process's threads.
    `timeout_s` is every replay's limit when given; otherwise the capture's own, else
    `default_timeout_s` (``FLAKETRIAGE_REPLAY_TIMEOUT_S``). `tail_lines`
    (``FLAKETRIAGE_OUTPUT_TAIL_LINES``) is how much of stderr an issue shows. `budget_s`
    (``FLAKETRIAGE_TRIAGE_BUDGET_S``) caps the CPU plus GPU seconds of its replays
    (`flaketriage.workers.cost`): spent before the verdict is decided, it ends undecided and
    reports nothing. `on_replay` is told of every replay as it ends, with its phase.
    """
    manifest = load_manifest(store, ident)
    bundle_id = manifest.bundle_id
    with Replayer(
        store,
        manifest,
        sandbox,
        context=context,
        timeout_s=timeout_s,
        default_timeout_s=default_timeout_s,
        memory_mb=memory_mb,
    ) as replayer:
        # Runs outside the sequential test's own loop (it counts its "verdict" runs itself) and
        # before minimization are the order search's.
        meter = replayer.meter = CostMeter(budget_s, replayer.gpus)
        replayer.on_run = on_replay
        meter.phase = "order"
        replays = SequentialReplays(replayer, policy, progress)
        target = OrderTarget.of(manifest)
        search: PolluterSearch | None = None
        try:
            search = decide_order(replays, target, progress) if target is not None else None
            if search is not None and search.found:
                verdict = dataclasses.replace(
                    replays.test.result(), verdict=Verdict.ORDER_DEPENDENT, decided=True
                )
            else:
                replays.run()
                verdict = replays.test.result()
                setters = decide_setters(replays, target, progress) if target is not None else None
                if setters is not None:
                    search = setters
                    if setters.found:
                        verdict = dataclasses.replace(verdict, verdict=Verdict.ORDER_DEPENDENT)
                if verdict.verdict is Verdict.DETERMINISTIC:
                    seeded = decide_seeds(replays, manifest, progress)
                    if seeded is not None:
                        verdict, finding = seeded
                        replays.note_finding(finding)
        except BudgetSpentError:
            # Stopped inside an order search: a search cut short names nothing, and the verdict it
            # was asked to refine is not the triage's answer, so it is undecided with the counts so far.
            search, verdict = None, dataclasses.replace(replays.test.result(), decided=False)
        result = TriageResult(
            bundle_id=bundle_id,
            verdict=verdict,
            findings=replays.findings,
            polluter_search=search,
            hang=replays.hang,
            hardware_difference=replayer.hardware_difference,
            environment=replayer.environment_summary(),
            cost=meter.cost,
        )
        meter.phase = "minimize"
        if minimize and should_minimize(manifest, verdict):
            try:
                minimizer = BundleMinimizer(
                    store,
                    replayer,
                    bundle_id,
                    verdict.reproductions,
                    verdict.reproductions + verdict.passes,
                    progress=(lambda msg: progress(msg, 0, 0)) if progress else None,
                )
                result.minimized = minimizer.run()
            except (MinimizeError, BudgetSpentError) as exc:  # spent: no minimal bundle, never a wrong one
                result.minimize_error = str(exc)
    result.report = report(store, manifest, result, sink, quarantine, tail_lines=tail_lines)
    return result


def report(
    store: Store,
    manifest: Manifest,
    result: TriageResult,
    sink: IssueSink | None,
    quarantine: QuarantineWriter | None,
    *,
    tail_lines: int = DEFAULT_OUTPUT_TAIL_LINES,
    key: str | None = None,
    occurrences: int | None = None,
) -> ReportRef | None:
    """An issue for a deterministic, order-dependent or environment-specific failure (labelled
    ``suspected-environment``), a quarantine entry for a flaky one (`_report_flaky`). An
    order-dependent test whose polluters were found is quarantined too, naming them and linking
    its issue, unless the writer's `order_dependent` (``FLAKETRIAGE_QUARANTINE_ORDER_DEPENDENT``)
    is off; the issue is returned.

    `key` is the report's idempotency key (the triage's identity): reporting the same triage again
    (a retried task) counts no second occurrence on the issue. `occurrences`, the times the
    service's case saw the failure, is what the issue says it was seen (None: one more each report).
    """
    v = result.verdict
    if result.budget_spent and not v.decided:
        return None  # its verdict is a guess: the budget stopped it first
    issue_verdicts = (Verdict.DETERMINISTIC, Verdict.ORDER_DEPENDENT, Verdict.ENVIRONMENT_SPECIFIC)
    if v.verdict in issue_verdicts and sink is not None:
        ref = sink.upsert(_draft(store, manifest, result, tail_lines, key, occurrences))
        search = result.polluter_search if result.polluters else None
        if search is not None and quarantine is not None and quarantine.order_dependent:
            quarantine.add(
                manifest.failure.fingerprint,
                test_id=manifest.failure.test_id,
                command=order_command(manifest.failure.test_id or shell_join(manifest.command.argv), search),
                bundle_id=result.bundle_id,
                evidence=evidence_of(v),
                reason=f"order_dependent: {search.cause()}",
                issue_url=ref.location,
                polluters=search.polluters,
                variant=variant_of_manifest(manifest),
            )
        return ref
    if v.verdict is Verdict.FLAKY:
        return _report_flaky(
            store, manifest, result, sink, quarantine, tail_lines=tail_lines, key=key, occurrences=occurrences
        )
    return None


def _report_flaky(
    store: Store,
    manifest: Manifest,
    result: TriageResult,
    sink: IssueSink | None,
    quarantine: QuarantineWriter | None,
    *,
    tail_lines: int,
    key: str | None,
    occurrences: int | None = None,
) -> ReportRef | None:
    """Quarantine a flaky failure: its test, or every test a whole test run failed
    (`failed_tests_of`: the captured run's failing tests, which its reproductions share, since a
    pytest run's fingerprint names them). A failure with no test identity (a training script) has
    nothing CI can skip, so it is also reported as a ``flaky`` issue, and with no quarantine list
    the issue is the report: a flaky verdict is never dropped silently."""
    v, fingerprint = result.verdict, manifest.failure.fingerprint
    tests = failed_tests_of(store, manifest)
    test_ids = tests.ids if tests is not None else ()
    test_id = manifest.failure.test_id or (test_ids[0] if test_ids else None)
    # A flaky verdict of a test files no issue, but one opened earlier for this failure explains
    # it: it gets the flaky evidence and label, and the quarantine entry links it.
    issue = sink.find(fingerprint) if sink is not None else None
    if sink is not None and (issue is not None or test_id is None or quarantine is None):
        issue = sink.upsert(_draft(store, manifest, result, tail_lines, key, occurrences))
    if quarantine is None:
        return issue
    return quarantine.add(
        fingerprint,
        test_id=test_id,
        command=shell_join(manifest.command.argv),
        bundle_id=result.bundle_id,
        evidence=evidence_of(v),
        reason=quarantined_reason(v, tests)
        + (f"; triage cost {result.cost.line()}" if result.cost is not None else ""),
        issue_url=issue.location if issue is not None else None,
        tests=test_ids,
        variant=variant_of_manifest(manifest),
    )


def _draft(
    store: Store,
    manifest: Manifest,
    result: TriageResult,
    tail_lines: int,
    key: str | None,
    occurrences: int | None = None,
) -> IssueDraft:
    minimal = result.minimized
    return render_issue(
        store,
        manifest,
        result.bundle_id,
        result.verdict,
        minimal=load_manifest(store, minimal.bundle_id) if minimal else None,
        minimal_bundle_id=minimal.bundle_id if minimal else None,
        findings=[f"{f.summary} ({f.count}×, fingerprint {f.fingerprint[:12]})" for f in result.findings],
        polluters=result.polluters,
        order=result.polluter_search if result.polluters else None,
        tail_lines=tail_lines,
        key=key,
        environment_specific=result.verdict.verdict is Verdict.ENVIRONMENT_SPECIFIC,
        runners=result.attribution.lines() if result.attribution else (),
        hang=result.hang,
        telemetry=result.telemetry,
        cost=result.cost,
        occurrences=occurrences,
    )
