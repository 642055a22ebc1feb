"""Hostile replays in every sandbox: stopped, reported as a `sandbox` outcome, and the host unharmed.

Each program is a real captured bundle (its captured failure a ZeroDivisionError) replayed with
hostile arguments: it reaches for the network (a listener on this machine's loopback, which must
get no connection), writes outside its workspace, fork-bombs, eats memory, or outlives its time
limit. After each: the outcome is `sandbox` with the limit that stopped it, no process of the run
is left, nothing was written outside, and the worker (this process) carries on.
"""

from __future__ import annotations

import shutil
import socket
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flaketriage.bundle.io import load_manifest
from flaketriage.bundle.manifest import Manifest
from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.store import LocalStore
from flaketriage.workers.replay import ReplayContext, Replayer, ReplayResult, Variant
from flaketriage.workers.sandbox import BubblewrapSandbox, LocalLimits, ProcessSandbox, Sandbox
from flaketriage.workers.sandbox.cgroup import Cgroup, hierarchies
from flaketriage.workers.sandbox.containers import DockerSandbox
from flaketriage.workers.sandbox.images import EnvironmentImages
from flaketriage.workers.verdict import Outcome

PIDS = 64
MEMORY_MB = 256
TIMEOUT_S = 4.0

HOSTILE = """
import os, socket, sys, time
mode = sys.argv[1] if len(sys.argv) > 1 else "captured"
if mode == "captured":
    1 / 0
elif mode == "network":
    socket.create_connection(("127.0.0.1", int(sys.argv[3])), timeout=5).sendall(b"reached")
elif mode == "write":
    errors = []
    for path in sys.argv[3:]:
        try:
            with open(path, "w") as fh:
                fh.write("pwned")
            print("wrote", path)
        except OSError as exc:
            errors.append(exc)
    if errors:
        raise errors[-1]
elif mode == "forkbomb":
    while True:
        os.fork()
elif mode == "memory":
    hog = []
    while True:
        hog.append(bytearray(b"1") * (32 << 20))
elif mode == "hang":
    time.sleep(600)
"""


@dataclass(frozen=True)
class Bundle:
    store: LocalStore
    manifest: Manifest


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    root = tmp_path_factory.mktemp("hostile") / "proj"
    root.mkdir()
    (root / "job.py").write_text(HOSTILE)
    store = LocalStore(root.parent / "store")
    limits = SourceLimits(max_file_bytes=1 << 20, max_total_bytes=10 << 20)
    result = run_and_capture(
        store, CaptureRequest(argv=[sys.executable, "job.py"], cwd=root, limits=limits, echo=False)
    )
    assert result.bundle_id and result.failure is not None, result.process.stderr
    return Bundle(store, load_manifest(store, result.bundle_id))


@pytest.fixture(params=["process", "bwrap", "docker"])
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    limits = LocalLimits(pids=PIDS)
    if request.param == "process":
        yield ProcessSandbox(limits)
    elif request.param == "bwrap":
        yield BubblewrapSandbox(limits=limits)
    else:
        engine: Any = request.getfixturevalue("engine")
        client = engine.client()
        images = EnvironmentImages(client, base_image=engine.base_image, build_network="none")
        box = DockerSandbox(client, images, mounts=engine.mounts, pids_limit=PIDS)
        yield box
        box.close()


@pytest.fixture
def token() -> str:
    """Marks the run's processes (on their command line), so any left behind can be found."""
    return f"hostile-{uuid.uuid4().hex}"


def _replay(bundle: Bundle, sandbox: Sandbox, mode: str, token: str, *args: str) -> ReplayResult:
    with Replayer(
        bundle.store,
        bundle.manifest,
        sandbox,
        context=ReplayContext.from_process(),
        timeout_s=TIMEOUT_S,
        memory_mb=MEMORY_MB,
    ) as replayer:
        return replayer.run(Variant(argv=[sys.executable, "job.py", mode, token, *args]))


def _left_running(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and token.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _assert_stopped(result: ReplayResult, limit: str, token: str) -> None:
    process = result.process
    assert result.outcome is Outcome.SANDBOX, (result.outcome, process.exit_code, process.stderr[-2000:])
    assert process.limit == limit
    assert _left_running(token) == []


def test_reaching_for_the_network(bundle: Bundle, sandbox: Sandbox, token: str) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        result = _replay(bundle, sandbox, "network", token, str(port))
        _assert_stopped(result, "network", token)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing connected, not even for a moment
            listener.accept()


def test_writing_outside_the_workspace(bundle: Bundle, sandbox: Sandbox, token: str, tmp_path: Path) -> None:
    outside = Path("/var/tmp") / f"flaketriage-{token}"
    outside.mkdir()
    (tmp_path / "outside").mkdir()
    targets = [outside / "pwned", tmp_path / "outside" / "pwned", Path(f"/usr/flaketriage-{token}")]
    try:
        result = _replay(bundle, sandbox, "write", token, *map(str, targets))
        assert [p for p in targets if p.exists()] == []
        _assert_stopped(result, "filesystem", token)
        assert "wrote" not in result.process.stdout
    finally:
        shutil.rmtree(outside, ignore_errors=True)
        Path(f"/usr/flaketriage-{token}").unlink(missing_ok=True)


def test_a_fork_bomb(bundle: Bundle, sandbox: Sandbox, token: str) -> None:
    result = _replay(bundle, sandbox, "forkbomb", token)
    _assert_stopped(result, "pids", token)


def test_eating_memory(bundle: Bundle, sandbox: Sandbox, token: str) -> None:
    result = _replay(bundle, sandbox, "memory", token)
    _assert_stopped(result, "memory", token)
    assert result.process.exit_code in (-9, 137)  # killed by the kernel, not a MemoryError


def test_outliving_the_time_limit(bundle: Bundle, sandbox: Sandbox, token: str) -> None:
    result = _replay(bundle, sandbox, "hang", token)
    _assert_stopped(result, "timeout", token)
    # The run would sleep 600 s: ending within a minute of its limit proves the kill; the rest is
    # the engine's own calls (a container's kill, wait and removal), slow on a loaded machine.
    assert result.process.timed_out and result.process.duration_s < TIMEOUT_S + 60


def test_the_worker_survives_and_replays_again(bundle: Bundle, sandbox: Sandbox, token: str) -> None:
    for mode in ("forkbomb", "memory"):
        _replay(bundle, sandbox, mode, token)
    again = _replay(bundle, sandbox, "captured", token)
    assert again.outcome is Outcome.REPRODUCED, again.process.stderr[-2000:]


# -- what a limit means for the verdict ------------------------------------------------------------
def test_a_captured_hang_that_hangs_again_reproduces(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "job.py").write_text("import time\ntime.sleep(600)\n")
    store = LocalStore(tmp_path / "store")
    limits = SourceLimits(max_file_bytes=1 << 20, max_total_bytes=10 << 20)
    captured = run_and_capture(
        store,
        CaptureRequest(argv=[sys.executable, "job.py"], cwd=root, limits=limits, echo=False, timeout_s=2),
    )
    assert captured.bundle_id and captured.failure is not None and captured.failure.kind == "timeout"
    manifest = load_manifest(store, captured.bundle_id)
    with Replayer(
        store, manifest, ProcessSandbox(), context=ReplayContext.from_process(), timeout_s=2
    ) as replayer:
        result = replayer.run()
    assert result.process.limit == "timeout"
    assert result.outcome is Outcome.REPRODUCED


def test_memory_is_limited_by_a_cgroup_here() -> None:
    """This machine has cgroup v1's memory controller: the RLIMIT_AS fallback must not be in use."""
    cgroup = Cgroup.create(memory_mb=64, pids=16)
    try:
        assert cgroup.missing == [] and set(cgroup.groups) == {"memory", "pids"}
        assert (cgroup.groups["memory"] / "memory.limit_in_bytes").read_text().strip() == str(64 << 20)
    finally:
        cgroup.close()
    assert not any(g.exists() for g in cgroup.groups.values())  # removed
    assert any(h.version == 1 and "memory" in h.controllers for h in hierarchies())
