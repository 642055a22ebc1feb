"""Replays and signals: crashes through wrappers, children that outlive a replay, SIGTERM/SIGHUP,
commands that cannot start, time limits that cannot work, and what killed writers leave behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.hostile.conftest import Sandbox, assert_no_traceback, assert_one_line_error

PY = sys.executable
SANDBOXES = ["bwrap", "process"]
CRASH = "import ctypes; ctypes.string_at(0)"
SLEEPER = "import time; time.sleep(300)"


# -- helpers -------------------------------------------------------------------------------------


def processes_with(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (zombies have none)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(name))
    return found


def wait_until(predicate: Callable[[], object], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def marker() -> Iterator[str]:
    """A word no other process has in its command line; what still holds it is killed afterwards."""
    word = f"flaketriage-hostile-{uuid.uuid4().hex}"
    yield word
    for pid in processes_with(word):  # only the processes this test started carry the word
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def capture(box: Sandbox, *command: str, expect: int = 1) -> dict[str, object]:
    proc = box.run("capture", "--json", "--", *command)
    assert proc.returncode == expect, (proc.returncode, proc.stdout, proc.stderr)
    assert_no_traceback(proc)
    data: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["bundle"], proc.stderr
    return data


def triage(box: Sandbox, bundle: str, *options: str, env: dict[str, str] | None = None) -> dict[str, object]:
    proc = box.run("triage", bundle, "--json", *options, env=env)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert_no_traceback(proc)
    data: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


def bundles_in(box: Sandbox) -> list[str]:
    proc = box.run("bundle", "list", "--json")
    if not box.store.exists():
        return []
    assert proc.returncode == 0, proc.stderr
    return [b["id"] for b in json.loads(proc.stdout)]


def shown(box: Sandbox, bundle: str) -> dict[str, object]:
    proc = box.run("bundle", "show", bundle, "--json")
    assert proc.returncode == 0, proc.stderr
    data: dict[str, object] = json.loads(proc.stdout)
    return data


# -- a crash seen through a wrapper --------------------------------------------------------------


@pytest.mark.parametrize("kind", SANDBOXES)
def test_native_crash_replays_as_the_same_signal(sandbox: Sandbox, kind: str) -> None:
    captured = capture(sandbox, PY, "-c", CRASH, expect=139)
    assert shown(sandbox, str(captured["bundle"]))["failure"]["signal"] == "SIGSEGV"  # type: ignore[index]
    result = triage(sandbox, str(captured["bundle"]), "--sandbox", kind)
    assert result["verdict"] == "deterministic", result
    assert sandbox.outside_writes() == set()


@pytest.mark.parametrize("kind", SANDBOXES)
def test_crash_inside_a_shell_is_the_signal_too(sandbox: Sandbox, kind: str) -> None:
    # The shell runs python as a child (not exec: a command follows), so it reports 139 itself.
    script = sandbox.project / "run.sh"
    script.write_text(f"#!/bin/sh\n{PY} -c '{CRASH}'\nstatus=$?\nexit $status\n")
    script.chmod(0o755)
    captured = capture(sandbox, "./run.sh", expect=139)
    failure = shown(sandbox, str(captured["bundle"]))["failure"]
    assert failure["kind"] == "signal" and failure["signal"] == "SIGSEGV", failure  # type: ignore[index]
    result = triage(sandbox, str(captured["bundle"]), "--sandbox", kind)
    assert result["verdict"] == "deterministic", result
    assert sandbox.outside_writes() == set()


@pytest.mark.parametrize("kind", SANDBOXES)
def test_a_program_that_exits_139_itself_is_no_signal(sandbox: Sandbox, kind: str) -> None:
    captured = capture(
        sandbox, PY, "-c", "import sys; print('bad checksum', file=sys.stderr); sys.exit(139)", expect=139
    )
    failure = shown(sandbox, str(captured["bundle"]))["failure"]
    assert failure["kind"] == "exit" and failure["signal"] is None, failure  # type: ignore[index]
    # Bubblewrap reports SIGSEGV as 139 too: the replay must still match the plain exit status.
    result = triage(sandbox, str(captured["bundle"]), "--sandbox", kind)
    assert result["verdict"] == "deterministic", result
    assert sandbox.outside_writes() == set()


# -- what a replay starts ends with it ----------------------------------------------------------


def _spawner(box: Sandbox, marker: str) -> None:
    """A command that, in a replay only, leaves children behind: in the background of its shell,
    in a session of their own (``setsid``) and through a double fork, then fails."""
    (box.project / "spawn.sh").write_text(
        "#!/bin/sh\n"
        'if [ "$FLAKETRIAGE_REPLAY" = 1 ]; then\n'
        f"  for i in 1 2 3; do {PY} -c '{SLEEPER}' {marker}-plain & done\n"
        f"  setsid {PY} -c '{SLEEPER}' {marker}-setsid &\n"
        f"  {PY} -c 'import os, subprocess, sys; os.fork() or (os.setsid(), "
        f'subprocess.Popen([sys.executable, "-c", "{SLEEPER}", "{marker}-double"]))\'\n'
        "fi\n"
        "echo 'error: the job failed' >&2\n"
        "exit 3\n"
    )
    (box.project / "spawn.sh").chmod(0o755)


@pytest.mark.parametrize("kind", SANDBOXES)
def test_children_a_replay_leaves_behind_are_ended(sandbox: Sandbox, kind: str, marker: str) -> None:
    _spawner(sandbox, marker)
    captured = capture(sandbox, "./spawn.sh", expect=3)
    assert processes_with(marker) == []  # the capture itself started none
    started = time.monotonic()
    result = triage(sandbox, str(captured["bundle"]), "--sandbox", kind)
    assert result["verdict"] == "deterministic", result
    assert result["replays"] == 5
    # Children that hold the replay's output pipe would otherwise stall each replay.
    assert time.monotonic() - started < 60
    left = processes_with(marker)
    assert left == [], [Path(f"/proc/{p}/cmdline").read_bytes() for p in left]
    assert sandbox.outside_writes() == set()


def test_the_spawner_really_leaves_children_without_the_sandbox(sandbox: Sandbox, marker: str) -> None:
    """The test above can fail: run directly, the same script leaves its children running."""
    _spawner(sandbox, marker)
    proc = subprocess.run(
        ["./spawn.sh"],
        cwd=sandbox.project,
        env=sandbox.env({"FLAKETRIAGE_REPLAY": "1"}),
        stdout=subprocess.DEVNULL,  # the children keep the pipes open
        stderr=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 3
    assert wait_until(lambda: len(processes_with(marker)) == 5, timeout=10), processes_with(marker)


# -- auto never falls back silently --------------------------------------------------------------


def test_auto_without_bubblewrap_warns_once(sandbox: Sandbox) -> None:
    captured = capture(sandbox, PY, "-c", "raise SystemExit('error: boom')")
    bin_dir = sandbox.root / "bin"  # a PATH with what triage needs, and no bwrap
    bin_dir.mkdir()
    for tool in ("git", "sh"):
        where = shutil.which(tool)
        if where:
            (bin_dir / tool).symlink_to(where)
    env = {"PATH": str(bin_dir), "FLAKETRIAGE_SANDBOX": "auto"}
    proc = sandbox.run("triage", str(captured["bundle"]), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)
    warnings = [line for line in proc.stderr.splitlines() if "not isolated" in line]
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith("warning:") and "install bubblewrap" in warnings[0], warnings
    assert "network" in warnings[0] and "file-system" in warnings[0]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["verdict"] == "deterministic"
    # Chosen on purpose, or with bubblewrap installed, there is nothing to warn about.
    chosen = sandbox.run(
        "triage", str(captured["bundle"]), "--sandbox", "process", env={"PATH": str(bin_dir)}
    )
    assert "not isolated" not in chosen.stderr, chosen.stderr
    installed = sandbox.run("triage", str(captured["bundle"]))
    assert "not isolated" not in installed.stderr, installed.stderr
    assert sandbox.outside_writes() == set()


# -- SIGTERM and SIGHUP ----------------------------------------------------------------------------


def _start(box: Sandbox, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PY, "-m", "flaketriage", *args],
        cwd=box.project,
        env=box.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A suite started under nohup hands its children SIGHUP ignored; a user's shell does not.
        preexec_fn=_default_signals,
    )


def _default_signals() -> None:
    for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)


def _stop(proc: subprocess.Popen[str], signum: int, marker: str) -> tuple[str, str]:
    def child_started() -> bool:
        # The command line of `capture -- CMD` holds the marker too: wait for a child that has it.
        return bool(set(processes_with(marker)) - {proc.pid}) or proc.poll() is not None

    assert wait_until(child_started), "the child never started"
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signum)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return out, err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_signal_to_capture_ends_the_child(sandbox: Sandbox, signum: int, marker: str) -> None:
    proc = _start(sandbox, "capture", "--", PY, "-c", SLEEPER, marker)
    out, err = _stop(proc, signum, marker)
    assert proc.returncode == 128 + signum, (proc.returncode, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    assert signal.Signals(signum).name in err
    assert processes_with(marker) == []
    assert bundles_in(sandbox) == []  # an interrupted run is not a failure to triage
    assert sandbox.outside_writes() == set()


@pytest.mark.parametrize("kind", SANDBOXES)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_signal_to_triage_ends_the_replay_and_removes_its_workspace(
    sandbox: Sandbox, signum: int, kind: str, marker: str
) -> None:
    # Fails at once when captured; sleeps, with a child of its own, when replayed.
    code = (
        "import os, subprocess, sys, time\n"
        "if os.environ.get('FLAKETRIAGE_REPLAY'):\n"
        f"    child = [sys.executable, '-c', {SLEEPER!r}, sys.argv[1] + '-child']\n"
        "    subprocess.Popen(child, start_new_session=True)\n"
        "    time.sleep(300)\n"
        "sys.exit('error: job failed')\n"
    )
    (sandbox.project / "job.py").write_text(code)
    captured = capture(sandbox, PY, "job.py", marker)
    proc = _start(sandbox, "triage", str(captured["bundle"]), "--sandbox", kind)
    assert wait_until(lambda: len(processes_with(marker)) >= 2 or proc.poll() is not None)
    out, err = _stop(proc, signum, marker)
    assert proc.returncode == 128 + signum, (proc.returncode, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    assert wait_until(lambda: processes_with(marker) == [], timeout=5), processes_with(marker)
    assert not list(sandbox.tmp.glob("flaketriage-replay-*"))
    assert sandbox.outside_writes() == set()


def test_triage_that_fails_removes_its_workspace(sandbox: Sandbox) -> None:
    tool = sandbox.root / "bin" / "tool"  # outside the project: not in the bundle
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho 'error: tool failed' >&2\nexit 5\n")
    tool.chmod(0o755)
    captured = capture(sandbox, str(tool), expect=5)
    tool.unlink()
    proc = sandbox.run("triage", str(captured["bundle"]), "--sandbox", "process")
    assert_one_line_error(proc, 2, "command not found", str(tool))
    assert not list(sandbox.tmp.glob("flaketriage-replay-*"))
    assert sandbox.outside_writes() == set()


# -- commands that cannot start --------------------------------------------------------------------


def test_script_without_a_shebang_is_a_usage_error(sandbox: Sandbox) -> None:
    script = sandbox.project / "script.sh"
    script.write_text("touch ran\nexit 3\n")
    script.chmod(0o755)
    proc = sandbox.run("capture", "--", "./script.sh")
    line = assert_one_line_error(proc, 2, "./script.sh", "exec format error", "#!")
    assert "sh ./script.sh" in line
    assert not (sandbox.project / "ran").exists()
    assert bundles_in(sandbox) == []
    assert sandbox.outside_writes() == set()


@pytest.mark.parametrize(
    ("command", "needles", "never"),
    [
        ("", ("command is empty",), "permission denied"),
        ("   ", ("command is empty",), "permission denied"),
        ("no-such-program-xyz", ("command not found", "no-such-program-xyz"), "permission denied"),
        ("./subdir", ("is a directory", "./subdir"), "permission denied"),
    ],
    ids=["empty", "blank", "missing", "directory"],
)
def test_command_that_cannot_start(
    sandbox: Sandbox, command: str, needles: tuple[str, ...], never: str
) -> None:
    (sandbox.project / "subdir").mkdir()
    proc = sandbox.run("capture", "--", command)
    line = assert_one_line_error(proc, 2, *needles)
    assert never not in line
    assert bundles_in(sandbox) == []
    assert sandbox.outside_writes() == set()


@pytest.mark.parametrize("value", ["inf", "-5", "0", "nan", "1e300"])
def test_timeout_that_cannot_work_is_refused(sandbox: Sandbox, value: str) -> None:
    proc = sandbox.run("capture", "--timeout", value, "--", PY, "-c", "open('ran', 'w')")
    assert_one_line_error(proc, 2, "--timeout", "above 0")
    assert not (sandbox.project / "ran").exists()
    assert bundles_in(sandbox) == []
    bundle = capture(sandbox, PY, "-c", "raise SystemExit('error: boom')")["bundle"]
    proc = sandbox.run("triage", str(bundle), "--timeout", value)
    assert_one_line_error(proc, 2, "--timeout", "above 0")
    assert not list(sandbox.tmp.glob("flaketriage-replay-*"))
    assert sandbox.outside_writes() == set()


# -- what killed writers leave in the store ------------------------------------------------------------


def test_opening_the_store_sweeps_stale_temp_files(sandbox: Sandbox) -> None:
    capture(sandbox, PY, "-c", "raise SystemExit('error: boom')")
    tmp, objects = sandbox.store / "tmp", sandbox.store / "objects"
    shard = next(p for p in objects.iterdir() if p.is_dir())
    old = time.time() - 2 * 3600
    stale = [tmp / "put-abc123", shard / ".deadbeef.x1y2z3", sandbox.store / "refs" / ".bundle.q9"]
    fresh = [tmp / "put-fresh", shard / ".cafe.fresh"]
    for path in stale + fresh:
        path.write_bytes(b"half-written")
    for path in stale:
        os.utime(path, (old, old))
    (objects / ".swept").unlink(missing_ok=True)  # as if no sweep ran in the last hour
    proc = sandbox.run("capture", "--", PY, "-c", "pass")
    assert proc.returncode == 0, proc.stderr
    assert [p for p in stale if p.exists()] == []
    assert [p for p in fresh if not p.exists()] == []
    # Within the hour only tmp/ is listed again; the object directories wait for the next sweep.
    again = shard / ".later.abc"
    again.write_bytes(b"x")
    os.utime(again, (old, old))
    (tmp / "put-later").write_bytes(b"x")
    os.utime(tmp / "put-later", (old, old))
    assert sandbox.run("capture", "--", PY, "-c", "pass").returncode == 0
    assert again.exists() and not (tmp / "put-later").exists()
    assert sandbox.outside_writes() == set()
