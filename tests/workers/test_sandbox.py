from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from flaketriage.errors import SandboxError
from flaketriage.workers.sandbox import (
    BubblewrapSandbox,
    HostView,
    ProcessSandbox,
    Sandbox,
    SandboxSpec,
    make_sandbox,
)


def _spec(ws: Path, code: str, **kw: object) -> SandboxSpec:
    fields: dict[str, object] = {
        "argv": [sys.executable, "-c", code],
        "workspace": ws,
        "cwd": ws,
        "env": {"PATH": os.environ["PATH"]},
        "timeout_s": 30.0,
    }
    fields.update(kw)
    return SandboxSpec(**fields)  # type: ignore[arg-type]


@pytest.fixture(params=["process", "bwrap"])
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return ProcessSandbox() if request.param == "process" else BubblewrapSandbox()


def test_runs_in_the_workspace_and_reports_exit_and_output(sandbox: Sandbox, tmp_path: Path) -> None:
    (tmp_path / "input.txt").write_text("hello")
    code = "import os,sys; print(open('input.txt').read(), os.getcwd()); sys.stderr.write('err'); sys.exit(3)"
    result = sandbox.run(_spec(tmp_path, code))
    assert result.exit_code == 3
    assert result.stdout.split() == ["hello", str(tmp_path)]
    assert result.stderr == "err"
    assert not result.timed_out


def test_wall_clock_limit_kills_the_whole_group(sandbox: Sandbox, tmp_path: Path) -> None:
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "time.sleep(60)"
    )
    result = sandbox.run(_spec(tmp_path, code, timeout_s=1.0))
    assert result.timed_out
    assert result.duration_s < 10


def test_memory_limit(sandbox: Sandbox, tmp_path: Path) -> None:
    result = sandbox.run(_spec(tmp_path, "x = bytearray(b'1') * 2_000_000_000", memory_mb=512))
    assert result.exit_code in (-9, 137)  # killed by the cgroup's OOM killer, not a MemoryError
    assert result.limit == "memory"


def test_address_space_is_not_limited(sandbox: Sandbox, tmp_path: Path) -> None:
    """Reserving address space it never touches (as CUDA and JAX do) is not using memory."""
    code = "import mmap; m = mmap.mmap(-1, 4 << 30); m[0] = 1; print('reserved')"
    result = sandbox.run(_spec(tmp_path, code, memory_mb=256))
    assert (result.exit_code, result.stdout.strip(), result.limit) == (0, "reserved", None), result.stderr


def test_signal_death_is_a_negative_exit_code(sandbox: Sandbox, tmp_path: Path) -> None:
    result = sandbox.run(_spec(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"))
    assert result.exit_code in (-11, 139)


def test_bwrap_hides_the_original_workspace_and_the_network(tmp_path: Path) -> None:
    original = tmp_path / "original"
    original.mkdir()
    (original / "secret.txt").write_text("original workspace")
    venv = original / ".venv"
    venv.mkdir()
    (venv / "marker").write_text("interpreter files")
    ws = tmp_path / "replay"
    ws.mkdir()
    code = (
        "import os, socket\n"
        f"print(os.path.exists({str(original / 'secret.txt')!r}))\n"
        f"print(open({str(venv / 'marker')!r}).read())\n"
        "s = socket.socket()\n"
        "try:\n"
        "    s.connect(('127.0.0.1', 9)); print('net')\n"
        "except OSError as e:\n"
        "    print('no-net')\n"
        "open('written.txt', 'w').write('ok')\n"
        "try:\n"
        "    open('/usr/flaketriage-probe', 'w')\n"
        "except OSError:\n"
        "    print('read-only')\n"
    )
    result = BubblewrapSandbox().run(_spec(ws, code, host=HostView(hidden=[original], readable=[venv])))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split("\n")[:4] == ["False", "interpreter files", "no-net", "read-only"]
    assert (ws / "written.txt").read_text() == "ok"


def test_process_sandbox_is_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert isinstance(make_sandbox("auto"), ProcessSandbox)
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        BubblewrapSandbox()
