"""The service under fire, in small: 64 signed events from 8 captured failures (4 deterministic,
4 that pass on replay) through the receiver, Redis, PostgreSQL, moto_server (the bundles' ``s3://``
store), three workers and beat, while two workers are SIGKILLed, Redis restarts empty and PostgreSQL
is stopped (``pg_ctl stop -m immediate``, a private cluster: the machine's server is shared) and
started again. ``bench/chaos.py`` runs the same harness with issue 23's numbers.

Only end states are asserted, never timings: every event accepted and its case terminal, one case
per fingerprint, one report (and one issue) per reproducible fingerprint and none for the others,
every bundle whole in the store, and the work queued at the broker's restart sent again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.reliability.chaos_harness import ChaosPlan, describe, run_chaos
from tests.reliability.chaos_stack import PG_BIN

pytestmark = pytest.mark.slow

PLAN = ChaosPlan(
    failures=8,
    events_per_failure=8,
    send_seconds=20,
    worker_kills=(3.0, 12.0),
    redis_restart_at=6.0,
    database_restart_at=16.0,
    database_down_s=4.0,
    # The e2e stack's quick sweeps: lost work is sent again within seconds, not minutes.
    settings={"FLAKETRIAGE_SWEEP_AFTER_S": "4", "FLAKETRIAGE_BROKER_VISIBILITY_TIMEOUT_S": "10"},
    drain_timeout_s=240,
)


def test_the_service_loses_nothing_under_kills_and_restarts(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: run the tests through tests/run.sh")
    if not (PG_BIN / "initdb").exists():
        pytest.fail(f"PostgreSQL's initdb is not in {PG_BIN}: set FLAKETRIAGE_PG_BIN to its directory")
    report = run_chaos(PLAN, tmp_path, log=lambda line: None)
    summary = describe(report)
    assert len(report.faults) == 4, summary
    assert report.accepted == report.events == 64, summary
    assert report.terminal == report.events and not report.failed_cases, summary
    assert report.one_case_each and len(report.cases_per_fingerprint) == 8, summary
    assert len(report.reproducible) == 4 and report.one_report_each, summary
    assert report.lost_bundles == [], summary
    assert report.resent_after_s is not None, summary
