"""Sandboxes for replays: bubblewrap namespaces, a plain process, and an in-memory stand-in."""

from __future__ import annotations

from flaketriage.workers.sandbox.base import MemorySandbox, Sandbox, SandboxSpec
from flaketriage.workers.sandbox.bwrap import BubblewrapSandbox, bwrap_path
from flaketriage.workers.sandbox.process import ProcessSandbox

__all__ = ["BubblewrapSandbox", "MemorySandbox", "ProcessSandbox", "Sandbox", "SandboxSpec", "make_sandbox"]


def make_sandbox(kind: str = "auto") -> Sandbox:
    """The sandbox named by the `sandbox` setting (``auto`` picks bubblewrap when installed)."""
    if kind == "process" or (kind == "auto" and bwrap_path() is None):
        return ProcessSandbox()
    return BubblewrapSandbox()
