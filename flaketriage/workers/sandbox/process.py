"""`ProcessSandbox`: a plain subprocess in the materialized workspace, with limits.

Used where bubblewrap is not installed. Each run has its own session under a `flaketriage.process.reaper`,
so nothing it started (background jobs, daemons that ``setsid`` away) outlives it; a cgroup per run
limits its memory, processes and CPU (`LocalLimits`); and where this process may make namespaces
(root, or unprivileged user namespaces) the run has no network and nothing writable but its
workspace, a private /tmp and /dev/shm (`Namespaces`). Elsewhere it sees the network and can write
wherever its user can, and says so once. The original workspace stays visible.
"""

from __future__ import annotations

from flaketriage.process.child import ProcessResult
from flaketriage.workers.sandbox.base import Sandbox, SandboxSpec
from flaketriage.workers.sandbox.limits import LocalLimits


class ProcessSandbox(Sandbox):
    name = "process"

    def __init__(self, limits: LocalLimits | None = None) -> None:
        self.limits = limits or LocalLimits()

    def run(self, spec: SandboxSpec) -> ProcessResult:
        return self.limits.run(spec.argv, spec, contain=True, isolate=True)
