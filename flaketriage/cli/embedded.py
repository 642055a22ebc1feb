"""`EmbeddedService`: the receiver, a Celery worker and beat of one store, run as child processes of
one command (``flaketriage demo``), watched while it runs and stopped together.

Each child is ``flaketriage serve``, ``worker`` or ``beat`` as a team starts them, on the embedded
default (SQLite records and the local broker file beside the store), in a session of its own: a
Ctrl-C typed in the terminal reaches the command alone, which then ends the children in order
(SIGTERM to each one's process group, SIGKILL to what is left after a grace period, and to any
process they started that outlived them), so nothing is left running. A child that exits early is
one `EmbeddedServiceError` naming it and its log.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from flaketriage.errors import ConfigError, EmbeddedServiceError
from flaketriage.process import interrupts, reaper

HOST = "127.0.0.1"
STOP_GRACE_S = 10.0
"""How long the children have to end after SIGTERM (a worker finishes the replay it runs)."""
PORT_TRIES = 3
"""Free ports tried when the one chosen is taken between choosing it and the receiver binding it."""
_PR_SET_PDEATHSIG = 1


@dataclass
class Child:
    """One process of the service: its name (``receiver``, ``worker``, ``beat``), command and log."""

    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def exited(self) -> int | None:
        """Its exit status when it has ended, else None."""
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 1) -> str:
        """The last non-empty lines of its log, on one line."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        kept = [line.strip() for line in text.splitlines() if line.strip()]
        return " | ".join(kept[-lines:])


@dataclass
class EmbeddedService:
    """The service's three processes for the store `store`, their logs under `logs`.

    `port` None: a free port on 127.0.0.1 (another one should it be taken before the receiver binds
    it). `env` is the children's environment (the store and the webhook secret in it).
    """

    store: Path
    logs: Path
    env: Mapping[str, str]
    cwd: Path
    port: int | None = None
    concurrency: int = 2
    children: list[Child] = field(default_factory=list)
    _chosen_port: bool = False

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    # -- starting -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the receiver, the worker and beat (without waiting for them: see `wait_ready`)."""
        if self.port is None:
            self.port, self._chosen_port = free_port(), True
        elif port_taken(self.port):
            raise ConfigError(
                f"port {self.port} on {HOST} is taken by another program: pass another --port, or leave "
                "--port out for a free one"
            )
        self.logs.mkdir(parents=True, exist_ok=True)
        base = [sys.executable, "-m", "flaketriage"]
        commands = {
            "receiver": ["serve", "--host", HOST, "--port", str(self.port)],
            "worker": ["worker", "--concurrency", str(self.concurrency)],
            "beat": ["beat"],
        }
        self.children = [
            Child(name, [*base, *args], self.logs / f"{name}.log") for name, args in commands.items()
        ]
        try:
            for child in self.children:
                self._spawn(child)
        except BaseException:  # an interrupt, or a child that cannot start: end those started
            self.stop()
            raise

    def _spawn(self, child: Child) -> None:
        hold = interrupts.Hold()  # an interrupt now would leave a child with no pid to end
        try:
            with open(child.log, "ab") as log:  # the child keeps its own copy of the descriptor
                child.proc = subprocess.Popen(
                    child.argv,
                    cwd=self.cwd,
                    env=dict(self.env),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # Ctrl-C is ours to pass on, in order
                    preexec_fn=_end_with_parent(),
                )
        except OSError as exc:
            raise EmbeddedServiceError(f"could not start the {child.name} ({child.argv[3]}): {exc}") from exc
        finally:
            hold.release()

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Wait until the receiver answers ``/readyz`` (its database and broker are up), watching
        every child."""
        import httpx

        deadline = time.monotonic() + timeout_s
        tries = 1
        while True:
            receiver = self.children[0]
            if (
                receiver.exited() is not None
                and self._chosen_port
                and tries < PORT_TRIES
                and _lost_port(receiver)
            ):
                tries += 1  # another program took the free port first: take another one
                self.port = free_port()
                receiver.argv[receiver.argv.index("--port") + 1] = str(self.port)
                self._spawn(receiver)
            self.check()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise EmbeddedServiceError(
                    f"the receiver on {self.url} was not ready after {timeout_s:.0f} s; its log: "
                    f"{receiver.log} ({receiver.log_tail() or 'empty'})"
                )
            time.sleep(0.2)

    # -- watching -------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise `EmbeddedServiceError` naming the first child that has exited."""
        for child in self.children:
            status = child.exited()
            if status is not None:
                how = (
                    f"was killed by {_signal_name(-status)}" if status < 0 else f"exited with status {status}"
                )
                raise EmbeddedServiceError(
                    f"the service's {child.name} {how}; the demo stopped the rest. Its log: {child.log}"
                    + (f" (last line: {tail})" if (tail := child.log_tail()) else "")
                )

    # -- stopping -------------------------------------------------------------------------------
    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """End every child and everything they started: SIGTERM to each child (a worker ends its
        pool itself), then SIGKILL to what is left of its process group after `grace_s`, and to
        the processes they started that left the group (a replay's reaper and its command)."""
        started = _with_start_times(reaper.descendants(os.getpid()))
        running = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for child in self.children:
            if child.proc is not None:
                _signal_group(child.proc.pid, signal.SIGKILL)  # the group may outlive its leader
                child.proc.wait()  # reaped: no zombie left behind either
        for pid, start in started.items():
            if _start_time(pid) == start:  # the same process, not a new one with its number
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> EmbeddedService:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # A second interrupt while the children end must not cut their ending short.
        previous = {
            s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        }
        try:
            self.stop()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def port_taken(port: int) -> bool:
    """Whether another program holds `port` on 127.0.0.1."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise ConfigError(f"cannot listen on {HOST}:{port}: {exc}") from exc
    return False


def _lost_port(receiver: Child) -> bool:
    return "address already in use" in receiver.log_tail(5).lower()


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, from ``/proc``), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _with_start_times(pids: Sequence[int]) -> dict[int, int]:
    return {pid: start for pid in pids if (start := _start_time(pid)) is not None}


def _end_with_parent() -> Callable[[], None] | None:
    """For Linux: a function a child runs before its command, so that it gets SIGTERM should this
    process die without ending it (SIGKILL, the OOM killer). Elsewhere, None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the forked child
    except (OSError, AttributeError):
        return None

    def end_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    return end_with_parent
