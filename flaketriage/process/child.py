"""Running a command as a child process: output streamed and collected, a wall-clock limit.

Shared by capture (the original run, echoed live) and replay (the sandboxed reruns, silent). Also
what an exit status means: a wrapper (a shell, bubblewrap) reports death by signal N as 128 + N.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Literal

from flaketriage.errors import CaptureError, ConfigError
from flaketriage.process import interrupts, reaper
from flaketriage.process.hangs import HangDump, dump_hung

MAX_KEPT_BYTES = 64 << 20  # per stream; the head is dropped past this, the tail is what matters

Limit = Literal["timeout", "memory", "pids", "network", "filesystem"]
"""A sandbox limit a run broke: its time limit, its memory, its number of processes, the network it
was denied, or the file system outside its workspace, read-only to it."""


@dataclass(frozen=True)
class ProcessResult:
    """What one run produced."""

    exit_code: int
    """The exit status; negative N when killed by signal N (the subprocess convention)."""
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    wrapped_signals: bool = False
    """The command ran under a wrapper that reports death by signal N as exit status 128 + N (a
    shell, bubblewrap), so such a status stands for that signal: see `unwrapped_exit_code`."""
    hang: HangDump | None = None
    """For a run that timed out: its Python stacks, dumped before it was killed
    (`flaketriage.process.hangs`)."""
    limit: Limit | None = None
    """The sandbox limit the run broke, when one did (a run over its time limit is ``timeout``):
    whether that makes the run a reproduction or a sandbox outcome is the replay's to decide."""
    cpu_s: float | None = None
    """User plus system CPU seconds of the process and every descendant it waited for (a reaper or
    bubblewrap waits for all of them), from ``wait4``; None where it could not be measured (a
    container, a run ended by an interrupt)."""

    @property
    def unwrapped_exit_code(self) -> int:
        """`exit_code`, with a wrapper's 128 + N read back as -N when N is a signal that kills."""
        return unwrap_signal(self.exit_code) if self.wrapped_signals else self.exit_code


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


def _start_pumps(
    proc: subprocess.Popen[bytes], out: list[bytes], err: list[bytes], echo: bool
) -> list[threading.Thread]:
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, out, _echo_to(sys.stdout) if echo else None)),
        threading.Thread(target=_pump, args=(proc.stderr, err, _echo_to(sys.stderr) if echo else None)),
    ]
    for t in pumps:
        t.daemon = True
        t.start()
    return pumps


def run_command(
    argv: Sequence[str],
    cwd: str | os.PathLike[str],
    env: Mapping[str, str],
    timeout_s: float | None = None,
    echo: bool = False,
    preexec: Callable[[], None] | None = None,
    contain: bool = False,
    dump_hang: bool = True,
) -> ProcessResult:
    """Run `argv` to completion, or until `timeout_s` or an interrupt: then its process group is killed.

    With `contain` (replays) the command runs under a `flaketriage.process.reaper`, so every process it
    started ends with it, whether it exited, timed out or was interrupted, even those that left its
    process group. Without it (capture) what the command leaves running when it exits is its own.
    A command that cannot start raises `CaptureError`: nothing ran. A run that passes `timeout_s`
    has its Python stacks dumped before it is killed (`ProcessResult.hang`), unless `dump_hang` is
    False.
    """
    check_command(argv)
    check_timeout(timeout_s, "the time limit")
    started = time.monotonic()
    runner = reaper.script_argv() if contain else None
    status_r, status_w = os.pipe() if runner else (-1, -1)
    hold = interrupts.Hold()  # an interrupt while the child starts would leave it with no pid to end
    try:
        proc = subprocess.Popen(
            [*runner, str(status_w), str(os.getpid()), *argv] if runner else list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=preexec,
            pass_fds=(status_w,) if runner else (),
        )
    except BaseException as exc:
        if runner:
            os.close(status_r)
        hold.release()
        if isinstance(exc, OSError):
            raise _start_error(argv[0], cwd, exc) from exc
        raise
    finally:
        if runner:
            os.close(status_w)
    out: list[bytes] = []
    err: list[bytes] = []
    ending = _Ending(proc, reaped=runner is not None)
    if dump_hang:
        ending.dump = lambda pid: dump_hung(
            pid,
            lambda: sum(map(len, err)),
            lambda n: b"".join(err)[-n:] if n > 0 else b"",
            below_only=runner is not None,  # the reaper is Python too, and ours
        )
    timer: threading.Timer | None = None
    try:
        try:
            pumps = _start_pumps(proc, out, err, echo)
            # A timer ends the run on timeout, so the wait itself blocks in waitpid:
            # Popen.wait(timeout=...) polls with sleeps of up to 50 ms, which would dominate short replays.
            if timeout_s is not None:
                timer = threading.Timer(timeout_s, ending.on_timeout)
                timer.daemon = True
                timer.start()
            hold.release()
            cpu_s = _wait_cpu(proc)
        except BaseException:  # Ctrl-C, or SIGTERM/SIGHUP that the CLI turned into an exception
            ending.on_interrupt()
            hold.release()  # raises an interrupt that arrived meanwhile, if any
            raise
        finally:
            if timer is not None:
                timer.cancel()
            ending.finished.set()
        status = _read_status(status_r) if runner else ""
    finally:
        if runner:
            os.close(status_r)
    for t in pumps:
        t.join(timeout=10)
    return ProcessResult(
        exit_code=_exit_code(proc, status, argv[0], cwd),
        stdout=b"".join(out).decode("utf-8", "replace"),
        stderr=b"".join(err).decode("utf-8", "replace"),
        timed_out=ending.timed_out,
        duration_s=time.monotonic() - started,
        wrapped_signals=runs_in_shell(argv, cwd, env),
        hang=ending.hang,
        limit="timeout" if ending.timed_out else None,
        cpu_s=cpu_s,
    )


def _wait_cpu(proc: subprocess.Popen[bytes]) -> float:
    """Wait for `proc` as ``Popen.wait`` does, and return the CPU seconds it and its waited-for
    descendants used. ``wait4`` reads them for this child alone, so triages running in other threads
    of this process are not counted, as ``RUSAGE_CHILDREN`` deltas would count them."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


class _Ending:
    """Ends a run early, on its time limit (from the timer thread) or an interrupt (the waiting one)."""

    GRACE_S = 10.0
    """How long a reaper gets to end its command before it is killed with what is below it."""

    def __init__(self, proc: subprocess.Popen[bytes], *, reaped: bool) -> None:
        self.proc = proc
        self.reaped = reaped
        self.finished = threading.Event()
        """Set once the waiting thread saw the process exit."""
        self.timed_out = False
        self.dump: Callable[[int], HangDump | None] | None = None
        """Dumps the stacks of a run that timed out, before it is ended (`flaketriage.process.hangs`)."""
        self.hang: HangDump | None = None

    def request(self) -> None:
        """A reaper is sent SIGTERM (it ends the command and all below it); a plain group is killed."""
        if self.reaped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
        else:
            _kill_group(self.proc.pid)

    def force(self) -> None:
        """Kill a reaper that did not end in time, and what is still below it."""
        reaper.kill_all(reaper.descendants(self.proc.pid))
        _kill_group(self.proc.pid)

    def on_timeout(self) -> None:
        self.timed_out = True
        if self.dump is not None:
            try:
                self.hang = self.dump(self.proc.pid)
            except Exception:  # evidence only: a failed dump must never keep a run alive
                self.hang = None
        self.request()
        if self.reaped and not self.finished.wait(self.GRACE_S):
            self.force()

    def on_interrupt(self) -> None:
        self.request()
        try:
            self.proc.wait(self.GRACE_S)  # reap it, or it lingers as a zombie until we exit
        except subprocess.TimeoutExpired:
            self.force()
            self.proc.wait()


def _read_status(fd: int) -> str:
    """What the reaper wrote: ``status N`` or ``error ERRNO``; empty when it was killed first."""
    return os.read(fd, 256).decode("ascii", "replace").strip()


def _exit_code(proc: subprocess.Popen[bytes], status: str, program: str, cwd: str | os.PathLike[str]) -> int:
    """The command's exit code: what its reaper reported, else the process's own."""
    word, _, number = status.partition(" ")
    if word == "error":  # the reaper could not start the command
        raise _start_error(program, cwd, OSError(int(number), os.strerror(int(number))))
    if word == "status":
        return int(number)
    assert proc.returncode is not None
    return proc.returncode


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def shell_exit_code(exit_code: int) -> int:
    """The status a shell reports: 128 + N for a child killed by signal N."""
    return 128 - exit_code if exit_code < 0 else exit_code


# Signals whose default action is to stop, continue or nothing: no process dies of them, so 128 + N
# for one of these is an ordinary exit status.
_HARMLESS = {"SIGCHLD", "SIGCONT", "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGURG", "SIGWINCH"}
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash"})
"""Interpreters known to report a child's death by signal N as their own exit status 128 + N."""


def unwrap_signal(exit_code: int) -> int:
    """The inverse of `shell_exit_code`: 128 + N becomes -N when signal N can kill a process.

    Only for a status known to come from a wrapper (`ProcessResult.wrapped_signals`): a program
    may also ``exit(139)`` on its own.
    """
    number = exit_code - 128
    try:
        name = signal.Signals(number).name
    except ValueError:
        realtime = signal.SIGRTMIN <= number <= signal.SIGRTMAX
        return -number if realtime else exit_code
    return exit_code if name in _HARMLESS else -number


def runs_in_shell(argv: Sequence[str], cwd: str | os.PathLike[str], env: Mapping[str, str]) -> bool:
    """Whether `argv` is a shell, or a script whose ``#!`` line names one (``env`` allowed)."""
    if not argv:
        return False
    program = argv[0]
    if os.path.basename(program) in SHELLS:
        return True
    path = os.path.join(cwd, program) if os.sep in program else shutil.which(program, path=env.get("PATH"))
    try:
        with open(path or "", "rb") as fh:
            first = fh.readline(256)
    except OSError:
        return False
    if not first.startswith(b"#!"):
        return False
    try:
        words = shlex.split(first[2:].decode("utf-8", "replace"))
    except ValueError:
        return False
    if words and os.path.basename(words[0]) == "env":  # #!/usr/bin/env [-S] bash
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    return bool(words) and os.path.basename(words[0]) in SHELLS


def check_command(argv: Sequence[str]) -> None:
    """Refuse a command that names nothing to run (raises `CaptureError`)."""
    if not argv:
        raise CaptureError("no command given: put the command after `--`, e.g. `-- python train.py`")
    if not argv[0].strip():
        raise CaptureError(
            f"the command is empty ({argv[0]!r}): name the program to run after `--`, "
            "e.g. `-- python train.py`"
        )


def check_timeout(seconds: float | None, what: str) -> None:
    """Refuse a time limit that is not a finite number of seconds above 0 (raises `ConfigError`)."""
    if seconds is None:
        return
    if not (math.isfinite(seconds) and 0 < seconds <= threading.TIMEOUT_MAX):
        raise ConfigError(
            f"{what} must be a finite number of seconds above 0, got {seconds}; give one such as "
            "600, or leave it out"
        )


def _start_error(program: str, cwd: str | os.PathLike[str], exc: OSError) -> CaptureError:
    """Why the command could not start, in one line (nothing ran)."""
    if exc.errno == errno.ENOENT:
        return CaptureError(
            f"command not found: {program!r} (not an executable on PATH or a path that exists); "
            "check the spelling or activate the environment that provides it"
        )
    if exc.errno == errno.ENOEXEC:
        return CaptureError(
            f"cannot execute {program!r}: exec format error (not a program, and no `#!` line naming an "
            f"interpreter); add one such as `#!/bin/sh`, or run it through its interpreter, e.g. "
            f"`-- sh {program}`"
        )
    if exc.errno in (errno.EACCES, errno.EISDIR) and os.path.isdir(os.path.join(cwd, program)):
        return CaptureError(f"cannot execute {program!r}: it is a directory; name a program to run")
    if exc.errno == errno.EACCES:
        return CaptureError(f"cannot execute {program!r}: permission denied; is it executable?")
    return CaptureError(f"cannot execute {program!r}: {exc.strerror or exc}")
