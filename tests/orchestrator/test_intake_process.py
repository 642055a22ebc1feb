"""The intake process: on PostgreSQL the receiver's deliveries are recorded by a child process of its
own and answered on the event loop. What one turn of the loop sends is one batch; a child that dies
fails what it held with a clear error and the next delivery starts another; closing drains it; it
never outlives the receiver; the database or the broker down is heard as in the receiver itself."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis as redis_client
from sqlalchemy import select

from flaketriage.errors import BrokerError, RecordsDataError, RecordsError
from flaketriage.orchestrator.intake import IntakeOutcome, IntakeResult, Sighting
from flaketriage.orchestrator.intake_process import IntakeProcess
from flaketriage.orchestrator.intake_queue import IntakeQueue
from flaketriage.orchestrator.service import build_service
from flaketriage.records import Case, Database, Delivery, Work, WorkStatus
from flaketriage.settings import Settings, load_settings
from tests.conftest import Redis, free_port, wait_for
from tests.orchestrator.recorders import count_rows, numbered_sighting, record_each_twice_at_once


def _sighting(n: int, title: str | None = None) -> Sighting:
    return numbered_sighting(n, title=title or f"failure {n}", provenance={"n": n})


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")  # a zombie has ended; only its parent's wait is missing


@pytest.fixture
def settings(postgres_database: Database, postgres_url: str, redis: Redis, tmp_path: Path) -> Settings:
    redis_client.Redis.from_url(redis.url).flushdb()
    return load_settings(store=str(tmp_path / "store"), database_url=postgres_url, broker_url=redis.url)


def _fan_outs(redis: Redis, queue: str = "report") -> list[list[int]]:
    """The work ids of each fan-out message waiting in `queue`."""
    messages = redis_client.Redis.from_url(redis.url).lrange(queue, 0, -1)
    out = []
    for raw in messages:
        _, kwargs, _ = json.loads(base64.b64decode(json.loads(raw)["body"]))
        out.append([task["order"]["work_id"] for task in kwargs["batch"]["tasks"]])
    return out


def test_the_receiver_records_through_a_child_on_postgresql_and_in_threads_on_sqlite(
    settings: Settings, tmp_path: Path
) -> None:
    service = build_service(settings)
    try:
        assert isinstance(service.intake_queue, IntakeProcess)
        assert service.intake_queue.pid is not None  # started before the first request
    finally:
        service.close()
    local = build_service(
        load_settings(store=str(tmp_path / "store"), database_url=f"sqlite:///{tmp_path}/s.db")
    )
    try:
        assert isinstance(local.intake_queue, IntakeQueue)
    finally:
        local.close()


def test_one_turn_of_the_loop_is_one_batch_recorded_once_and_one_broker_message(
    settings: Settings, postgres_database: Database, redis: Redis
) -> None:
    results = record_each_twice_at_once(IntakeProcess(settings), 100)
    outcomes = [r.outcome for r in results]
    assert outcomes.count(IntakeOutcome.ACCEPTED) == 100 and outcomes.count(IntakeOutcome.DUPLICATE) == 100
    counts = (
        count_rows(postgres_database, Delivery),
        count_rows(postgres_database, Case),
        count_rows(postgres_database, Work),
    )
    assert counts == (100, 100, 100)
    # The batch's work went to the broker in one message before anyone was answered.
    fan_outs = _fan_outs(redis)
    assert len(fan_outs) == 1 and len(fan_outs[0]) == 100
    with postgres_database.session() as session:
        work = set(session.scalars(select(Work.id)))
    assert set(fan_outs[0]) == work == {w for r in results for w in r.work}


def test_requests_on_one_loop_then_another_are_all_answered(settings: Settings) -> None:
    process = IntakeProcess(settings)
    try:
        first = asyncio.run(process.record("events", "d-1", "failure.captured", [_sighting(1)]))
        second = asyncio.run(process.record("events", "d-2", "failure.captured", [_sighting(2)]))
        again = asyncio.run(process.record("events", "d-1", "failure.captured", [_sighting(1)]))
    finally:
        process.close()
    assert (first.outcome, second.outcome, again.outcome) == (
        IntakeOutcome.ACCEPTED,
        IntakeOutcome.ACCEPTED,
        IntakeOutcome.DUPLICATE,
    )


def test_a_child_killed_holding_deliveries_fails_them_and_the_retry_records_them_once(
    settings: Settings, postgres_database: Database
) -> None:
    process = IntakeProcess(settings)
    process.start()
    pid = process.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # it holds what is sent from now on, and never answers

    async def killed_mid_way() -> list[BaseException | IntakeResult]:
        calls = [process.record("events", f"d-{n}", "failure.captured", [_sighting(n)]) for n in range(5)]
        tasks = [asyncio.ensure_future(call) for call in calls]
        await asyncio.sleep(0.2)  # sent down the pipe, unanswered
        os.kill(pid, signal.SIGKILL)
        return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)

    try:
        lost = asyncio.run(killed_mid_way())
        assert all(isinstance(r, RecordsError) for r in lost), lost
        assert "the intake process stopped (exit code -9) before answering: retry" in str(lost[0])
        assert count_rows(postgres_database, Delivery) == 0  # nothing half-recorded

        async def retry() -> list[IntakeResult]:
            calls = [process.record("events", f"d-{n}", "failure.captured", [_sighting(n)]) for n in range(5)]
            return await asyncio.gather(*calls)

        retried = asyncio.run(retry())
        assert process.pid not in (None, pid)  # a new child took them
        assert [r.outcome for r in retried] == [IntakeOutcome.ACCEPTED] * 5
        assert [r.outcome for r in asyncio.run(retry())] == [IntakeOutcome.DUPLICATE] * 5
    finally:
        process.close()
    assert (count_rows(postgres_database, Delivery), count_rows(postgres_database, Work)) == (5, 5)


def test_close_records_and_answers_what_was_sent_then_the_child_ends(
    settings: Settings, postgres_database: Database
) -> None:
    process = IntakeProcess(settings)

    async def close_mid_way() -> list[IntakeResult]:
        tasks = [
            asyncio.ensure_future(process.record("events", f"d-{n}", "failure.captured", [_sighting(n)]))
            for n in range(20)
        ]
        await asyncio.sleep(0)  # the turn's deliveries are sent
        await asyncio.sleep(0)
        process.close()  # from the loop's own thread, as the receiver's shutdown does
        return await asyncio.wait_for(asyncio.gather(*tasks), 30)

    process.start()
    pid = process.pid
    assert pid is not None
    results = asyncio.run(close_mid_way())
    assert [r.outcome for r in results] == [IntakeOutcome.ACCEPTED] * 20
    assert count_rows(postgres_database, Delivery) == 20
    assert process.pid is None and _gone(pid)  # the child ended (and was waited for)


def test_the_child_ignores_ctrl_c_and_never_outlives_the_receiver(settings: Settings, tmp_path: Path) -> None:
    script = tmp_path / "receiver.py"
    script.write_text(
        "import asyncio, os, signal, sys, time\n"
        "from flaketriage.orchestrator.intake_process import IntakeProcess\n"
        "from flaketriage.orchestrator.intake import Sighting\n"
        "from flaketriage.settings import load_settings\n"
        "process = IntakeProcess(load_settings())\n"
        "process.start()\n"
        "os.kill(process.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group\n"
        "time.sleep(0.5)\n"
        "s = Sighting(fingerprint='f', kind='bundle', title='t', bundle_id='b' * 64, store_url='file:///s')\n"
        "result = asyncio.run(process.record('events', 'd', 'failure.captured', [s]))\n"
        "print(result.outcome, process.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)  # the receiver dies without closing anything\n"
    )
    env = {
        **os.environ,
        "FLAKETRIAGE_DATABASE_URL": str(settings.database_url),
        "FLAKETRIAGE_BROKER_URL": str(settings.broker_url),
        "FLAKETRIAGE_STORE": settings.store,
    }
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    outcome, pid = done.stdout.split()
    assert outcome == "accepted"  # still recording after the SIGINT
    wait_for(lambda: _gone(int(pid)), 30, "the intake child to end with its receiver")


def test_the_database_down_is_a_records_error_from_the_child(settings: Settings) -> None:
    down = settings.model_copy(update={"database_url": f"postgresql://postgres@127.0.0.1:{free_port()}/none"})
    process = IntakeProcess(down)
    try:
        with pytest.raises(RecordsError, match=r"the database at .* failed"):
            asyncio.run(process.record("events", "d-1", "failure.captured", [_sighting(1)]))
    finally:
        process.close()


def test_the_broker_down_is_a_broker_error_and_the_delivery_stays_recorded(
    settings: Settings, postgres_database: Database
) -> None:
    down = settings.model_copy(update={"broker_url": f"redis://127.0.0.1:{free_port()}/0"})
    process = IntakeProcess(down)
    try:
        with pytest.raises(BrokerError, match="the broker did not take"):
            asyncio.run(process.record("events", "d-1", "failure.captured", [_sighting(1)]))
    finally:
        process.close()
    with postgres_database.session() as session:
        assert list(session.scalars(select(Work.status))) == [WorkStatus.QUEUED.value]  # the sweep sends it


def test_odd_text_crosses_to_the_child_and_back_as_it_was(
    settings: Settings, postgres_database: Database
) -> None:
    odd = "nul\x00 \u202eright-to-left \U0001f4a5 " + "x" * 400
    process = IntakeProcess(settings)
    try:
        first = asyncio.run(
            process.record("events", "d\x00odd", "failure.captured", [_sighting(1, title=odd)])
        )
        again = asyncio.run(
            process.record("events", "d\x00odd", "failure.captured", [_sighting(1, title=odd)])
        )
    finally:
        process.close()
    assert (first.outcome, again.outcome) == (IntakeOutcome.ACCEPTED, IntakeOutcome.DUPLICATE)
    with postgres_database.session() as session:
        assert list(session.scalars(select(Case.title))) == [odd.replace("\x00", "\ufffd")]


def test_a_value_the_database_refuses_comes_back_as_a_data_error(
    settings: Settings, postgres_database: Database
) -> None:
    """Not an outage: the receiver answers the child's data error 422, not 503 (`RecordsDataError`)."""
    process = IntakeProcess(settings)
    too_long = numbered_sighting(1, bundle_id="f" * 65)  # a varchar(64) column
    try:
        with pytest.raises(RecordsDataError, match="refused a value as data"):
            asyncio.run(process.record("events", "d-1", "failure.captured", [too_long]))
        ok = asyncio.run(process.record("events", "d-2", "failure.captured", [_sighting(2)]))
    finally:
        process.close()
    assert ok.outcome == IntakeOutcome.ACCEPTED
    assert count_rows(postgres_database, Delivery) == 1


def test_a_burst_larger_than_a_pipe_is_answered(settings: Settings, postgres_database: Database) -> None:
    process = IntakeProcess(settings, max_batch=64)
    big = {"log": "y" * 4000}

    async def burst() -> list[IntakeResult]:
        calls = [
            process.record(
                "events",
                f"d-{n}",
                "failure.captured",
                [
                    Sighting(
                        fingerprint=f"f-{n}", kind="bundle", title="t", bundle_id=f"{n:064x}", provenance=big
                    )
                ],
            )
            for n in range(600)  # ~1.2 MB in one turn: more than a pipe holds
        ]
        return await asyncio.wait_for(asyncio.gather(*calls), 120)

    started = time.monotonic()
    try:
        results = asyncio.run(burst())
    finally:
        process.close()
    assert [r.outcome for r in results] == [IntakeOutcome.ACCEPTED] * 600
    assert count_rows(postgres_database, Delivery) == 600
    assert time.monotonic() - started < 120
