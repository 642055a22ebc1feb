"""`BubblewrapSandbox`: Linux namespaces through bubblewrap: no network, the original workspace hidden.

The root file system is visible read-only (so the interpreter and installed packages work), /tmp
is private, and only the replay's workspace is writable. The run has its own PID namespace, torn
down (everything in it killed) when the command exits or bubblewrap dies (``--die-with-parent``).
Bubblewrap reports the command's death by signal N as exit status 128 + N, so its results say so
(`ProcessResult.wrapped_signals`). Memory, processes and CPU are limited by a cgroup per run
(`LocalLimits`), which bubblewrap and everything below it join.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from flaketriage.errors import SandboxError
from flaketriage.process.child import ProcessResult
from flaketriage.workers.sandbox.base import Sandbox, SandboxSpec, readable_paths
from flaketriage.workers.sandbox.limits import LocalLimits

PRIVATE_TMP = "/tmp"


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


class BubblewrapSandbox(Sandbox):
    name = "bwrap"

    def __init__(self, executable: str | None = None, limits: LocalLimits | None = None) -> None:
        found = executable or bwrap_path()
        if found is None:
            raise SandboxError(
                "bubblewrap (bwrap) is not installed; install it (`apt-get install bubblewrap`) or set "
                "FLAKETRIAGE_SANDBOX=process"
            )
        self.executable = found
        self.limits = limits or LocalLimits()

    def command(self, spec: SandboxSpec) -> list[str]:
        argv = [self.executable, "--die-with-parent", "--unshare-all"]
        if spec.network:
            argv.append("--share-net")
        argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", PRIVATE_TMP]
        workspace = spec.workspace.resolve()
        mount_at = spec.host.mount_point(workspace)
        for hidden in spec.host.hidden:
            hidden = Path(hidden).resolve()
            if mount_at is not None and (hidden == mount_at or mount_at in hidden.parents):
                continue  # the copy is mounted over it
            # Never hide the workspace itself or a parent of it: the run needs it.
            if hidden.is_dir() and hidden != workspace and hidden not in workspace.parents:
                argv += ["--tmpfs", str(hidden)]
        if mount_at is not None:
            argv += ["--bind", str(workspace), str(mount_at)]
        for exposed in readable_paths(spec, [Path(PRIVATE_TMP), *spec.host.hidden]):
            argv += ["--ro-bind", str(exposed), str(exposed)]
        argv += ["--bind", str(workspace), str(workspace), "--chdir", str(spec.cwd)]
        argv += ["--setenv", "TMPDIR", "/tmp", "--"]
        return argv + list(spec.argv)

    def run(self, spec: SandboxSpec) -> ProcessResult:
        result = self.limits.run(self.command(spec), spec, contain=False)
        return dataclasses.replace(result, wrapped_signals=True)
