"""Running a command as a child process: output streamed and collected, a wall-clock limit.

Shared by capture (the original run, echoed live) and replay (the sandboxed reruns, silent).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from flaketriage.errors import CaptureError

MAX_KEPT_BYTES = 64 << 20  # per stream; the head is dropped past this, the tail is what matters


@dataclass(frozen=True)
class ProcessResult:
    """What one run produced."""

    exit_code: int
    """The exit status; negative N when killed by signal N (the subprocess convention)."""
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float


def _echo_to(stream: IO[str]) -> Callable[[bytes], None]:
    binary: IO[bytes] | None = getattr(stream, "buffer", None)

    def write(chunk: bytes) -> None:
        if binary is not None:
            binary.write(chunk)
            binary.flush()
        else:  # a text-only stream (a test runner's capture): decode as we go
            stream.write(chunk.decode("utf-8", "replace"))
            stream.flush()

    return write


def _pump(src: IO[bytes], sink: list[bytes], echo: Callable[[bytes], None] | None) -> None:
    kept = 0
    for chunk in iter(lambda: src.read1(65536), b""):  # type: ignore[attr-defined]
        if echo is not None:
            echo(chunk)
        sink.append(chunk)
        kept += len(chunk)
        while kept > MAX_KEPT_BYTES and len(sink) > 1:
            kept -= len(sink.pop(0))
    src.close()


def run_command(
    argv: Sequence[str],
    cwd: str | os.PathLike[str],
    env: Mapping[str, str],
    timeout_s: float | None = None,
    echo: bool = False,
    preexec: Callable[[], None] | None = None,
) -> ProcessResult:
    """Run `argv` to completion (or until `timeout_s`, then kill its process group)."""
    if not argv:
        raise CaptureError("no command given: put the command after `--`, e.g. `-- python train.py`")
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=preexec,
        )
    except FileNotFoundError as exc:
        raise CaptureError(
            f"command not found: {argv[0]!r} (not an executable on PATH or a path that exists); "
            "check the spelling or activate the environment that provides it"
        ) from exc
    except PermissionError as exc:
        raise CaptureError(f"cannot execute {argv[0]!r}: permission denied; is it executable?") from exc
    out: list[bytes] = []
    err: list[bytes] = []
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, out, _echo_to(sys.stdout) if echo else None)),
        threading.Thread(target=_pump, args=(proc.stderr, err, _echo_to(sys.stderr) if echo else None)),
    ]
    for t in pumps:
        t.daemon = True
        t.start()
    # A timer kills on timeout, so the wait itself blocks in waitpid: Popen.wait(timeout=...)
    # polls with sleeps of up to 50 ms, which would dominate short replays.
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        _kill_group(proc)

    timer = threading.Timer(timeout_s, expire) if timeout_s is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        proc.wait()
    except KeyboardInterrupt:
        _kill_group(proc)
        proc.wait()  # reap it, or it lingers as a zombie until we exit
        raise
    finally:
        if timer is not None:
            timer.cancel()
    timed_out = expired.is_set()
    for t in pumps:
        t.join(timeout=10)
    return ProcessResult(
        exit_code=proc.returncode,
        stdout=b"".join(out).decode("utf-8", "replace"),
        stderr=b"".join(err).decode("utf-8", "replace"),
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def shell_exit_code(exit_code: int) -> int:
    """The status a shell reports: 128 + N for a child killed by signal N."""
    return 128 - exit_code if exit_code < 0 else exit_code
