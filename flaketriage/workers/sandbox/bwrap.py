"""`BubblewrapSandbox`: Linux namespaces through bubblewrap: no network, the original workspace hidden.

The root file system is visible read-only (so the interpreter and installed packages work), /tmp
is private, and only the replay's workspace is writable.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from flaketriage.errors import SandboxError
from flaketriage.process import ProcessResult, run_command
from flaketriage.workers.sandbox.base import Sandbox, SandboxSpec, limits_preexec


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


class BubblewrapSandbox(Sandbox):
    name = "bwrap"

    def __init__(self, executable: str | None = None) -> None:
        found = executable or bwrap_path()
        if found is None:
            raise SandboxError(
                "bubblewrap (bwrap) is not installed; install it (`apt-get install bubblewrap`) or set "
                "FLAKETRIAGE_SANDBOX=process"
            )
        self.executable = found

    def command(self, spec: SandboxSpec) -> list[str]:
        argv = [self.executable, "--die-with-parent", "--unshare-all"]
        if spec.network:
            argv.append("--share-net")
        argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        workspace = spec.workspace.resolve()
        for hidden in spec.hide:
            hidden = Path(hidden).resolve()
            # Never hide the workspace itself or a parent of it: the run needs it.
            if hidden.is_dir() and hidden != workspace and hidden not in workspace.parents:
                argv += ["--tmpfs", str(hidden)]
        for exposed in spec.expose:
            if Path(exposed).exists():
                argv += ["--ro-bind", str(exposed), str(exposed)]
        argv += ["--bind", str(workspace), str(workspace), "--chdir", str(spec.cwd)]
        argv += ["--setenv", "TMPDIR", "/tmp", "--"]
        return argv + list(spec.argv)

    def run(self, spec: SandboxSpec) -> ProcessResult:
        return run_command(
            self.command(spec), spec.cwd, spec.env, spec.timeout_s, preexec=limits_preexec(spec)
        )
