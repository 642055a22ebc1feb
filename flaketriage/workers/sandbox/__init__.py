"""Sandboxes for replays: bubblewrap namespaces, a plain process, Docker containers, and an in-memory
stand-in."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from flaketriage.workers.sandbox.base import HostView, MemorySandbox, Sandbox, SandboxSpec
from flaketriage.workers.sandbox.bwrap import BubblewrapSandbox, bwrap_path
from flaketriage.workers.sandbox.limits import LocalLimits
from flaketriage.workers.sandbox.process import ProcessSandbox

if TYPE_CHECKING:
    from flaketriage.settings import Settings

__all__ = [
    "BubblewrapSandbox",
    "HostView",
    "LocalLimits",
    "MemorySandbox",
    "ProcessSandbox",
    "Sandbox",
    "SandboxSpec",
    "make_sandbox",
]


UNISOLATED = (
    "bubblewrap (bwrap) is not on PATH, so replays run as plain processes, not isolated: no network "
    "or file-system protection; install bubblewrap (`apt-get install bubblewrap`, `dnf install "
    "bubblewrap`), or set FLAKETRIAGE_SANDBOX=process to choose unisolated replays"
)
"""What ``auto`` says when it falls back to the process sandbox."""


def make_sandbox(
    kind: str = "auto", warn: Callable[[str], None] | None = None, *, settings: Settings | None = None
) -> Sandbox:
    """The sandbox named by the `sandbox` setting (``auto`` picks bubblewrap when installed).

    ``auto`` never falls back silently: without bubblewrap it calls `warn` with `UNISOLATED`.
    `settings` gives the limits (processes, CPUs) and, for ``docker``, the engine and images.
    """
    pids = settings.replay_pids_limit if settings is not None else None
    cpus = settings.replay_cpus if settings is not None else None
    if kind == "docker":
        from flaketriage.workers.sandbox.containers import DockerSandbox

        if settings is None:
            return DockerSandbox.connect()
        return DockerSandbox.connect(
            settings.docker_url,
            base_image=settings.docker_base_image,
            mounts=settings.docker_mounts,
            pids_limit=pids,
            cpus=cpus,
        )
    limits = LocalLimits(pids=pids, cpus=cpus)
    if kind == "auto" and bwrap_path() is None:
        if warn is not None:
            warn(UNISOLATED)
        return ProcessSandbox(limits)
    if kind == "process":
        return ProcessSandbox(limits)
    return BubblewrapSandbox(limits=limits)
