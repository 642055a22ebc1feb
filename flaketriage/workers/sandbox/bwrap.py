"""`BubblewrapSandbox`: Linux namespaces through bubblewrap: no network, the original workspace hidden.

The root file system is visible read-only (so the interpreter and installed packages work), /tmp
is private, and only the replay's workspace is writable. The run has its own PID namespace, torn
down (everything in it killed) when the command exits or bubblewrap dies (``--die-with-parent``).
Bubblewrap reports the command's death by signal N as exit status 128 + N, so its results say so
(`ProcessResult.wrapped_signals`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from flaketriage.child_process import ProcessResult, run_command
from flaketriage.errors import SandboxError
from flaketriage.workers.sandbox.base import Sandbox, SandboxSpec, limits_preexec

PRIVATE_TMP = "/tmp"


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def _needed(spec: SandboxSpec) -> list[Path]:
    """What the run must still read under the private /tmp or a hidden path.

    The caller's `expose` list, plus what the spec itself shows: the environment of the
    executable (a virtualenv's root when it sits in ``bin/``) and ``PYTHONPATH`` entries.
    """
    candidates = [Path(p) for p in spec.expose]
    # The run's PATH, never this process's: os.defpath is what the child itself falls back to.
    exe = shutil.which(spec.argv[0], path=spec.env.get("PATH", os.defpath)) if spec.argv else None
    if exe is not None:
        parent = Path(exe).parent
        candidates.append(parent.parent if parent.name == "bin" else parent)
    candidates += [Path(p) for p in spec.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    covered = [Path(PRIVATE_TMP), *(Path(h) for h in spec.hide)]
    out: list[Path] = []
    for path in candidates:
        if path.exists() and any(c in path.parents for c in covered) and path not in out:
            out.append(path)
    return out


def _mount_point(spec: SandboxSpec, workspace: Path) -> Path | None:
    """Where to show the workspace copy besides its own path, when that is safe."""
    if spec.mount_at is None:
        return None
    target = Path(spec.mount_at)
    if not target.is_absolute() or target == Path("/") or target == workspace or target in workspace.parents:
        return None
    return target


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
        argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", PRIVATE_TMP]
        workspace = spec.workspace.resolve()
        mount_at = _mount_point(spec, workspace)
        for hidden in spec.hide:
            hidden = Path(hidden).resolve()
            if mount_at is not None and (hidden == mount_at or mount_at in hidden.parents):
                continue  # the copy is mounted over it
            # Never hide the workspace itself or a parent of it: the run needs it.
            if hidden.is_dir() and hidden != workspace and hidden not in workspace.parents:
                argv += ["--tmpfs", str(hidden)]
        if mount_at is not None:
            argv += ["--bind", str(workspace), str(mount_at)]
        for exposed in _needed(spec):
            argv += ["--ro-bind", str(exposed), str(exposed)]
        argv += ["--bind", str(workspace), str(workspace), "--chdir", str(spec.cwd)]
        argv += ["--setenv", "TMPDIR", "/tmp", "--"]
        return argv + list(spec.argv)

    def run(self, spec: SandboxSpec) -> ProcessResult:
        result = run_command(
            self.command(spec), spec.cwd, spec.env, spec.timeout_s, preexec=limits_preexec(spec)
        )
        return dataclasses.replace(result, wrapped_signals=True)
