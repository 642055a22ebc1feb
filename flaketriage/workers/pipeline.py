"""What each task does: triage (in batches of parallel replays), replay, minimize, report, reruns.

A triage is a row of work and its replays are rows of their own. `Pipeline.triage` feeds the
replays that finished, in order, to the sequential test: decided, it records the verdict and sends
minimization or the report; undecided, it sends the next batch of replays to the queue and waits.
Each `Pipeline.replay` runs one replay on whichever worker took it and records its outcome; the
last of a batch sends the triage on. So the replays of one case run on every worker at once, and
two workers decide a case in about half the time one takes.

Every step holds its row by a lease (`workers.leases`) and checks what is already recorded before
it works, so a task delivered twice does nothing twice and files no second report.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from flaketriage.bundle.io import load_manifest
from flaketriage.bundle.manifest import Manifest
from flaketriage.errors import FlaketriageError
from flaketriage.records import Case, CaseStatus, Database, QuarantineRow, ReplayRow, Work, WorkStatus
from flaketriage.records.models import utc_now
from flaketriage.settings import Settings
from flaketriage.store import Store, open_store
from flaketriage.work.dispatch import Dispatcher, Outgoing
from flaketriage.work.messages import Queue, Step, WorkOrder, task_name
from flaketriage.workers.attribution import RunnerIdentity
from flaketriage.workers.comments import Commenter
from flaketriage.workers.cost import CostMeter, PhaseCost, TriageCost
from flaketriage.workers.gpus import gpu_difference
from flaketriage.workers.leases import Heartbeat, claim, release
from flaketriage.workers.minimize.minimizer import BundleMinimizer, MinimizeResult
from flaketriage.workers.polluters import OrderTarget
from flaketriage.workers.progress import TriageProgress, replay_summary
from flaketriage.workers.quarantine.records import RecordsQuarantine
from flaketriage.workers.replay import ReplayContext, Replayer, Variant
from flaketriage.workers.report import IssueSink
from flaketriage.workers.report.render import evidence_line, render_comment
from flaketriage.workers.runners import attribute_triage, record_attribution, record_replay
from flaketriage.workers.sandbox import Sandbox
from flaketriage.workers.telemetry import TelemetryRun, telemetry_policy
from flaketriage.workers.triage import (
    Finding,
    TriageResult,
    decide,
    drawn_seed_argv,
    report,
    should_minimize,
    triage,
)
from flaketriage.workers.verdict import Outcome, SequentialTest, Verdict, VerdictPolicy

log = logging.getLogger("flaketriage.workers")

REPLAYERS_KEPT = 4
"""Materialized bundles a worker process keeps, most recently used first: the replays of one
triage reuse one workspace instead of materializing it for every run."""


@dataclass
class WorkerEnv:
    """What one worker process works with, built once per process."""

    settings: Settings
    database: Database
    dispatcher: Dispatcher
    sandbox: Sandbox
    sink: IssueSink | None
    commenter: Commenter | None
    context: ReplayContext
    identity: RunnerIdentity = field(default_factory=RunnerIdentity.local)
    """The machine this worker replays on: its host and GPUs (`flaketriage.workers.attribution`)."""
    worker: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    """This worker process, as replay rows name it beside the runner."""
    _replayers: OrderedDict[tuple[str, str], Replayer] = field(default_factory=OrderedDict)

    @property
    def runner(self) -> str:
        """The runner id replays record: the host name plus a digest of its GPUs' UUIDs."""
        return self.identity.id

    def policy(self, *, max_replays: int | None = None) -> VerdictPolicy:
        s = self.settings
        return VerdictPolicy(
            min_rate=s.min_flaky_rate,
            max_rate=s.max_flaky_rate,
            alpha=s.alpha,
            max_replays=max_replays or s.max_replays,
            flaky_rate_replays=s.flaky_rate_replays,
        )

    def store(self, url: str, *, writable: bool = False) -> Store:
        return open_store(url, readonly=not writable, settings=self.settings)

    def replayer(self, store_url: str, manifest: Manifest) -> Replayer:
        """A materialized replayer of the bundle, kept for the next replay of it in this process."""
        key = (store_url, manifest.bundle_id)
        found = self._replayers.get(key)
        if found is not None:
            self._replayers.move_to_end(key)
            return found
        replayer = self.fresh_replayer(store_url, manifest)
        self._replayers[key] = replayer
        while len(self._replayers) > REPLAYERS_KEPT:
            _, old = self._replayers.popitem(last=False)
            old.close()
        return replayer

    def fresh_replayer(
        self, store_url: str, manifest: Manifest, *, latest: bool = False, timeout_s: float | None = None
    ) -> Replayer:
        """A new replayer (the caller closes it); with `latest`, at its branch's newest commit;
        `timeout_s`, when given, is every replay's limit."""
        return Replayer(
            self.store(store_url),
            manifest,
            self.sandbox,
            context=self.context,
            timeout_s=timeout_s,
            default_timeout_s=self.settings.replay_timeout_s,
            memory_mb=self.settings.replay_memory_mb,
            latest=latest,
        )

    def close(self) -> None:
        while self._replayers:
            self._replayers.popitem()[1].close()


def rerun_order(work: Work, manifest: Manifest) -> Variant | None:
    """The order an isolation rerun replays an order-dependent test in (`Upkeep.schedule_reruns`):
    after the polluters its triage found, as it failed; None for a rerun of the captured run."""
    polluters = work.options.get("polluters") if work.options.get("order") == "after" else None
    target = OrderTarget.of(manifest) if polluters else None
    if target is None or not isinstance(polluters, list):
        return None
    return target.variant_with([str(t) for t in polluters])


def replay_queue(manifest: Manifest) -> Queue:
    """Where a bundle's replays run: a failure captured on a GPU needs a GPU runner."""
    return Queue.GPU if manifest.hardware.gpus else Queue.CPU


class Pipeline:
    def __init__(self, env: WorkerEnv) -> None:
        self.env = env
        self.db = env.database

    # -- triage -------------------------------------------------------------------------------
    def triage(self, work_id: int) -> str:
        if not claim(self.db, work_id):
            return "busy-or-done"
        try:
            return self._advance(work_id)
        except FlaketriageError as exc:
            self._fail(work_id, exc)
            return "failed"

    def _advance(self, work_id: int) -> str:
        work = self._work(work_id)
        manifest = load_manifest(self.env.store(str(work.store_url)), str(work.bundle_id))
        queue = replay_queue(manifest)
        if work.queue != queue.value:
            # The intake cannot read a bundle's hardware: the first step moves the triage to the
            # queue its replays run on, so its decision (and its hardware check) runs there too.
            with self.db.session() as session:
                _set_work(session, work_id, queue=queue.value, status=WorkStatus.QUEUED.value,
                          heartbeat_at=None, sent_at=utc_now())  # fmt: skip
            self.env.dispatcher.send([Outgoing(task_name(Step.TRIAGE), WorkOrder(work_id=work_id), queue)])
            return f"moved to the {queue.value} queue"
        self._set_case(work.case_id, status=CaseStatus.TRIAGING.value, only_from=(CaseStatus.QUEUED.value,))
        if OrderTarget.of(manifest) is not None or drawn_seed_argv(manifest) is not None:
            return self._triage_whole(work, manifest)
        policy = self.env.policy()
        outgoing: list[Outgoing | None] = []
        with self.db.session() as session:
            rows = session.scalars(
                select(ReplayRow).where(ReplayRow.work_id == work_id).order_by(ReplayRow.idx)
            ).all()
            test = SequentialTest(policy)
            for row in rows:
                if row.outcome is None:
                    break  # outcomes count in replay order, as if they had run one after another
                test.add(Outcome(row.outcome))
            pending = any(row.outcome is None for row in rows)
            cost = self._cost(rows, manifest)
            # Spent before the test decided: the triage ends undecided here, with the counts so far.
            spent = not test.done and not pending and cost.over_budget()
            if test.done or spent:
                cost.budget_spent = spent
                result = TriageResult(
                    bundle_id=manifest.bundle_id,
                    verdict=test.result(),
                    findings=_findings(rows),
                    hang=_hang(rows),
                    # Checked on the runner that decides: a GPU bundle's replays and decision all
                    # run on the gpu queue.
                    hardware_difference=(
                        gpu_difference(manifest.hardware, self.env.context.gpus())
                        if manifest.hardware.gpus
                        else None
                    ),
                    cost=cost,
                )
                current = session.get(Work, work_id)
                assert current is not None
                self._attribute(session, current, manifest, result)
                outgoing.extend(self._decided(session, work_id, manifest, result))
                state = "decided"
            elif pending:
                _set_work(
                    session, work_id, status=WorkStatus.WAITING.value, heartbeat_at=None, sent_at=utc_now()
                )
                state = "waiting"
            else:
                wanted = min(self.env.settings.replay_batch, policy.max_replays - len(rows))
                if test.decided is Verdict.FLAKY:  # decided: only the rate's sample is left to fill
                    wanted = min(wanted, policy.flaky_rate_replays - len(rows))
                wanted = max(wanted, 1)
                start = len(rows)
                current = session.get(Work, work_id)
                assert current is not None
                current.batch += 1
                outgoing.extend(
                    self.env.dispatcher.replays(
                        session,
                        current,
                        range(start, start + wanted),
                        current.batch,
                        queue=replay_queue(manifest),
                    )
                )
                _set_work(
                    session, work_id, status=WorkStatus.WAITING.value, heartbeat_at=None, sent_at=utc_now()
                )
                state = f"sent {wanted} replays"
        self.env.dispatcher.send(outgoing)
        return state

    def _triage_whole(self, work: Work, manifest: Manifest) -> str:
        """The whole triage in one task, for the questions that follow the verdict's replays one by
        one: a test that recorded the tests run before it may be order-dependent (the polluter
        search is sequential by nature), and a failure under a seed its session drew is asked again
        under fresh seeds (`decide_seeds`) when it reproduced every time."""
        policy = self.env.policy()
        progress = TriageProgress(
            self.db, work.id, planned=policy.max_replays, runner=self.env.runner, worker=self.env.worker
        )
        with Heartbeat(self.db, work.id):
            result = triage(
                self.env.store(str(work.store_url), writable=True),
                manifest.bundle_id,
                sandbox=self.env.sandbox,
                policy=policy,
                sink=None,
                quarantine=None,
                context=self.env.context,
                minimize=False,
                default_timeout_s=self.env.settings.replay_timeout_s,
                memory_mb=self.env.settings.replay_memory_mb,
                budget_s=self.env.settings.triage_budget_s,
                progress=progress.message,
                on_replay=progress.replay,
            )
        with self.db.session() as session:
            record_replay(session, self.env.identity, replays=result.verdict.replays)
            outgoing = self._decided(session, work.id, manifest, result)
        self.env.dispatcher.send(outgoing)
        return "decided"

    def _decided(
        self, session: Session, work_id: int, manifest: Manifest, result: TriageResult
    ) -> list[Outgoing | None]:
        """Record the verdict; request minimization or the report."""
        work = session.get(Work, work_id)
        assert work is not None
        data = result.to_json()
        work.result = data
        work.status = WorkStatus.DONE.value
        work.finished_at = utc_now()
        work.heartbeat_at = None
        case = session.get(Case, work.case_id) if work.case_id else None
        guess = result.budget_spent and not result.verdict.decided  # the budget stopped it: no verdict
        if case is not None:
            case.verdict = None if guess else str(result.verdict.verdict)
            case.status = CaseStatus.DECIDED.value
            case.evidence = data
        next_step = Step.REPORT
        queue: Queue | str = Queue.REPORT
        if work.options.get("minimize") and not guess and should_minimize(manifest, result.verdict):
            next_step, queue = Step.MINIMIZE, replay_queue(manifest)
        _, sent = self.env.dispatcher.request(
            session,
            key=f"{next_step}:{work.id}",
            step=next_step,
            queue=queue,
            case_id=work.case_id,
            bundle_id=work.bundle_id,
            store_url=work.store_url,
            options={"triage": work.id, **{k: v for k, v in work.options.items() if k == "reply_to"}},
        )
        return [sent]

    # -- one replay ---------------------------------------------------------------------------
    def replay(self, work_id: int, index: int) -> str:
        with self.db.session() as session:
            row = _replay_row(session, work_id, index)
            work = session.get(Work, work_id)
            if row is None or row.outcome is not None or work is None or work.status == WorkStatus.DONE.value:
                return "already-done"
            store_url, bundle_id = str(work.store_url), str(work.bundle_id)
        try:
            manifest = load_manifest(self.env.store(store_url), bundle_id)
            started = time.monotonic()
            result = self.env.replayer(store_url, manifest).run()
            duration = time.monotonic() - started
            cost = result.cost
            outcome, failure = result.outcome, result.failure
        except FlaketriageError as exc:
            # The replay could not run here (the bundle is gone, the sandbox failed): that is the
            # triage's failure, not a replay outcome.
            self._fail(work_id, exc)
            return "failed"
        outgoing: list[Outgoing] = []
        with self.db.session() as session:
            work = _lock_work(session, self.db, work_id)
            changed = session.execute(
                update(ReplayRow)
                .where(ReplayRow.work_id == work_id, ReplayRow.idx == index, ReplayRow.outcome.is_(None))
                .values(
                    outcome=str(outcome),
                    fingerprint=failure.fingerprint if failure else None,
                    summary=replay_summary(result),
                    duration_s=duration,
                    cpu_s=cost.cpu_s if cost is not None else None,
                    gpu_s=cost.gpu_s if cost is not None else None,
                    runner=self.env.runner,
                    worker=self.env.worker,
                    finished_at=utc_now(),
                )
                .execution_options(synchronize_session=False)
            ).rowcount  # type: ignore[attr-defined]
            if changed:
                record_replay(session, self.env.identity)
            pending = session.scalar(
                select(func.count())
                .select_from(ReplayRow)
                .where(ReplayRow.work_id == work_id, ReplayRow.outcome.is_(None))
            )
            if changed and not pending and work is not None and work.status == WorkStatus.WAITING.value:
                work.sent_at = utc_now()
                outgoing.append(Outgoing(task_name(Step.TRIAGE), WorkOrder(work_id=work_id), work.queue))
        self.env.dispatcher.send(outgoing)
        return str(outcome)

    # -- minimization -------------------------------------------------------------------------
    def minimize(self, work_id: int) -> str:
        if not claim(self.db, work_id):
            return "busy-or-done"
        try:
            work = self._work(work_id)
            triage_result = self._triage_result(work)
            store_url = str(work.store_url)
            manifest = load_manifest(self.env.store(store_url), str(work.bundle_id))
            store = self.env.store(store_url, writable=True)
            metered = self._metered(self.env.replayer(store_url, manifest), triage_result.cost)
            with metered as meter, Heartbeat(self.db, work_id):
                minimizer = BundleMinimizer(
                    store,
                    self.env.replayer(store_url, manifest),
                    manifest.bundle_id,
                    triage_result.verdict.reproductions,
                    triage_result.verdict.reproductions + triage_result.verdict.passes,
                )
                try:
                    minimized: MinimizeResult | None = minimizer.run()
                    error = None
                except FlaketriageError as exc:
                    minimized, error = None, str(exc)
            outgoing: list[Outgoing | None] = []
            with self.db.session() as session:
                _set_work(
                    session,
                    work_id,
                    status=WorkStatus.DONE.value,
                    result={
                        "minimized": minimized.to_json() if minimized else None,
                        "error": error,
                        "cost": meter.cost.to_json(),  # the triage's with minimization's
                    },
                    finished_at=utc_now(),
                    heartbeat_at=None,
                )
                _, sent = self.env.dispatcher.request(
                    session,
                    key=f"report:{work.options['triage']}",
                    step=Step.REPORT,
                    queue=Queue.REPORT,
                    case_id=work.case_id,
                    bundle_id=work.bundle_id,
                    store_url=work.store_url,
                    options={**work.options, "minimize": work.id},
                )
                outgoing.append(sent)
            self.env.dispatcher.send(outgoing)
            return "minimized" if minimized else f"not minimized: {error}"
        except FlaketriageError as exc:
            self._fail(work_id, exc)
            return "failed"

    # -- report -------------------------------------------------------------------------------
    def report(self, work_id: int) -> str:
        if not claim(self.db, work_id):
            return "busy-or-done"
        try:
            work = self._work(work_id)
            result = self._triage_result(work)
            minimize_id = work.options.get("minimize")
            if isinstance(minimize_id, int):
                minimized = self._work(minimize_id).result or {}
                if minimized.get("minimized"):
                    result.minimized = MinimizeResult.from_json(minimized["minimized"])
                result.minimize_error = minimized.get("error")
                if minimized.get("cost"):
                    result.cost = TriageCost.from_json(minimized["cost"])
            store = self.env.store(str(work.store_url), writable=True)
            manifest = load_manifest(store, str(work.bundle_id))
            quarantine = RecordsQuarantine(
                self.db, work.case_id, order_dependent=self.env.settings.quarantine_order_dependent
            )
            ref = report(
                store,
                manifest,
                result,
                self.env.sink,
                quarantine,
                tail_lines=self.env.settings.output_tail_lines,
                # One key per triage: a retried report task counts no second occurrence.
                key=f"{str(work.bundle_id)[:16]}:triage-{work.options.get('triage', work.id)}",
                occurrences=self._occurrences(work.case_id),
            )
            result.report = ref
            reply = work.options.get("reply_to")
            comment = None
            if isinstance(reply, dict) and self.env.commenter is not None:
                comment = self.env.commenter.comment(
                    str(reply["repository"]),
                    int(reply["issue"]),
                    render_comment(
                        result,
                        manifest,
                        quarantined=bool(result.polluters)
                        and quarantine.order_dependent
                        and self.env.sink is not None,
                    ),
                ).location
            with self.db.session() as session:
                data = result.to_json()
                _set_work(
                    session,
                    work_id,
                    status=WorkStatus.DONE.value,
                    result={**data, "comment": comment},
                    finished_at=utc_now(),
                    heartbeat_at=None,
                )
                case = session.get(Case, work.case_id) if work.case_id else None
                if case is not None:
                    case.evidence = data
                    case.status = CaseStatus.REPORTED.value
                    if ref is not None:
                        case.report_kind, case.report_url = ref.kind, ref.location
                    _follow(session, case)
            return ref.location if ref else "nothing to report"
        except FlaketriageError as exc:
            self._fail(work_id, exc)
            return "failed"

    # -- isolation reruns and telemetry -------------------------------------------------------
    def rerun(self, work_id: int) -> str:
        """Replay a quarantined failure in isolation; lift the quarantine when the sequential test
        says it no longer reproduces (never because of elapsed time alone)."""
        return self._serial(work_id, self._after_rerun, latest=True)

    def telemetry(self, work_id: int) -> str:
        """A telemetry run (`flaketriage.workers.telemetry`) of a failure that did not reproduce: a
        policy that looks for rarer flakes, a longer time limit, host and GPU samples and a
        profile, stored with the run; a failure it reproduces is reported with that evidence."""
        return self._serial(work_id, self._after_telemetry, telemetry=True)

    def _serial(
        self,
        work_id: int,
        after: Callable[[Session, Work, TriageResult, list[Outgoing | None]], str],
        *,
        telemetry: bool = False,
        latest: bool = False,
    ) -> str:
        if not claim(self.db, work_id):
            return "busy-or-done"
        try:
            work = self._work(work_id)
            store_url = str(work.store_url)
            manifest = load_manifest(self.env.store(store_url), str(work.bundle_id))
            settings, policy, timeout_s = self.env.settings, self.env.policy(), None
            if telemetry:
                policy = telemetry_policy(policy, settings.telemetry_replays_factor)
                base = manifest.command.timeout_s or settings.replay_timeout_s
                timeout_s = base * settings.telemetry_timeout_factor
            # Materialized afresh every time: a rerun asks about the code as it is now.
            with (
                self.env.fresh_replayer(store_url, manifest, latest=latest, timeout_s=timeout_s) as replayer,
                Heartbeat(self.db, work_id),
            ):
                if telemetry:
                    store = self.env.store(store_url, writable=True)
                    result = TelemetryRun(
                        store, replayer, policy, interval_s=settings.telemetry_interval_s
                    ).run()
                else:
                    verdict, findings = decide(replayer, policy, variant=rerun_order(work, manifest))
                    result = TriageResult(bundle_id=manifest.bundle_id, verdict=verdict, findings=findings)
            outgoing: list[Outgoing | None] = []
            with self.db.session() as session:
                row = session.get(Work, work_id)
                assert row is not None
                record_replay(session, self.env.identity, replays=result.verdict.replays)
                state = after(session, row, result, outgoing)
                row.status, row.finished_at, row.heartbeat_at = WorkStatus.DONE.value, utc_now(), None
                row.result = {**result.to_json(), "state": state}
            self.env.dispatcher.send(outgoing)
            return state
        except FlaketriageError as exc:
            self._fail(work_id, exc)
            return "failed"

    def _after_rerun(
        self, session: Session, work: Work, result: TriageResult, _: list[Outgoing | None]
    ) -> str:
        fingerprint = str(work.options.get("fingerprint"))
        row = session.get(QuarantineRow, fingerprint)
        if row is None:
            return "no longer quarantined"
        if result.verdict.verdict is Verdict.NOT_REPRODUCED:
            session.delete(row)
            case = session.get(Case, work.case_id) if work.case_id else None
            if case is not None:
                case.status, case.verdict = CaseStatus.FIXED.value, str(Verdict.NOT_REPRODUCED)
            if self.env.sink is not None:
                # Inside the transaction: when closing fails, the quarantine stays and the next
                # rerun lifts it again (closing a closed issue changes nothing).
                self.env.sink.close(fingerprint, render_lift(result))
            return "fixed: quarantine lifted"
        row.clean_reruns = 0
        return f"still {result.verdict.verdict}"

    def _after_telemetry(
        self, session: Session, work: Work, result: TriageResult, outgoing: list[Outgoing | None]
    ) -> str:
        case = session.get(Case, work.case_id) if work.case_id else None
        if case is not None and result.verdict.reproductions:
            case.verdict = str(result.verdict.verdict)
            case.status = CaseStatus.DECIDED.value
            case.evidence = result.to_json()
            # Reported like a triage's verdict, from this run's result (its telemetry included).
            _, sent = self.env.dispatcher.request(
                session,
                key=f"report:telemetry-{work.id}",
                step=Step.REPORT,
                queue=Queue.REPORT,
                case_id=work.case_id,
                bundle_id=work.bundle_id,
                store_url=work.store_url,
                options={"triage": work.id},
            )
            outgoing.append(sent)
        return f"{result.verdict.verdict} after {result.verdict.replays} replays"

    def _attribute(self, session: Session, work: Work, manifest: Manifest, result: TriageResult) -> None:
        """Compare reproductions across the runners the replays ran on (`flaketriage.workers.runners`):
        a failure that reproduces only on hardware like the original's (or only away from it) becomes
        ``environment_specific``, and the runners it reproduced on are counted as suspects."""
        if result.verdict.verdict not in (Verdict.FLAKY, Verdict.DETERMINISTIC, Verdict.NOT_REPRODUCED):
            return
        replays = ((r.runner, r.outcome) for r in work.replays)
        found = attribute_triage(session, manifest, replays, alpha=self.env.settings.alpha)
        if found is None:
            return
        result.attribution = found
        if found.specific:
            result.verdict = dataclasses.replace(result.verdict, verdict=Verdict.ENVIRONMENT_SPECIFIC)
            record_attribution(
                session,
                found,
                manifest,
                case_id=work.case_id,
                suspect_after=self.env.settings.runner_suspect_after,
            )

    # -- helpers ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _metered(self, replayer: Replayer, before: TriageCost | None) -> Iterator[CostMeter]:
        """Count `replayer`'s runs as minimization, on top of the triage's cost `before`, within
        the budget that is left; the replayer (kept for later replays) is unmetered after."""
        meter = CostMeter(self.env.settings.triage_budget_s, replayer.gpus)
        if before is not None:
            meter.cost = copy.deepcopy(before)
            meter.cost.budget_s = self.env.settings.triage_budget_s
        meter.phase, replayer.meter = "minimize", meter
        try:
            yield meter
        finally:
            replayer.meter = None

    def _cost(self, rows: Any, manifest: Manifest) -> TriageCost:
        """What the finished replays of a triage cost, against ``FLAKETRIAGE_TRIAGE_BUDGET_S``."""
        verdict = PhaseCost()
        for row in rows:
            if row.outcome is None or row.outcome == Outcome.ENVIRONMENT:
                continue  # still running, or nothing ran
            verdict.runs += 1
            verdict.cpu_s += row.cpu_s or 0.0
            verdict.gpu_s += row.gpu_s or 0.0
            verdict.wall_s += row.duration_s or 0.0
            verdict.unmeasured += row.cpu_s is None
        gpus = len(self.env.context.gpus().gpus) if manifest.hardware.gpus else 0
        return TriageCost(
            phases={**TriageCost().phases, "verdict": verdict},
            gpus=gpus,
            budget_s=self.env.settings.triage_budget_s,
        )

    def _occurrences(self, case_id: int | None) -> int | None:
        """The times the case was seen, which its issue says too (None: no case, as for a triage
        asked for by id alone)."""
        if case_id is None:
            return None
        with self.db.session() as session:
            case = session.get(Case, case_id)
            return case.occurrences if case is not None and case.occurrences > 0 else None

    def _work(self, work_id: int) -> Work:
        with self.db.session() as session:
            work = session.get(Work, work_id)
            if work is None:
                raise FlaketriageError(f"work {work_id} is not in the records")
            return work

    def _triage_result(self, work: Work) -> TriageResult:
        triage_id = work.options.get("triage")
        source = self._work(int(triage_id)) if triage_id is not None else work
        if not source.result:
            raise FlaketriageError(f"work {work.id} needs the verdict of triage {triage_id}, which has none")
        return TriageResult.from_json(source.result)

    def log_line(self, step: Step, work_id: int, outcome: str, replay: int | None = None) -> str:
        """The worker's log line of one step: its case, the step and what it came to, with the
        case's verdict once the step decided one."""
        with self.db.session() as session:
            work = session.get(Work, work_id)
            case = session.get(Case, work.case_id) if work is not None and work.case_id else None
            what = f"{step} {replay}" if replay is not None else str(step)
            line = f"case {case.id if case else '-'}: {what} (work {work_id}): {outcome}"
            decided = work is not None and work.status == WorkStatus.DONE.value and step is not Step.REPLAY
            if case is not None and decided and case.verdict:
                line += f"; verdict {case.verdict}"
            return line

    def _set_case(self, case_id: int | None, *, status: str, only_from: tuple[str, ...]) -> None:
        if case_id is None:
            return
        with self.db.session() as session:
            session.execute(
                update(Case)
                .where(Case.id == case_id, Case.status.in_(only_from))
                .values(status=status)
                .execution_options(synchronize_session=False)
            )

    def _fail(self, work_id: int, exc: BaseException) -> None:
        log.warning("work %s failed: %s", work_id, exc)
        release(self.db, work_id, WorkStatus.FAILED.value, error=str(exc)[:2000])
        with self.db.session() as session:
            work = session.get(Work, work_id)
            case = session.get(Case, work.case_id) if work is not None and work.case_id else None
            if case is not None:
                case.status, case.error = (
                    CaseStatus.FAILED.value,
                    f"{work.step if work else 'work'}: {exc}"[:2000],
                )


def _set_work(session: Session, work_id: int, **values: Any) -> None:
    session.execute(
        update(Work).where(Work.id == work_id).values(**values).execution_options(synchronize_session=False)
    )


def _replay_row(session: Session, work_id: int, index: int) -> ReplayRow | None:
    return session.scalars(
        select(ReplayRow).where(ReplayRow.work_id == work_id, ReplayRow.idx == index)
    ).first()


def _lock_work(session: Session, database: Database, work_id: int) -> Work | None:
    """The work row, locked until the transaction ends: replays of one triage finish one at a time,
    so exactly one of them sees that it was the last. (SQLite's BEGIN IMMEDIATE already locks.)"""
    query = select(Work).where(Work.id == work_id)
    if not database.is_sqlite:
        query = query.with_for_update()
    return session.scalars(query).first()


def _findings(rows: Any) -> list[Finding]:
    found: dict[str, Finding] = {}
    for row in rows:
        if row.outcome == Outcome.ENVIRONMENT and row.summary:
            key = "environment:" + hashlib.sha256(row.summary.encode("utf-8")).hexdigest()[:16]
            old = found.get(key)
            count = (old.count if old else 0) + 1
            found[key] = Finding(fingerprint=key, kind="environment", summary=row.summary[:1000], count=count)
        if row.outcome == Outcome.DIFFERENT and row.fingerprint:
            old = found.get(row.fingerprint)
            found[row.fingerprint] = Finding(
                fingerprint=row.fingerprint,
                kind="failure",
                summary=(row.summary or "")[:200],
                count=(old.count if old else 0) + 1,
            )
    return list(found.values())


def _hang(rows: Any) -> str | None:
    """Where the replays hung, from the rows' summaries: a reproduction's first, else any's."""
    hung = [r for r in rows if r.summary and r.outcome in (Outcome.REPRODUCED, Outcome.DIFFERENT)]
    hung = [r for r in hung if r.outcome == Outcome.REPRODUCED] or hung
    return hung[0].summary if hung and hung[0].fingerprint else None


def _follow(session: Session, leader: Case) -> None:
    """Cases that joined `leader`'s triage (one cause, other tests) take its verdict."""
    session.execute(
        update(Case)
        .where(Case.storm_of == leader.id)
        .values(
            status=leader.status,
            verdict=leader.verdict,
            report_kind=leader.report_kind,
            report_url=leader.report_url,
        )
        .execution_options(synchronize_session=False)
    )


def render_lift(result: TriageResult) -> str:
    """The comment that closes an issue when isolated reruns show the failure fixed."""
    v = result.verdict
    return (
        f"**Fixed**: the quarantine is lifted. Isolated reruns of the branch as it is now no longer "
        f"reproduce this failure: {evidence_line(v)}\n\n"
        f"Bundle `{result.bundle_id[:12]}`. flaketriage closes this issue; it is reopened if the "
        "failure comes back."
    )
