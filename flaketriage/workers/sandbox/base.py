"""The `Sandbox` base: run one replay of a command in isolation and return what it produced."""

from __future__ import annotations

import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flaketriage.bundle.manifest import Environment
from flaketriage.process.child import ProcessResult


@dataclass(frozen=True)
class HostView:
    """How a run that shares this machine's file system (bubblewrap, a plain process) sees it.

    A container sees none of the host but what it is given, so the Docker sandbox reads only
    `original_root` here.
    """

    hidden: Sequence[Path] = ()
    """Host paths the run must not see (the original workspace)."""
    readable: Sequence[Path] = ()
    """Host paths under a hidden one, or under /tmp, that stay readable (a virtualenv inside the
    original workspace)."""
    original_root: Path | None = None
    """Where the workspace was when captured: sandboxes that can, show the copy there too, so
    absolute paths in the code and editable installs of the project resolve to the copy."""

    def mount_point(self, workspace: Path) -> Path | None:
        """Where to show `workspace` besides its own path, when that is safe (never over / or over
        the workspace or one of its parents)."""
        if self.original_root is None:
            return None
        target = Path(self.original_root)
        if (
            not target.is_absolute()
            or target == Path("/")
            or target == workspace
            or target in workspace.parents
        ):
            return None
        return target


@dataclass(frozen=True)
class SandboxSpec:
    """One run, as intent: what to run, where, with which limits, network, GPUs and software.

    Each sandbox translates it: bubblewrap into mounts and namespaces, a container into its
    configuration. Paths are this machine's; a container sees the workspace at the same path.
    """

    argv: Sequence[str]
    workspace: Path
    cwd: Path
    env: Mapping[str, str]
    timeout_s: float
    memory_mb: int | None = None
    network: bool = False
    gpu: bool = False
    """GPU work (the capture recorded GPUs): a container is handed the GPUs by a device request,
    and a run without it none; a local run sees this machine's GPUs either way."""
    environment: Environment | None = None
    """The software the run needs (Python version, package freeze): the Docker sandbox runs it in
    the image built for it; local sandboxes run what the command names on this machine."""
    support: Sequence[Path] = ()
    """flaketriage's own files the run reads (the sitecustomize that applies deterministic
    settings): readable at the same path in every sandbox."""
    host: HostView = field(default_factory=HostView)


def readable_paths(spec: SandboxSpec, covered: Sequence[Path]) -> list[Path]:
    """What the run must still read under one of the `covered` paths (a private /tmp, a hidden path).

    The spec's readable and support paths, plus what the spec itself shows: the environment of the
    executable (a virtualenv's root when it sits in ``bin/``) and ``PYTHONPATH`` entries.
    """
    candidates = [Path(p) for p in (*spec.host.readable, *spec.support)]
    # The run's PATH, never this process's: os.defpath is what the child itself falls back to.
    exe = shutil.which(spec.argv[0], path=spec.env.get("PATH", os.defpath)) if spec.argv else None
    if exe is not None:
        parent = Path(exe).parent
        candidates.append(parent.parent if parent.name == "bin" else parent)
    candidates += [Path(p) for p in spec.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    out: list[Path] = []
    for path in candidates:
        if path.exists() and any(Path(c) in path.parents for c in covered) and path not in out:
            out.append(path)
    return out


class Sandbox(ABC):
    """Runs a `SandboxSpec`. Backends: bubblewrap, a plain process, a Docker container, an in-memory
    script.

    A run that breaks a limit (time, memory, processes, network) is not an error: its result says
    which (`ProcessResult.limit`), and the caller decides what that means for the replay.
    """

    name: str = "sandbox"
    builds_environments: bool = False
    """Whether the sandbox builds the bundle's environment itself from `SandboxSpec.environment` (an
    image per `flaketriage.workers.environment.key.EnvironmentKey`); local sandboxes run in the
    virtualenv the replayer prepares."""

    @abstractmethod
    def run(self, spec: SandboxSpec) -> ProcessResult:
        """Run the command to completion or its time limit."""

    def close(self) -> None:  # noqa: B027 (most sandboxes hold nothing)
        """Let go of what the sandbox holds (a client connection)."""


@dataclass
class MemorySandbox(Sandbox):
    """Answers each run from a function instead of running anything: for tests and simulations."""

    respond: Callable[[SandboxSpec], ProcessResult]
    runs: list[SandboxSpec] = field(default_factory=list)
    name: str = "memory"

    def run(self, spec: SandboxSpec) -> ProcessResult:
        self.runs.append(spec)
        return self.respond(spec)
