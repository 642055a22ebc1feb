"""`ProcessSandbox`: a plain subprocess in the materialized workspace, with rlimits.

The weakest isolation: the run sees the network and the rest of the file system. Used where
bubblewrap is not installed. Each run has its own session under a `flaketriage.reaper`, so nothing
it started (background jobs, daemons that ``setsid`` away) outlives it.
"""

from __future__ import annotations

from flaketriage.child_process import ProcessResult, run_command
from flaketriage.workers.sandbox.base import Sandbox, SandboxSpec, limits_preexec


class ProcessSandbox(Sandbox):
    name = "process"

    def run(self, spec: SandboxSpec) -> ProcessResult:
        return run_command(
            spec.argv, spec.cwd, spec.env, spec.timeout_s, preexec=limits_preexec(spec), contain=True
        )
