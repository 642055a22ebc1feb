"""Replay environments: the key that names a bundle's Python environment, and which one a replay uses.

A bundle records its Python version and package freeze; `EnvironmentKey.of` reads them into a key
whose `digest` names what gets built (a virtualenv here, an image layer for Docker), so bundles
with the same interpreter and pins share one build. Projects installed from a local directory (the
project under test, usually editable) are not built into it: the replay imports them from its own
materialized workspace. flaketriage itself comes from the worker, never from an index.

`choose_mode` reads the ``environment`` setting (``FLAKETRIAGE_ENVIRONMENT``): ``worker`` replays in
the worker's own interpreter, as flaketriage always did; ``bundle`` in the bundle's environment;
``auto`` (the default) in the bundle's when the bundle recorded a freeze that differs from the
worker's (another Python minor version, or any pin), else in the worker's.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from flaketriage.bundle.freeze import Requirement, installed_packages, normalize_name, parse_freeze
from flaketriage.bundle.manifest import Environment, Manifest
from flaketriage.errors import ConfigError, ReplayEnvironmentError
from flaketriage.files.atomic import write_atomic

KEY_VERSION = 1
"""Part of every digest: bump it when what a key builds changes, so old builds are not reused."""

WORKER_PACKAGES = ("flaketriage",)
"""Distributions the worker provides itself: never installed from an index (it may not be on one)."""

EnvironmentMode = Literal["auto", "bundle", "worker"]
MODES: tuple[str, ...] = ("auto", "bundle", "worker")


@dataclass(frozen=True)
class EnvironmentKey:
    """The identity of a bundle's environment: Python ``X.Y``, implementation and normalized pins."""

    python: str
    """``major.minor``: the interpreter a runner must have (``python3.11``); patch releases share."""
    implementation: str
    """``CPython`` or ``PyPy``, as `platform.python_implementation` says."""
    requirements: tuple[str, ...]
    """The normalized pins to install, sorted by name (``six==1.16.0``): the freeze's order, comments
    and spelling of names do not change them."""
    installs: tuple[str, ...]
    """The same pins as an installer is given them (the names as recorded)."""
    local: tuple[str, ...]
    """Normalized names of projects installed from a local directory: imported from the workspace."""
    digest: str
    """SHA-256 over `KEY_VERSION`, `python`, `implementation` and `requirements`: what is built."""

    @classmethod
    def of(cls, manifest: Manifest) -> EnvironmentKey:
        """The key of a bundle's recorded environment (`ReplayEnvironmentError` for an unreadable one)."""
        return cls.of_environment(manifest.environment, local_names=local_project_names(manifest))

    @classmethod
    def of_environment(cls, env: Environment, local_names: frozenset[str] = frozenset()) -> EnvironmentKey:
        """The key of `env`; pins whose names are in `local_names` count as local projects."""
        found = re.match(r"^\s*(\d+)\.(\d+)", env.python)
        if found is None:
            raise ReplayEnvironmentError(
                f"the bundle records Python {env.python!r:.40}, not a version (expected X.Y or X.Y.Z); "
                "re-capture the failure"
            )
        python = f"{found.group(1)}.{found.group(2)}"
        reqs = [r for r in parse_freeze(env.packages) if r.name not in WORKER_PACKAGES]
        reqs = [Requirement.local_project(r.name, r.path) if r.name in local_names else r for r in reqs]
        installs = [r for r in reqs if not r.local]
        return cls._make(
            python=python,
            implementation=env.implementation,
            requirements=tuple(r.pin for r in installs),
            installs=tuple(r.install for r in installs if r.install is not None),
            local=tuple(r.name for r in reqs if r.local),
        )

    @classmethod
    def _make(
        cls,
        *,
        python: str,
        implementation: str,
        requirements: tuple[str, ...],
        installs: tuple[str, ...],
        local: tuple[str, ...],
    ) -> EnvironmentKey:
        identity = {
            "key_version": KEY_VERSION,
            "python": python,
            "implementation": implementation,
            "requirements": list(requirements),
        }
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()
        return cls(python, implementation, requirements, installs, local, digest)

    def describe(self) -> str:
        """One line for people: ``Python 3.11 (CPython), 42 packages``."""
        extra = f", {len(self.local)} local project(s) from the workspace" if self.local else ""
        return f"{self.implementation} {self.python} with {len(self.requirements)} pinned packages{extra}"


def local_project_names(manifest: Manifest) -> frozenset[str]:
    """Normalized names the project under test may be installed as: it is in the workspace.

    Bundles record an editable install as ``name @ file:///...`` (read as local by `parse_freeze`);
    older ones recorded it as ``name==version``, so the directory names of the source root, its
    remote and the working directory count too.
    """
    names: set[str] = set()
    for where in (manifest.source.repo_path, manifest.source.remote, manifest.command.cwd):
        if where:
            stem = re.sub(r"\.git$", "", where.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1])
            if stem:
                names.add(normalize_name(stem))
    return frozenset(names)


def worker_key(cache_dir: Path | None = None) -> EnvironmentKey:
    """The key of this worker's own interpreter and packages.

    Reading every installed distribution takes a few hundred milliseconds, which ``auto`` would add
    to every triage; so the freeze is kept once per process and, given `cache_dir`, in a file named
    by the state of ``sys.path`` (each directory's modification time changes when a distribution is
    installed into it or removed).
    """
    state = json.dumps(
        [sys.executable, sys.version, [(p, _mtime_ns(p)) for p in sys.path if p]], separators=(",", ":")
    )
    return _worker_key(state, cache_dir)


@functools.lru_cache(maxsize=4)
def _worker_key(state: str, cache_dir: Path | None) -> EnvironmentKey:
    name = f"worker-{hashlib.sha256(state.encode()).hexdigest()[:24]}.json"
    packages: tuple[str, ...] | None = None
    if cache_dir is not None:
        with contextlib.suppress(OSError, ValueError, TypeError):
            packages = tuple(json.loads((cache_dir / name).read_bytes()))
    if packages is None:
        packages = installed_packages()
        if cache_dir is not None:
            with contextlib.suppress(OSError):
                write_atomic(cache_dir / name, json.dumps(list(packages)).encode("utf-8"), fsync=False)
    env = Environment(
        python=platform.python_version(),
        implementation=platform.python_implementation(),
        platform=platform.platform(),
        machine=platform.machine(),
        packages=packages,
    )
    return EnvironmentKey.of_environment(env)


def _mtime_ns(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def choose_mode(mode: str, manifest: Manifest, cache_dir: Path | None = None) -> Literal["bundle", "worker"]:
    """Where a bundle's replays run: in its own environment (``bundle``) or the worker's.

    ``auto`` is ``bundle`` exactly when the bundle recorded a freeze and it differs from the
    worker's: another Python ``X.Y`` or implementation, or any package pinned otherwise (local
    projects and flaketriage itself aside).
    """
    if mode not in MODES:
        raise ConfigError(f"FLAKETRIAGE_ENVIRONMENT must be one of {', '.join(MODES)}; got {mode!r:.40}")
    if mode != "auto":
        return "bundle" if mode == "bundle" else "worker"
    if not manifest.environment.packages:
        return "worker"  # nothing recorded to build from
    try:
        key = EnvironmentKey.of(manifest)
    except ReplayEnvironmentError:
        return "bundle"  # an unreadable freeze is reported by the bundle's build, not ignored
    mine = worker_key(cache_dir)
    local = set(key.local)
    theirs = {r for r in mine.requirements if _pin_name(r) not in local}
    same = (key.python, key.implementation) == (mine.python, mine.implementation)
    return "worker" if same and set(key.requirements) == theirs else "bundle"


def _pin_name(pin: str) -> str:
    return re.split(r"[\s\[=<>!~;@(]", pin, maxsplit=1)[0]
