"""A Redis broker that restarts empty, with the default sweep cadence (a sweep a minute): beat asks
every 10 s whether the broker lost its messages, so lost work is sent again well within the minute,
whenever in the sweep's period the restart falls."""

from __future__ import annotations

import time

import pytest

from flaketriage.workers.celery_app import BROKER_CHECK_EVERY_S

from .conftest import Stack, wait_for
from .test_service import DETERMINISTIC, _event_body, _post_event, tag

pytestmark = pytest.mark.slow

STACK_SETTINGS = {"FLAKETRIAGE_SWEEP_AFTER_S": "300"}  # the default: beat sweeps once a minute
SWEEP_EVERY_S = 60.0


def test_work_a_restarted_broker_lost_is_sent_again_before_the_next_sweep(stack: Stack) -> None:
    bundle = stack.capture(DETERMINISTIC.format(tag=tag()))
    with stack.workers_down():  # the task is in the broker alone ...
        assert _post_event(stack, _event_body(stack, bundle)).status_code == 202
        stack.redis.restart()  # ... and the broker forgets it
        restarted = time.monotonic()

    def taken() -> bool:
        case = stack.case_for(bundle)
        return case is not None and case["status"] != "queued"

    # Beat started moments before this test, so its first sweep is a minute away: only the broker
    # check (every 10 s) can send the work this soon. Half the sweep's period leaves room for load.
    wait_for(taken, SWEEP_EVERY_S / 2, "the lost work to be sent again and taken")
    assert time.monotonic() - restarted < SWEEP_EVERY_S / 2
    assert BROKER_CHECK_EVERY_S < SWEEP_EVERY_S / 2
    assert stack.wait_case(bundle, timeout=180)["verdict"] == "deterministic"
