"""Benchmark: the service under fire (issue 23). 500 signed events from 50 captured failures go
through the receiver, Redis, PostgreSQL, moto_server (the ``s3://`` store), three worker processes
and beat, while five workers are SIGKILLed (a random one each time, started again), Redis restarts
empty once and PostgreSQL is stopped ``-m immediate`` and started again once.

Run from the repository root: ``python bench/chaos.py`` (``--quick``: 20 failures, 200 events, the
same faults). Needs ``redis-server``, ``runuser`` and PostgreSQL's binaries (``FLAKETRIAGE_PG_BIN``,
default ``/usr/lib/postgresql/15/bin``): the harness runs a private cluster so that restarting it
touches nobody else's. The harness is ``tests/reliability/chaos_harness.py``, which the slow test
``tests/reliability/test_chaos.py`` runs with smaller numbers.

The sweep runs at its default cadence (``FLAKETRIAGE_SWEEP_AFTER_S`` unset: every 60 s), and Redis
is restarted just after a sweep finished, so the next is a whole interval away: what sends the lost
work again sooner is beat's broker check (every 10 s), whatever the moment of the restart. The
Redis visibility timeout is 30 s (default: an hour) so that a killed worker's task comes back within
the run; the policy decides in 5 to 9 replays. Goals: every event's case terminal (none failed),
exactly one case per fingerprint, exactly one report per reproducible fingerprint (and an issue for
each, none for the others), no bundle lost or damaged, and the work queued when Redis came back
empty sent again within 60 s. Exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import check
from service_stack import require_tools

from tests.reliability.chaos_harness import ChaosPlan, ChaosReport, describe, run_chaos

GOAL_RESENT_S = 60.0
BEAT_INTERVAL_S = 60.0
"""Beat's sweep interval with the default ``FLAKETRIAGE_SWEEP_AFTER_S`` (300 s: half of it, at most 60)."""


def plan(quick: bool) -> ChaosPlan:
    failures = 20 if quick else 50
    return ChaosPlan(
        failures=failures,
        events_per_failure=10,
        send_seconds=30 if quick else 60,
        worker_kills=(5.0, 12.0, 25.0, 35.0, 45.0) if quick else (8.0, 15.0, 40.0, 52.0, 65.0),
        # PostgreSQL while events still arrive; Redis after, at the first sweep's end past 30 s
        # (up to a minute later), so that waiting for it delays no other fault.
        database_restart_at=8.0 if quick else 20.0,
        redis_restart_at=18.0 if quick else 30.0,
        database_down_s=5.0,
        workers=3,
        settings={"FLAKETRIAGE_BROKER_VISIBILITY_TIMEOUT_S": "30"},
        drain_timeout_s=900,
    )


def report(result: ChaosReport) -> int:
    print(describe(result))
    reproducible = len(result.reproducible)
    reported_once = sum(1 for f in result.reproducible if result.reports_per_fingerprint.get(f) == 1)
    cases = sorted(set(result.cases_per_fingerprint.values()))
    resent = result.resent_after_s
    print(
        f"chaos: {result.events} events from {len(result.cases_per_fingerprint)} failures, "
        f"{result.seconds:.0f} s in all"
    )
    if result.after_tick_s is not None:
        print(
            f"  Redis restarted {result.after_tick_s:.1f} s after beat sent a sweep (that sweep had run): "
            f"the next was due {BEAT_INTERVAL_S - result.after_tick_s:.1f} s after the restart"
        )
    checks = [
        check(
            "events terminal",
            f"{100 * result.terminal_share:.1f}% ({result.terminal}/{result.events}, "
            f"{len(result.failed_cases)} cases failed)",
            ">=",
            "100%",
            result.terminal == result.events and not result.failed_cases,
        ),
        check("cases per fingerprint", f"{cases}", "==", "[1]", result.one_case_each),
        check(
            "reproducible fingerprints reported exactly once",
            f"{reported_once}/{reproducible} (issues {len(result.issues)})",
            "==",
            f"{reproducible}/{reproducible}",
            result.one_report_each and reproducible > 0,
        ),
        check("lost bundles", str(len(result.lost_bundles)), "==", "0", not result.lost_bundles),
        check(
            f"broker restart to lost work sent again ({result.queued_at_restart} queued then)",
            "never" if resent is None else f"{resent:.1f} s",
            "<",
            f"{GOAL_RESENT_S:.0f} s",
            resent is not None and resent < GOAL_RESENT_S and result.queued_at_restart > 0,
        ),
    ]
    return 0 if all(checks) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="20 failures and 200 events instead of 50 and 500"
    )
    args = parser.parse_args()
    require_tools("redis-server", "runuser")
    root = Path(tempfile.mkdtemp(prefix="flaketriage-chaos-"))
    try:
        result = run_chaos(plan(args.quick), root, log=lambda line: print(line, flush=True))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report(result)


if __name__ == "__main__":
    sys.exit(main())
