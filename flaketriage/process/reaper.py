"""The reaper: a small parent process that runs one command and ends everything it started.

Replays run as ``python -I -S reaper.py STATUS_FD PARENT_PID CMD [ARGS...]``. The reaper makes
itself a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), so a descendant that leaves the
command's process group or session (``setsid``, a double fork) is re-parented to the reaper instead
of to init, and stays findable. It starts the command in a process group of its own (so ``kill 0``
in the command cannot hit the reaper), reaps orphans as they die, and when the command exits, or
the reaper gets SIGTERM or SIGHUP (a time limit, an interrupt, its parent's death), it kills every
descendant still alive, reaps them, and writes how the command ended to STATUS_FD: ``status N``
(an exit code, negative N for death by signal N) or ``error ERRNO`` when the command could not
start.

A reaper per run keeps the subreaper attribute off the worker, whose threads may run other triages.
As a script it needs nothing but the standard library: ``-I`` keeps the command's ``PYTHON*``
variables and the user's site-packages away from it.
"""

from __future__ import annotations

import os
import sys
import time

# Every replay starts this script, so it imports little: the ``signal`` module (enum and all) and
# contextlib would double its start-up time. The C module holds the same functions and numbers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
else:
    import _signal as signal

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
END_WITHIN_S = 5.0
"""How long the reaper keeps killing descendants (a fork bomb outruns one pass) before it gives up."""
_PROC = "/proc"


def script_argv() -> list[str] | None:
    """How to start a reaper (STATUS_FD, PARENT_PID and the command follow), or None where none runs."""
    if not sys.executable or not sys.platform.startswith("linux"):
        return None
    return [sys.executable, "-I", "-S", os.path.abspath(__file__)]


def descendants(root: int) -> list[int]:
    """Every live process whose chain of parents leads to `root`, read from ``/proc``."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir(_PROC)
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"{_PROC}/{name}/stat", "rb") as fh:
                stat = fh.read()
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone since the listing, or not ours to read
        children.setdefault(ppid, []).append(int(name))
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:  # noqa: SIM105 (no contextlib here)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass  # already gone


class _Stop(BaseException):
    """SIGTERM or SIGHUP reached the reaper: end the command now."""


_ending = False


def _stop(signum: int, frame: object) -> None:
    global _ending
    if not _ending:
        _ending = True
        raise _Stop


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # no prctl (another kernel): the process group is still ended


def _end_everything(me: int, command: int, status: int | None) -> int | None:
    """Kill the command (when still running) and every descendant; reap them; the command's status."""
    if status is None:  # not reaped yet, so its group id cannot have been reused
        try:  # noqa: SIM105
            os.killpg(command, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + END_WITHIN_S
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status  # no child left: nothing below the reaper is alive
        if pid == command:
            status = os.waitstatus_to_exitcode(wait_status)
        if pid:
            continue
        if time.monotonic() > deadline:
            return status
        kill_all(descendants(me))
        time.sleep(0.002)


def _original_environ() -> dict[bytes, bytes]:
    """The environment the reaper was started with: Python itself adds ``LC_CTYPE`` in a C locale
    (PEP 538), which the command must not inherit."""
    try:
        with open("/proc/self/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return dict(os.environb)
    pairs = (entry.partition(b"=") for entry in raw.split(b"\0") if b"=" in entry)
    return {name: value for name, _, value in pairs}


def _report(status_fd: int, line: str) -> None:
    try:  # noqa: SIM105
        os.write(status_fd, f"{line}\n".encode())
    except OSError:
        pass  # the parent is gone; nobody is left to tell


# What the command gets back as the default: Python ignores SIGPIPE and SIGXFSZ, and the reaper
# catches or ignores the rest.
_RESTORED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ)


def main(argv: list[str]) -> int:
    global _ending
    status_fd, parent = int(argv[0]), int(argv[1])
    command = list(argv[2:])
    env = _original_environ()
    os.set_inheritable(status_fd, False)  # the command and its children must not hold the pipe
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides about interrupts
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # the worker died: end the run rather than orphan it
    status: int | None = None
    started: int | None = None
    try:
        if os.getppid() != parent:
            return 0  # the parent died before PR_SET_PDEATHSIG was in place
        started = os.posix_spawnp(command[0], command, env, setpgroup=0, setsigdef=_RESTORED)
        while status is None:
            pid, wait_status = os.wait()  # reaps orphans too, as they die
            if pid == started:
                status = os.waitstatus_to_exitcode(wait_status)
        _ending = True
    except _Stop:
        pass
    except OSError as exc:
        if started is None:
            _report(status_fd, f"error {exc.errno or 0}")
            return 0
    _ending = True
    if started is not None:
        status = _end_everything(os.getpid(), started, status)
    if status is not None:
        _report(status_fd, f"status {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
