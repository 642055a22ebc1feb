"""The `Sandbox` base: run one replay of a command in isolation and return what it produced."""

from __future__ import annotations

import resource
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flaketriage.child_process import ProcessResult


@dataclass(frozen=True)
class SandboxSpec:
    """One run: the command, the materialized workspace, and the limits."""

    argv: Sequence[str]
    workspace: Path
    cwd: Path
    env: Mapping[str, str]
    timeout_s: float
    memory_mb: int | None = None
    hide: Sequence[Path] = ()
    """Paths that must be invisible to the run (the original workspace)."""
    expose: Sequence[Path] = ()
    """Paths under a hidden one that stay readable (a virtualenv inside the original workspace)."""
    mount_at: Path | None = None
    """Where the original workspace was: sandboxes that can, show the copy there too, so absolute
    paths in the code and editable installs of the project resolve to the copy."""
    network: bool = False


class Sandbox(ABC):
    """Runs a `SandboxSpec`. Backends: bubblewrap, a plain process, an in-memory script; Docker later."""

    name: str = "sandbox"

    @abstractmethod
    def run(self, spec: SandboxSpec) -> ProcessResult:
        """Run the command to completion or its time limit."""


def limits_preexec(spec: SandboxSpec) -> Callable[[], None] | None:
    """A pre-exec hook that applies the memory limit in the child (inherited by what it runs)."""
    if spec.memory_mb is None:
        return None
    limit = spec.memory_mb << 20

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


@dataclass
class MemorySandbox(Sandbox):
    """Answers each run from a function instead of running anything: for tests and simulations."""

    respond: Callable[[SandboxSpec], ProcessResult]
    runs: list[SandboxSpec] = field(default_factory=list)
    name: str = "memory"

    def run(self, spec: SandboxSpec) -> ProcessResult:
        self.runs.append(spec)
        return self.respond(spec)
