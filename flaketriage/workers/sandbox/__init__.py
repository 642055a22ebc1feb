"""Sandboxes for replays: bubblewrap namespaces, a plain process, and an in-memory stand-in."""

from __future__ import annotations

from collections.abc import Callable

from flaketriage.workers.sandbox.base import MemorySandbox, Sandbox, SandboxSpec
from flaketriage.workers.sandbox.bwrap import BubblewrapSandbox, bwrap_path
from flaketriage.workers.sandbox.process import ProcessSandbox

__all__ = ["BubblewrapSandbox", "MemorySandbox", "ProcessSandbox", "Sandbox", "SandboxSpec", "make_sandbox"]


UNISOLATED = (
    "bubblewrap (bwrap) is not on PATH, so replays run as plain processes, not isolated: no network "
    "or file-system protection; install bubblewrap (`apt-get install bubblewrap`, `dnf install "
    "bubblewrap`), or set FLAKETRIAGE_SANDBOX=process to choose unisolated replays"
)
"""What ``auto`` says when it falls back to the process sandbox."""


def make_sandbox(kind: str = "auto", warn: Callable[[str], None] | None = None) -> Sandbox:
    """The sandbox named by the `sandbox` setting (``auto`` picks bubblewrap when installed).

    ``auto`` never falls back silently: without bubblewrap it calls `warn` with `UNISOLATED`.
    """
    if kind == "auto" and bwrap_path() is None:
        if warn is not None:
            warn(UNISOLATED)
        return ProcessSandbox()
    if kind == "process":
        return ProcessSandbox()
    return BubblewrapSandbox()
