"""The chaos harness: the whole service under fire, shared by ``tests/reliability/test_chaos.py``
(small numbers, end states asserted) and ``bench/chaos.py`` (issue 23's numbers, figures printed).

Every part is a real process started here (`tests.reliability.chaos_stack`): the receiver, worker
processes and beat, a private ``redis-server``, ``moto_server`` holding the bundles (an ``s3://``
store), and a private PostgreSQL cluster. Failures are captured by the real ``flaketriage capture``
from small programs: half fail every time (deterministic, one issue each), half failed only at
capture (their marker file is gone by replay: not reproduced, no issue). Signed events for them
arrive while a schedule of faults runs: workers SIGKILLed (and started again), Redis restarted
empty (just after a sweep ran: the worst moment), PostgreSQL stopped ``-m immediate`` and started
again. A sender retries what was not accepted (a 503, a refused connection) with the same event,
as ``flaketriage notify`` does.

`ChaosReport` holds what the end shows: every event's case in a terminal state, one case per
fingerprint, one report per reproducible fingerprint, every bundle still whole in the store, and
the seconds from Redis coming back empty until every piece of work queued at that moment was sent
again or picked up (read from the work and replay rows' ``sent_at`` and state).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from flaketriage.work.messages import SWEEP_TASK
from tests.conftest import wait_for
from tests.e2e.service.conftest import WEBHOOK_SECRET, Stack
from tests.reliability.chaos_stack import PrivatePostgres, chaos_stack

TERMINAL = ("reported", "fixed", "failed")
"""Case states no more work follows (``failed`` is terminal too, and counted as a miss)."""

SWEEP_SENT = "Sending due task sweep"
"""Beat's log line when it sends a sweep."""
SWEEP_DONE = "] succeeded in "
"""How a worker's log says it finished a task; counted on the lines of sweeps (`SWEEP_TASK`)."""

DETERMINISTIC = "def fails_{tag}():\n    raise ZeroDivisionError('boom {tag}')\n\n\nfails_{tag}()\n"
ONCE = (
    "import os\n\n\ndef once_{tag}():\n    if os.path.exists({marker!r}):\n"
    "        raise KeyError('once {tag}')\n\n\nonce_{tag}()\n"
)
POLICY = {
    # Few replays per verdict: 5 reproductions in a row say deterministic, 9 clean ones not reproduced.
    "FLAKETRIAGE_MIN_FLAKY_RATE": "0.3",
    "FLAKETRIAGE_FLAKY_RATE_REPLAYS": "0",
    "FLAKETRIAGE_MAX_REPLAYS": "20",
    "FLAKETRIAGE_REPLAY_TIMEOUT_S": "20",
    "FLAKETRIAGE_REPLAY_BATCH": "6",
}


@dataclass(frozen=True)
class ChaosPlan:
    """How much load and which faults, at what second after the first event is sent."""

    failures: int
    events_per_failure: int
    send_seconds: float
    """The events are spread evenly over this long."""
    worker_kills: tuple[float, ...]
    redis_restart_at: float
    database_restart_at: float
    database_down_s: float = 4.0
    workers: int = 3
    settings: dict[str, str] = field(default_factory=dict)
    """Service settings on top of `POLICY` (sweep cadence, visibility timeout)."""
    drain_timeout_s: float = 600.0
    seed: int = 23


@dataclass
class ChaosReport:
    events: int = 0
    accepted: int = 0
    terminal: int = 0
    failed_cases: list[str] = field(default_factory=list)
    cases_per_fingerprint: dict[str, int] = field(default_factory=dict)
    reports_per_fingerprint: dict[str, int] = field(default_factory=dict)
    """Report steps done per fingerprint (a report written twice counts 2)."""
    issues: set[str] = field(default_factory=set)
    """Fingerprints with a Markdown issue."""
    reproducible: set[str] = field(default_factory=set)
    lost_bundles: list[str] = field(default_factory=list)
    queued_at_restart: int = 0
    after_tick_s: float | None = None
    """How long after beat sent the last sweep before the restart that sweep had run (and Redis
    restarted): the next sweep was due one beat interval minus this after the restart."""
    resent_after_s: float | None = None
    """Seconds from Redis back empty until all work queued then was sent again or picked up."""
    faults: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def terminal_share(self) -> float:
        return self.terminal / self.events if self.events else 0.0

    @property
    def one_case_each(self) -> bool:
        return bool(self.cases_per_fingerprint) and set(self.cases_per_fingerprint.values()) == {1}

    @property
    def one_report_each(self) -> bool:
        """One report step and one issue per reproducible fingerprint; no issue for the others."""
        return all(self.reports_per_fingerprint.get(f) == 1 for f in self.reproducible) and self.issues == (
            self.reproducible
        )


# -- failures and events ---------------------------------------------------------------------------
@dataclass(frozen=True)
class CapturedFailure:
    bundle: str
    fingerprint: str
    reproducible: bool
    event: dict[str, Any]
    """The bundle's event, as ``flaketriage notify`` would send it (`FailureEvent` fields)."""


def capture_failures(stack: Stack, count: int) -> list[CapturedFailure]:
    """`count` failures captured by ``flaketriage capture`` into the stack's store; even ones
    deterministic, odd ones failing only while their marker file exists (removed after capture)."""
    from flaketriage.bundle.io import load_manifest
    from flaketriage.events import FailureEvent, StoreLocation
    from flaketriage.settings import load_settings
    from flaketriage.store import open_store

    store_url = stack.env["FLAKETRIAGE_STORE"]
    failures = []
    with _environment(stack.env):
        store = open_store(store_url, readonly=True, settings=load_settings())
        for n in range(count):
            tag = "".join(chr(ord("a") + int(c, 16) % 26) for c in uuid.uuid4().hex[:12])
            marker = stack.root / "markers" / tag
            reproducible = n % 2 == 0
            source = (
                DETERMINISTIC.format(tag=tag) if reproducible else ONCE.format(tag=tag, marker=str(marker))
            )
            marker.parent.mkdir(exist_ok=True)
            marker.touch()
            bundle = stack.capture(source, f"job_{tag}.py")
            marker.unlink()
            manifest = load_manifest(store, bundle)
            event = FailureEvent.for_manifest(manifest, StoreLocation.parse(store_url))
            failures.append(
                CapturedFailure(
                    bundle, manifest.failure.fingerprint, reproducible, event.model_dump(mode="json")
                )
            )
    return failures


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """This process's environment as the stack's (boto3 reads its credentials there)."""
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in env.items() if k.startswith(("AWS_", "FLAKETRIAGE_S3"))})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class EventSender:
    """Sends signed events and retries each (same event id) until the receiver accepts it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.status: Counter[int] = Counter()
        self.accepted: list[str] = []
        self._lock = threading.Lock()

    def send(self, event: dict[str, Any], deadline: float) -> None:
        from flaketriage.events import FailureEvent
        from flaketriage.signing import signed_headers

        body = FailureEvent.model_validate(event).body()
        with httpx.Client(timeout=30) as client:
            while time.monotonic() < deadline:
                headers = {
                    "Content-Type": "application/json",
                    **signed_headers(WEBHOOK_SECRET.encode(), body),
                }
                try:
                    code = client.post(f"{self.url}/v1/events", content=body, headers=headers).status_code
                except httpx.HTTPError:
                    code = 0
                with self._lock:
                    self.status[code] += 1
                    if code in (200, 202):
                        self.accepted.append(event["event_id"])
                        return
                time.sleep(0.5)


# -- the faults ------------------------------------------------------------------------------------
@dataclass
class Faults:
    """Runs the plan's faults at their times in a thread; measures the broker restart's resend."""

    stack: Stack
    pg: PrivatePostgres
    plan: ChaosPlan
    report: ChaosReport
    errors: list[BaseException] = field(default_factory=list)

    def run(self, started: float) -> threading.Thread:
        thread = threading.Thread(target=self._guarded, args=(started,), daemon=True)
        thread.start()
        return thread

    def _guarded(self, started: float) -> None:
        try:
            self._schedule(started)
        except BaseException as exc:  # re-raised by the caller: a fault that did not happen is a miss
            self.errors.append(exc)

    def _schedule(self, started: float) -> None:
        rng = random.Random(self.plan.seed)
        actions = [(t, "kill") for t in self.plan.worker_kills]
        actions += [(self.plan.redis_restart_at, "redis"), (self.plan.database_restart_at, "database")]
        for at, action in sorted(actions):
            time.sleep(max(0.0, started + at - time.monotonic()))
            if action == "kill":
                index = rng.randrange(len(self.stack.workers))
                self.stack.kill_worker(index)
                self.stack.start_worker(index)
                self.report.faults.append(f"{time.monotonic() - started:.0f}s: worker {index} SIGKILLed")
            elif action == "redis":
                self._after_a_sweep()
                self.stack.redis.restart()
                restarted = datetime.now(UTC)
                self.report.faults.append(f"{time.monotonic() - started:.0f}s: Redis restarted empty")
                self._measure_resend(restarted)
            else:
                self.pg.stop("immediate")
                time.sleep(self.plan.database_down_s)
                self.pg.start()
                self.report.faults.append(
                    f"{time.monotonic() - started:.0f}s: PostgreSQL stopped (immediate) "
                    f"{self.plan.database_down_s:.0f} s and started"
                )

    def _after_a_sweep(self) -> None:
        """Return as soon as a sweep beat sent has run: the next is nearly a whole beat interval away
        (60 s by default), so the broker restart that follows waits about the longest for it. How
        long after beat sent it (the sweep may wait behind busy workers) is `ChaosReport.after_tick_s`."""
        beat = self.stack.root / "beat.log"
        workers = sorted(self.stack.root.glob("worker*.log"))
        sent = _count(beat, SWEEP_SENT)
        wait_for(lambda: _count(beat, SWEEP_SENT) > sent, 120, "beat to send a sweep", every=0.1)
        tick, done = time.monotonic(), _count_all(workers, SWEEP_DONE)
        wait_for(lambda: _count_all(workers, SWEEP_DONE) > done, 120, "the sweep to run", every=0.1)
        self.report.after_tick_s = time.monotonic() - tick

    def _measure_resend(self, restarted: datetime) -> None:
        """Until every work row and replay queued at `restarted` is sent again (``sent_at`` after it)
        or taken up (its state moved on)."""
        import psycopg

        url = self.stack.env["FLAKETRIAGE_DATABASE_URL"]
        with psycopg.connect(url, autocommit=True) as conn:
            works = {r[0] for r in conn.execute("SELECT id FROM work WHERE status = 'queued'")}
            replays = {
                r[0]
                for r in conn.execute(
                    "SELECT r.id FROM replays r JOIN work w ON w.id = r.work_id"
                    " WHERE r.outcome IS NULL AND w.status <> 'done'"
                )
            }
            self.report.queued_at_restart = len(works) + len(replays)
            deadline = time.monotonic() + 300
            while (works or replays) and time.monotonic() < deadline:
                time.sleep(0.25)
                if works:
                    works -= {
                        r[0]
                        for r in conn.execute(
                            "SELECT id FROM work WHERE id = ANY(%s) AND (status <> 'queued' OR sent_at > %s)",
                            (list(works), restarted),
                        )
                    }
                if replays:
                    replays -= {
                        r[0]
                        for r in conn.execute(
                            "SELECT id FROM replays WHERE id = ANY(%s)"
                            " AND (outcome IS NOT NULL OR sent_at > %s)",
                            (list(replays), restarted),
                        )
                    }
        if not works and not replays:
            self.report.resent_after_s = (datetime.now(UTC) - restarted).total_seconds()


def _count(log: Path, text: str) -> int:
    """Lines of `log` with `text` (of a sweep's, for `SWEEP_DONE`)."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return sum(1 for line in lines if text in line and (text != SWEEP_DONE or SWEEP_TASK in line))


def _count_all(logs: list[Path], text: str) -> int:
    return sum(_count(log, text) for log in logs)


# -- the run ---------------------------------------------------------------------------------------
def run_chaos(plan: ChaosPlan, root: Path, log: Any = print) -> ChaosReport:
    """Capture the failures, send their events under the plan's faults, wait for the work to end,
    and say what the end shows."""
    report = ChaosReport()
    began = time.monotonic()
    with chaos_stack(root, workers=plan.workers, settings={**POLICY, **plan.settings}) as (stack, pg, _):
        log(f"stack up: receiver, {plan.workers} workers, beat, Redis, PostgreSQL :{pg.port}, moto_server")
        failures = capture_failures(stack, plan.failures)
        log(f"captured {len(failures)} failures into {stack.env['FLAKETRIAGE_STORE']}")
        from flaketriage.events import FailureEvent

        events = [
            FailureEvent.model_validate({**f.event, "event_id": uuid.uuid4().hex}).model_dump(mode="json")
            for f in failures
            for _ in range(plan.events_per_failure)
        ]
        random.Random(plan.seed).shuffle(events)
        report.events = len(events)
        sender = EventSender(stack.url)
        faults = Faults(stack, pg, plan, report)
        started = time.monotonic()
        fault_thread = faults.run(started)
        send_deadline = started + plan.send_seconds + plan.drain_timeout_s
        threads = []
        for n, event in enumerate(events):
            time.sleep(max(0.0, started + n * plan.send_seconds / len(events) - time.monotonic()))
            thread = threading.Thread(target=sender.send, args=(event, send_deadline), daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
        fault_thread.join()
        if faults.errors:
            raise faults.errors[0]
        report.accepted = len(set(sender.accepted))
        log(f"sent {report.events} events, {report.accepted} accepted; answers {dict(sender.status)}")
        _wait_drained(stack, plan.drain_timeout_s)
        _read_end(stack, failures, sorted(set(sender.accepted)), report)
    report.seconds = time.monotonic() - began
    return report


def _wait_drained(stack: Stack, timeout: float) -> None:
    """Until every case is terminal and no work is queued or running (or `timeout` passes)."""
    import psycopg

    url = stack.env["FLAKETRIAGE_DATABASE_URL"]

    def drained() -> bool:
        with psycopg.connect(url, autocommit=True) as conn:
            open_cases = conn.execute("SELECT count(*) FROM cases WHERE status <> ALL(%s)", (list(TERMINAL),))
            busy = conn.execute("SELECT count(*) FROM work WHERE status NOT IN ('done', 'failed')")
            return open_cases.fetchone()[0] == 0 and busy.fetchone()[0] == 0  # type: ignore[index]

    with contextlib.suppress(AssertionError):  # what is left open is counted by the report
        wait_for(drained, timeout, "every case terminal and no work left", every=1.0)


def _read_end(
    stack: Stack, failures: list[CapturedFailure], accepted: list[str], report: ChaosReport
) -> None:
    """Fill `report` from the records, the issues directory and the store."""
    import psycopg

    from flaketriage.settings import load_settings
    from flaketriage.store import open_store

    with psycopg.connect(stack.env["FLAKETRIAGE_DATABASE_URL"], autocommit=True) as conn:
        cases = conn.execute("SELECT fingerprint, status FROM cases").fetchall()
        per_event = conn.execute(
            "SELECT c.status FROM occurrences o JOIN cases c ON c.id = o.case_id"
            " WHERE o.delivery_id = ANY(%s)",
            (accepted,),
        ).fetchall()
        reports = conn.execute(
            "SELECT c.fingerprint, count(*) FROM work w JOIN cases c ON c.id = w.case_id"
            " WHERE w.step = 'report' AND w.status = 'done' GROUP BY c.fingerprint"
        ).fetchall()
    report.terminal = sum(1 for (status,) in per_event if status in TERMINAL and status != "failed")
    report.failed_cases = [f for f, status in cases if status == "failed"]
    report.cases_per_fingerprint = {f.fingerprint: 0 for f in failures}
    for fingerprint, _ in cases:
        report.cases_per_fingerprint[fingerprint] = report.cases_per_fingerprint.get(fingerprint, 0) + 1
    report.reports_per_fingerprint = dict(reports)
    report.reproducible = {f.fingerprint for f in failures if f.reproducible}
    issues_dir = stack.root / "issues"
    report.issues = {f.fingerprint for f in failures if (issues_dir / f"{f.fingerprint[:16]}.md").is_file()}
    with _environment(stack.env):
        store = open_store(stack.env["FLAKETRIAGE_STORE"], readonly=True, settings=load_settings())
        report.lost_bundles = [f.bundle for f in failures if not _whole(store, f.bundle)]


def _whole(store: Any, bundle: str) -> bool:
    """Whether `bundle` is in `store` with every object it names, each re-hashed."""
    from flaketriage.bundle.io import verify_bundle
    from flaketriage.errors import FlaketriageError

    try:
        return verify_bundle(store, bundle).ok
    except FlaketriageError:  # no such bundle
        return False


def describe(report: ChaosReport) -> str:
    """The faults and the end state, for a failed assertion or the bench's log."""
    end = {
        "terminal": f"{report.terminal}/{report.events}",
        "accepted": report.accepted,
        "failed cases": report.failed_cases,
        "cases per fingerprint": sorted(Counter(report.cases_per_fingerprint.values()).items()),
        "reports per reproducible fingerprint": sorted(
            Counter(report.reports_per_fingerprint.get(f, 0) for f in report.reproducible).items()
        ),
        "issues": len(report.issues),
        "reproducible without an issue": len(report.reproducible - report.issues),
        "issues not reproducible": len(report.issues - report.reproducible),
        "lost bundles": report.lost_bundles,
        "queued at the broker restart": report.queued_at_restart,
        "restart after beat's last sweep s": report.after_tick_s,
        "resent after s": report.resent_after_s,
    }
    return "\n".join([*report.faults, json.dumps(end, default=str)])
