"""The limits of a replay on this machine (bubblewrap, a plain process), and how a breach is recognized.

Memory, processes and CPU are limited by a `Cgroup` per run where one can be made, because the
kernel then counts everything the run starts and says when it hit the limit. Memory falls back to
``RLIMIT_AS`` only where no cgroup can be made (said once in the log): an address-space limit breaks
programs that reserve more than they touch, CUDA and JAX among them. A run denied the network that
fails reaching it, one that failed writing outside its workspace, and a container whose fork was
refused are recognized from what they printed, since no counter says so (`network_breach`,
`filesystem_breach`, `pids_breach`).
"""

from __future__ import annotations

import dataclasses
import logging
import resource
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from flaketriage.process import reaper
from flaketriage.process.child import Limit, ProcessResult, run_command
from flaketriage.workers.sandbox.base import SandboxSpec, readable_paths
from flaketriage.workers.sandbox.cgroup import Cgroup, Controller
from flaketriage.workers.sandbox.namespaces import PRIVATE_TMP, Namespaces, interpreter_environment

log = logging.getLogger(__name__)

TAIL_CHARS = 4000
"""How much of the end of a run's output is searched for a breach: where its last error is."""

NETWORK_DENIED = (
    "Network is unreachable",  # ENETUNREACH: no route (a namespace whose loopback is down, too)
    "Temporary failure in name resolution",  # EAI_AGAIN: no DNS server reachable
    "Name or service not known",
    "No address associated with hostname",
    "Connection refused",  # a container's own loopback: nothing of the host listens there
    "Cannot assign requested address",  # binding an address the namespace does not have
)
"""What a program prints when it reaches for a network its sandbox denied (glibc and errno texts)."""

FORK_REFUSED = (
    "BlockingIOError: [Errno 11]",
    "fork: Resource temporarily unavailable",
    "fork: retry",
    "can't fork",
    "Cannot fork",
    "can't start new thread",
)
"""What a program prints when ``fork`` or ``clone`` fails for its process limit (EAGAIN)."""

READ_ONLY = ("Read-only file system",)
"""What a program prints when it writes outside its workspace (EROFS): all else is read-only to it."""

MEMORY_REFUSED = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
"""What a program prints when an address-space limit refused an allocation."""

_said: set[str] = set()
_said_lock = threading.Lock()


def say_once(message: str) -> None:
    """Log a warning about this machine's limits once per process."""
    with _said_lock:
        if message in _said:
            return
        _said.add(message)
    log.warning("%s", message)


def _tail(result: ProcessResult) -> str:
    return result.stderr[-TAIL_CHARS:] + "\n" + result.stdout[-TAIL_CHARS:]


def network_breach(result: ProcessResult, spec: SandboxSpec) -> bool:
    """Whether a run denied the network failed reaching for it."""
    failed = result.exit_code != 0
    return failed and not spec.network and any(marker in _tail(result) for marker in NETWORK_DENIED)


def filesystem_breach(result: ProcessResult) -> bool:
    """Whether a failed run says a write was refused because the file system is read-only to it."""
    return result.exit_code != 0 and any(marker in _tail(result) for marker in READ_ONLY)


def pids_breach(result: ProcessResult) -> bool:
    """Whether a failed run says a fork or thread was refused."""
    return result.exit_code != 0 and any(marker in _tail(result) for marker in FORK_REFUSED)


def first_limit(*limits: Limit | None) -> Limit | None:
    """The limit that explains a run's end: the first one found, in the order given."""
    return next((limit for limit in limits if limit is not None), None)


@dataclass(frozen=True)
class LocalLimits:
    """Limits every local replay gets besides the spec's time and memory: processes and CPUs."""

    pids: int | None = None
    """Most processes and threads the run may have at once (a fork bomb stops there)."""
    cpus: float | None = None
    """CPU time per second of wall-clock the run may use (1.5 = one and a half cores)."""

    def run(
        self, argv: Sequence[str], spec: SandboxSpec, *, contain: bool, isolate: bool = False
    ) -> ProcessResult:
        """Run `argv` for `spec` inside a fresh cgroup (removed after, with whatever is left in it).

        With `isolate` the run also gets namespaces of its own where this process may make them:
        no network (unless the spec allows it), nothing writable but its workspace (`Namespaces`).
        """
        cgroup = Cgroup.create(memory_mb=spec.memory_mb, pids=self.pids, cpus=self.cpus)
        try:
            _warn_missing(cgroup.missing)
            rlimit = spec.memory_mb if "memory" in cgroup.missing else None
            unshare, private_tmp = _isolation(spec) if isolate else (None, False)
            # As bwrap and the containers do: a temp directory the run recorded (a CI runner's, a
            # pytester's under /tmp) is not there, or not writable, behind the private /tmp.
            env = {**spec.env, "TMPDIR": str(PRIVATE_TMP)} if private_tmp else spec.env
            result = run_command(
                argv,
                spec.cwd,
                env,
                spec.timeout_s,
                preexec=_preexec(cgroup, rlimit, unshare),
                contain=contain,
            )
            breach = cgroup.breach()
        finally:
            cgroup.close()
        refused = (
            rlimit is not None and result.exit_code != 0 and any(m in _tail(result) for m in MEMORY_REFUSED)
        )
        limit = first_limit(
            breach,
            "memory" if refused else None,
            result.limit,
            "network" if network_breach(result, spec) else None,
            "filesystem" if filesystem_breach(result) else None,
        )
        return dataclasses.replace(result, limit=limit)


def _warn_missing(missing: list[Controller]) -> None:
    if "memory" in missing:
        say_once(
            "no memory cgroup can be made here (cgroup v1's memory controller or v2 with memory "
            "delegated, as root or to this user), so replays' memory is limited by RLIMIT_AS: programs "
            "that reserve address space (CUDA, JAX) may fail under it; run the worker where it can make "
            "cgroups, or unset FLAKETRIAGE_REPLAY_MEMORY_MB"
        )
    if "pids" in missing:
        say_once(
            "no pids cgroup can be made here, so replays run without a process limit (a fork bomb is "
            "only stopped by the time limit); run the worker where it can make cgroups"
        )
    if "cpu" in missing:
        say_once("no cpu cgroup can be made here, so FLAKETRIAGE_REPLAY_CPUS is not applied to local replays")


def _preexec(
    cgroup: Cgroup, rlimit_mb: int | None, unshare: Callable[[], None] | None
) -> Callable[[], None] | None:
    """What the child does before it runs the command: join the groups, apply the fallback limit,
    leave the network."""
    if not cgroup.groups and rlimit_mb is None and unshare is None:
        return None

    def apply() -> None:
        cgroup.join()
        if rlimit_mb is not None:
            limit = rlimit_mb << 20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if unshare is not None:
            unshare()

    return apply


def _isolation(spec: SandboxSpec) -> tuple[Callable[[], None] | None, bool]:
    """The child's part of the process sandbox's namespaces (the most this process can make here),
    and whether the run gets a private /tmp."""
    full = Namespaces(network=not spec.network, files=True)
    if full.usable():
        # The run's own paths, and the reaper's: it starts inside the namespaces, as this
        # interpreter running flaketriage's reaper script, both perhaps under the private /tmp.
        own = [interpreter_environment(), Path(reaper.__file__).resolve().parent]
        readable = [*readable_paths(spec, [PRIVATE_TMP]), *own]
        return full.preexec(spec.workspace.resolve(), spec.cwd, readable), True
    say_once(
        "the process sandbox cannot make a mount namespace here (not root, and user namespaces are "
        "off), so its replays may write outside their workspace; install bubblewrap or use the docker "
        "sandbox"
    )
    if spec.network:
        return None, False
    network = Namespaces(network=True, files=False)
    if network.usable():
        return network.preexec(spec.workspace, spec.cwd, ()), False
    say_once(
        "the process sandbox cannot make a network namespace here either, so its replays reach the "
        "network; install bubblewrap or use the docker sandbox"
    )
    return None, False
