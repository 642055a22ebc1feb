"""Hangs on real programs: stacks dumped before a timed-out run is killed (py-spy, else faulthandler
through the injected sitecustomize), a fingerprint from the stuck frames, a captured hang replayed
and reproduced, a hang elsewhere told apart, and the dump in the bundle, the verdict and the report.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flaketriage.bundle.io import load_manifest
from flaketriage.capture.record import CaptureRequest, CaptureResult, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.failure.fingerprint import fingerprint_failure
from flaketriage.process.child import run_command
from flaketriage.process.hangs import HANG_DUMP_ENV, HangDump, parse_dump
from flaketriage.store import LocalStore
from flaketriage.workers.replay import ReplayContext, Replayer, outcome_of
from flaketriage.workers.report import MemoryIssueSink
from flaketriage.workers.sandbox import BubblewrapSandbox, ProcessSandbox, Sandbox
from flaketriage.workers.triage import triage
from flaketriage.workers.verdict import Outcome, VerdictPolicy

SLEEP_LOOP = """\
import threading, time

def background():
    while True:
        time.sleep(0.01)

def spin():
    while True:
        time.sleep(0.05)

threading.Thread(target=background, daemon=True).start()
print("started", flush=True)
spin()
"""

DEADLOCK = """\
import threading

lock = threading.Lock()

def deadlock():
    lock.acquire()
    lock.acquire()

deadlock()
"""

# Hangs in `spin` when captured, and in `elsewhere` when replayed (every replay sets FLAKETRIAGE_REPLAY).
MOVES = """\
import os, time

def spin():
    while True:
        time.sleep(0.05)

def elsewhere():
    while True:
        time.sleep(0.05)

elsewhere() if os.environ.get("FLAKETRIAGE_REPLAY") == "1" else spin()
"""

# A busy loop that moves between helpers: only the function that calls them is stuck.
BUSY = """\
def helper_a(x):
    return x + 1

def helper_b(x):
    return x * 2 % 1000003

def churn():
    x = 0
    while True:
        x = helper_a(x)
        x = helper_b(x)

churn()
"""

POLICY = VerdictPolicy(max_replays=5, flaky_rate_replays=0)


@pytest.fixture(params=["py-spy", "faulthandler"])
def tool(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Dumps by py-spy (on PATH, as installed with the dev extra) or, with py-spy off PATH, by
    faulthandler through the injected sitecustomize."""
    if request.param == "py-spy":
        assert shutil.which("py-spy"), "py-spy is a dev dependency: pip install -e '.[dev]'"
    else:
        without = [
            d for d in os.environ.get("PATH", "").split(os.pathsep) if not (Path(d) / "py-spy").exists()
        ]
        monkeypatch.setenv("PATH", os.pathsep.join(without))
        assert shutil.which("py-spy") is None
    return str(request.param)


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def capture(store: LocalStore, project: Path, source: str, timeout_s: float = 1.0) -> CaptureResult:
    project.mkdir(exist_ok=True)
    (project / "job.py").write_text(source)
    return run_and_capture(
        store,
        CaptureRequest(
            argv=[sys.executable, "job.py"],
            cwd=project,
            limits=SourceLimits(1 << 20, 1 << 24),
            timeout_s=timeout_s,
            echo=False,
        ),
    )


@pytest.fixture
def replay_context(tmp_path: Path) -> Iterator[ReplayContext]:
    context = ReplayContext.from_process()
    yield ReplayContext(base_env=context.base_env, temp_root=tmp_path / "replays", git=context.git)


# -- reading dumps --------------------------------------------------------------------------------
FAULTHANDLER_DUMP = """\
Thread 0x00007f740fd1d6c0 (most recent call first):
  File "/w/job.py", line 5 in background
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f74108b8b80 (most recent call first):
  File "/w/job.py", line 9 in spin
  File "/w/job.py", line 13 in <module>
"""

PY_SPY_DUMP = """\
Process 4202: python job.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 3 (idle): "Thread-1 (background)"
    background (/w/job.py:5)
    Thread.run (/usr/lib/python3.11/threading.py:982)
Thread 2 (idle): "MainThread"
    spin (/w/job.py:9)
    <module> (/w/job.py:13)
"""


@pytest.mark.parametrize("dump", [FAULTHANDLER_DUMP, PY_SPY_DUMP], ids=["faulthandler", "py-spy"])
def test_both_dump_formats_name_the_main_thread_and_its_frames(dump: str) -> None:
    threads = parse_dump(dump)
    main = [t for t in threads if t.main]
    assert len(threads) == 2 and len(main) == 1
    assert [(f.function, f.lineno) for f in main[0].frames] == [("spin", 9), ("<module>", 13)]
    info = fingerprint_failure(exit_code=-9, stdout="", stderr="", timed_out=True, roots=["/w"],
                               hang=HangDump("py-spy", (dump,)))  # fmt: skip
    assert info is not None and info.signature == "timeout|job.py:<module>>job.py:spin"


def test_the_stuck_frames_are_those_every_dump_shares() -> None:
    dumps = [
        'Thread 1 (active): "MainThread"\n    helper_a (/w/job.py:2)\n    churn (/w/job.py:9)\n'
        "    <module> (/w/job.py:12)\n",
        'Thread 1 (active): "MainThread"\n    churn (/w/job.py:10)\n    <module> (/w/job.py:12)\n',
        'Thread 1 (active): "MainThread"\n    helper_b (/w/job.py:5)\n    churn (/w/job.py:10)\n'
        "    <module> (/w/job.py:12)\n",
    ]
    stuck = HangDump("py-spy", tuple(dumps)).stuck()
    assert [f.function for f in stuck] == ["churn", "<module>"]
    assert stuck[0].lineno == 10  # as in the last dump


def test_a_hang_without_a_dump_is_a_plain_timeout() -> None:
    info = fingerprint_failure(exit_code=-9, stdout="", stderr="", timed_out=True)
    assert info is not None and (info.kind, info.signature) == ("timeout", "timeout")


# -- capture --------------------------------------------------------------------------------------
def test_a_captured_hang_is_fingerprinted_by_its_stuck_frames(
    store: LocalStore, tmp_path: Path, tool: str
) -> None:
    result = capture(store, tmp_path / "project", SLEEP_LOOP)
    assert result.process.timed_out and result.process.hang is not None
    assert result.process.hang.tool == tool
    assert result.failure is not None and result.failure.kind == "timeout"
    assert result.failure.signature == "timeout|job.py:<module>>job.py:spin"
    assert result.bundle_id is not None
    manifest = load_manifest(store, result.bundle_id)
    assert manifest.failure.detail == "the run passed its time limit, stuck in job.py:spin (line 9)"
    # The dump is the evidence: in the failure's traceback and as the bundle's `hang` log, with
    # the other thread too.
    hang_log = store.get_bytes(manifest.logs["hang"].sha256).decode()
    for text in (manifest.failure.traceback or "", hang_log):
        assert tool in text and "spin" in text and "background" in text
    # Nothing the capture added to let the hang be located is recorded for replays.
    assert HANG_DUMP_ENV not in manifest.command.env and "sitecustomize" not in manifest.command.env.get(
        "PYTHONPATH", ""
    )


def test_py_spy_and_faulthandler_give_one_fingerprint(
    store: LocalStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_py_spy = capture(store, tmp_path / "a", SLEEP_LOOP)
    without = [d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "py-spy").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(without))
    with_faulthandler = capture(store, tmp_path / "b", SLEEP_LOOP)
    assert with_py_spy.process.hang and with_py_spy.process.hang.tool == "py-spy"
    assert with_faulthandler.process.hang and with_faulthandler.process.hang.tool == "faulthandler"
    assert with_py_spy.failure and with_faulthandler.failure
    assert with_py_spy.failure.fingerprint == with_faulthandler.failure.fingerprint


def test_a_deadlock_on_a_lock_is_located(store: LocalStore, tmp_path: Path, tool: str) -> None:
    result = capture(store, tmp_path / "project", DEADLOCK)
    assert result.failure is not None
    assert result.failure.signature == "timeout|job.py:<module>>job.py:deadlock"


def test_a_busy_loop_is_stuck_in_the_function_that_loops(store: LocalStore, tmp_path: Path) -> None:
    result = capture(store, tmp_path / "project", BUSY)
    assert result.failure is not None
    # However the dumps fall between helper_a, helper_b and the loop, churn is what all share.
    assert result.failure.signature == "timeout|job.py:<module>>job.py:churn"


def test_a_program_not_written_in_python_hangs_as_a_plain_timeout(tmp_path: Path) -> None:
    result = run_command(["sh", "-c", "sleep 30"], tmp_path, dict(os.environ), 0.5)
    assert result.timed_out and result.hang is None


def test_the_dump_signal_never_reaches_a_program_that_did_not_ask_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program with its own SIGUSR1 handler (Lightning checkpoints and requeues on it) that did not
    load the sitecustomize is killed at its limit without ever getting SIGUSR1."""
    without = [d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "py-spy").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(without))
    marker = tmp_path / "got-usr1"
    program = (
        "import signal, time, pathlib\n"
        f"signal.signal(signal.SIGUSR1, lambda *a: pathlib.Path({str(marker)!r}).write_text('x'))\n"
        "while True:\n    time.sleep(0.05)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != HANG_DUMP_ENV}
    result = run_command([sys.executable, "-c", program], tmp_path, env, 0.7)
    assert result.timed_out and result.hang is None
    assert not marker.exists()


# -- replay ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("sandbox_kind", ["process", "bwrap"])
def test_a_captured_hang_replays_as_a_deterministic_failure_with_its_dump(
    store: LocalStore, tmp_path: Path, replay_context: ReplayContext, tool: str, sandbox_kind: str
) -> None:
    result = capture(store, tmp_path / "project", SLEEP_LOOP)
    assert result.bundle_id is not None
    sandbox: Sandbox = ProcessSandbox() if sandbox_kind == "process" else BubblewrapSandbox()
    sink = MemoryIssueSink()
    triaged = triage(
        store,
        result.bundle_id,
        sandbox=sandbox,
        policy=POLICY,
        sink=sink,
        quarantine=None,
        context=replay_context,
    )
    assert triaged.verdict.verdict == "deterministic", triaged.to_json()
    assert triaged.verdict.reproductions == 5
    # The verdict carries where the replays hung; the report shows where it hung.
    assert triaged.hang is not None and "spin" in triaged.hang and tool in triaged.hang
    assert triaged.to_json()["hang"] == triaged.hang
    issue = next(iter(sink.issues.values()))
    assert "Where it hung:" in issue.body and "spin" in issue.body
    assert "stuck in job.py:spin" in issue.title or "stuck in job.py:spin" in issue.body


def test_a_replay_that_hangs_elsewhere_is_a_different_failure(
    store: LocalStore, tmp_path: Path, replay_context: ReplayContext
) -> None:
    result = capture(store, tmp_path / "project", MOVES)
    assert result.failure is not None and result.failure.signature == "timeout|job.py:<module>>job.py:spin"
    assert result.bundle_id is not None
    manifest = load_manifest(store, result.bundle_id)
    with Replayer(store, manifest, ProcessSandbox(), context=replay_context) as replayer:
        replay = replayer.run()
    assert replay.outcome is Outcome.DIFFERENT
    assert (
        replay.failure is not None and replay.failure.signature == "timeout|job.py:<module>>job.py:elsewhere"
    )
    assert replay.failure.detail is not None and "elsewhere" in replay.failure.detail


def test_a_hang_in_a_run_captured_failing_otherwise_is_a_sandbox_outcome(
    store: LocalStore, tmp_path: Path, replay_context: ReplayContext
) -> None:
    """Only a captured hang makes another hang a new failure: any other failure that times out on
    replay says something about the limit, not the program (the sandbox engineers' rule)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "job.py").write_text(
        "import os, time\nif os.environ.get('FLAKETRIAGE_REPLAY') == '1':\n"
        "    while True:\n        time.sleep(0.05)\nraise ValueError('boom')\n"
    )
    result = run_and_capture(
        store,
        CaptureRequest(argv=[sys.executable, "job.py"], cwd=project, limits=SourceLimits(1 << 20, 1 << 24),
                       timeout_s=1.0, echo=False),
    )  # fmt: skip
    assert result.failure is not None and result.failure.kind == "exception" and result.bundle_id
    manifest = load_manifest(store, result.bundle_id)
    with Replayer(store, manifest, ProcessSandbox(), context=replay_context) as replayer:
        assert replayer.run().outcome is Outcome.SANDBOX


def test_outcomes_of_a_timeout_depend_on_whether_the_capture_hung() -> None:
    info = fingerprint_failure(
        exit_code=-9, stdout="", stderr="", timed_out=True, hang=HangDump("py-spy", (PY_SPY_DUMP,))
    )
    assert info is not None
    assert outcome_of(info, info.fingerprint, "timeout", captured_hang=True) is Outcome.REPRODUCED
    assert outcome_of(info, "0" * 64, "timeout", captured_hang=True) is Outcome.DIFFERENT
    assert outcome_of(info, "0" * 64, "timeout", captured_hang=False) is Outcome.SANDBOX


def test_a_hang_captured_without_stacks_is_matched_as_a_plain_timeout(
    store: LocalStore, tmp_path: Path, replay_context: ReplayContext
) -> None:
    """A non-Python wrapper hid the stacks at capture (or an older flaketriage captured it): replays
    that are located still reproduce it, and keep their stacks as evidence."""
    result = capture(store, tmp_path / "project", SLEEP_LOOP)
    assert result.bundle_id is not None
    manifest = load_manifest(store, result.bundle_id)
    plain = fingerprint_failure(exit_code=-9, stdout="", stderr="", timed_out=True)
    assert plain is not None
    legacy = manifest.model_copy(
        update={
            "failure": manifest.failure.model_copy(
                update={"signature": "timeout", "fingerprint": plain.fingerprint, "traceback": None}
            )
        }
    )
    with Replayer(store, legacy, ProcessSandbox(), context=replay_context) as replayer:
        replay = replayer.run()
    assert replay.outcome is Outcome.REPRODUCED
    assert replay.failure is not None and replay.failure.traceback and "spin" in replay.failure.traceback


def test_the_service_triages_a_captured_hang_with_its_location_in_the_evidence(tmp_path: Path) -> None:
    from flaketriage.workers.attribution import RunnerIdentity
    from flaketriage.workers.triage import TriageResult
    from tests.workers.service_world import make_world

    world = make_world(tmp_path, [RunnerIdentity(host="worker-1")])
    try:
        bundle = world.capture(SLEEP_LOOP, timeout_s=1.0)
        case_id = world.announce(bundle)
        world.drive()
        case = world.case(case_id)
        assert (case.status, case.verdict) == ("reported", "deterministic")
        result = TriageResult.from_json(case.evidence or {})
        assert result.hang is not None and "stuck in job.py:spin" in result.hang
        replays = world.replays(world.works(case_id)[0].id)
        assert all(r.outcome == "reproduced" and r.summary and "spin" in r.summary for r in replays)
        issue = next(iter(world.sink.issues.values()))
        assert "Where it hung:" in issue.body
    finally:
        world.close()
