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
import logging
import time
from collections.abc import Callable, Iterator

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from flaketriage.bundle.io import load_manifest
from flaketriage.bundle.manifest import Manifest
from flaketriage.errors import FlaketriageError
from flaketriage.quarantine import EntryScope
from flaketriage.records import Case, Database, QuarantineRow, ReplayRow, Work, WorkStatus
from flaketriage.records.models import CheckRunRow, utc_now
from flaketriage.records.transitions import (
    case_decided,
    case_failed,
    case_fixed,
    case_reported,
    case_triaging,
    work_done,
    work_queued,
    work_row_done,
    work_waiting,
)
from flaketriage.work.case_requests import refresh_checks
from flaketriage.work.dispatch import Outgoing
from flaketriage.work.messages import Queue, Step, WorkOrder, task_name
from flaketriage.workers.check_runs import publish as publish_check
from flaketriage.workers.cost import CostMeter, TriageCost
from flaketriage.workers.evidence import cost_of, findings_of, hang_of
from flaketriage.workers.gpus import gpu_difference
from flaketriage.workers.history import HistoryReader
from flaketriage.workers.leases import Heartbeat, claim, release
from flaketriage.workers.minimize.minimizer import BundleMinimizer, MinimizeResult
from flaketriage.workers.polluters import OrderTarget
from flaketriage.workers.progress import TriageProgress, replay_summary
from flaketriage.workers.quarantine.records import RecordsQuarantine
from flaketriage.workers.replay import Replayer, Variant
from flaketriage.workers.report.render import render_comment, render_lift, render_resolved
from flaketriage.workers.runners import attribute_triage, record_attribution, record_replay
from flaketriage.workers.runtime import WorkerEnv, replay_queue
from flaketriage.workers.telemetry import TelemetryRun, telemetry_policy
from flaketriage.workers.triage import TriageResult, decide, drawn_seed_argv, report, should_minimize, triage
from flaketriage.workers.verdict import Outcome, SequentialTest, Verdict

log = logging.getLogger("flaketriage.workers")


def rerun_order(work: Work, manifest: Manifest) -> Variant | None:
    """The order an isolation rerun replays an order-dependent test in (`Upkeep.schedule_reruns`):
    after the polluters its triage found, as it failed; None for a rerun of the captured run."""
    polluters = work.options.get("polluters") if work.options.get("order") == "after" else None
    target = OrderTarget.of(manifest) if polluters else None
    if target is None or not isinstance(polluters, list):
        return None
    return target.variant_with([str(t) for t in polluters])


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
                work_queued(session, work_id, queue=queue.value)
            self.env.dispatcher.send([Outgoing(task_name(Step.TRIAGE), WorkOrder(work_id=work_id), queue)])
            return f"moved to the {queue.value} queue"
        with self.db.session() as session:
            case_triaging(session, work.case_id)
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
            cost = cost_of(
                rows,
                gpus=len(self.env.context.gpus().gpus) if manifest.hardware.gpus else 0,
                budget_s=self.env.settings.triage_budget_s,
            )
            # Spent before the test decided: the triage ends undecided here, with the counts so far.
            spent = not test.done and not pending and cost.over_budget()
            if test.done or spent:
                cost.budget_spent = spent
                result = TriageResult(
                    bundle_id=manifest.bundle_id,
                    verdict=test.result(),
                    findings=findings_of(rows),
                    hang=hang_of(rows),
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
                work_waiting(session, work_id)
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
                work_waiting(session, work_id)
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
        work_row_done(work, result=data)
        case = session.get(Case, work.case_id) if work.case_id else None
        guess = result.budget_spent and not result.verdict.decided  # the budget stopped it: no verdict
        if case is not None:
            case_decided(case, verdict=None if guess else str(result.verdict.verdict), evidence=data)
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
                work_done(
                    session,
                    work_id,
                    result={
                        "minimized": minimized.to_json() if minimized else None,
                        "error": error,
                        "cost": meter.cost.to_json(),  # the triage's with minimization's
                    },
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
                self.db,
                work.case_id,
                order_dependent=self.env.settings.quarantine_order_dependent,
                scope=EntryScope.from_settings(self.env.settings),
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
            outgoing: list[Outgoing | None] = []
            with self.db.session() as session:
                data = result.to_json()
                work_done(session, work_id, result={**data, "comment": comment})
                case = session.get(Case, work.case_id) if work.case_id else None
                if case is not None:
                    report_ref = (ref.kind, ref.location) if ref is not None else None
                    case_reported(session, case, evidence=data, report=report_ref)
                    # The pull requests its test failed in hear the verdict: their check runs are
                    # updated in place.
                    outgoing += refresh_checks(session, self.env.dispatcher, case, why=f"report-{work_id}")
            self.env.dispatcher.send(outgoing)
            return ref.location if ref else "nothing to report"
        except FlaketriageError as exc:
            self._fail(work_id, exc)
            return "failed"

    # -- CI history ----------------------------------------------------------------------------
    def history(self, work_id: int) -> str:
        """Read an upload of CI results (`flaketriage.workers.history`): tests suspected flaky,
        deterministic cases fixed on their branch, and the pull request's check run."""
        if not claim(self.db, work_id):
            return "busy-or-done"
        try:
            with self.db.session() as session:
                work = session.get(Work, work_id)
                assert work is not None
                reader = HistoryReader(session, self.env.dispatcher, self.env.settings, self.env.policy())
                findings = reader.read(int(work.options.get("upload", 0)))
                for case_id in findings.resolved:
                    case = session.get(Case, case_id)
                    if case is not None and self.env.sink is not None:
                        # Inside the transaction, as a lift is: should closing fail, the next run
                        # that passes resolves it again (closing a closed issue changes nothing).
                        self.env.sink.close(
                            case.fingerprint,
                            render_resolved(
                                str(case.test_id), str(findings.branch), findings.passes[case_id]
                            ),
                        )
                work_row_done(work, result=findings.to_json())
            self.env.dispatcher.send(reader.outgoing)
            return findings.summary()
        except FlaketriageError as exc:
            self._fail(work_id, exc)
            return "failed"

    def check(self, work_id: int) -> str:
        """Publish a commit's pull request check run, or update it in place
        (`flaketriage.workers.check_runs`)."""
        if not claim(self.db, work_id):
            return "busy-or-done"
        try:
            with self.db.session() as session:
                work = session.get(Work, work_id)
                assert work is not None
                # Held while it is published: two publishes of one commit's run never race.
                row = session.get(CheckRunRow, int(work.options.get("check_run", 0)), with_for_update=True)
                if row is None:
                    state = "no such check run"
                else:
                    state = publish_check(session, row, self.env.checks(), self.env.settings)
                work_row_done(work, result={"state": state})
            return state
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
                work_row_done(row, result={**result.to_json(), "state": state})
            self.env.dispatcher.send(outgoing)
            return state
        except FlaketriageError as exc:
            self._fail(work_id, exc)
            return "failed"

    def _after_rerun(
        self, session: Session, work: Work, result: TriageResult, outgoing: list[Outgoing | None]
    ) -> str:
        fingerprint = str(work.options.get("fingerprint"))
        row = session.get(QuarantineRow, fingerprint)
        if row is None:
            return "no longer quarantined"
        if result.verdict.verdict is Verdict.NOT_REPRODUCED:
            session.delete(row)
            case = session.get(Case, work.case_id) if work.case_id else None
            if case is not None:
                case_fixed(case, verdict=str(Verdict.NOT_REPRODUCED))
            if self.env.sink is not None:
                # Inside the transaction: when closing fails, the quarantine stays and the next
                # rerun lifts it again (closing a closed issue changes nothing).
                self.env.sink.close(fingerprint, render_lift(result))
            if case is not None:
                outgoing += refresh_checks(session, self.env.dispatcher, case, why=f"rerun-{work.id}")
            return "fixed: quarantine lifted"
        row.clean_reruns = 0
        return f"still {result.verdict.verdict}"

    def _after_telemetry(
        self, session: Session, work: Work, result: TriageResult, outgoing: list[Outgoing | None]
    ) -> str:
        case = session.get(Case, work.case_id) if work.case_id else None
        if case is not None and result.verdict.reproductions:
            case_decided(case, verdict=str(result.verdict.verdict), evidence=result.to_json())
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

    def _fail(self, work_id: int, exc: BaseException) -> None:
        log.warning("work %s failed: %s", work_id, exc)
        release(self.db, work_id, WorkStatus.FAILED.value, error=str(exc)[:2000])
        with self.db.session() as session:
            work = session.get(Work, work_id)
            case = session.get(Case, work.case_id) if work is not None and work.case_id else None
            if case is not None:
                case_failed(case, error=f"{work.step if work else 'work'}: {exc}"[:2000])


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
