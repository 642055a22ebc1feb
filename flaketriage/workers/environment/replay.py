"""A replay in the bundle's own environment: its virtualenv, its local projects, its interpreter.

The virtualenv comes from the `EnvironmentCache` (built once per `EnvironmentKey`). What the key
leaves out is added per replayer, without an installer: projects the freeze names as installed
from a local directory are imported from the replay's own copy of the workspace (their import root
on ``PYTHONPATH``, with a ``.dist-info`` so ``importlib.metadata`` finds their version), and
flaketriage itself is the worker's (linked, with its entry points, so pytest loads its plugin as
it did at capture). A replay then runs with the virtualenv's ``bin`` first on ``PATH`` and an
interpreter named by absolute path (``/old/venv/bin/python``) mapped to the virtualenv's own.
"""

from __future__ import annotations

import configparser
import contextlib
import importlib.metadata
import os
import re
import tomllib
from collections.abc import Iterator, MutableMapping, Sequence
from pathlib import Path

import flaketriage
from flaketriage.bundle.freeze import normalize_name, parse_freeze
from flaketriage.bundle.manifest import Manifest
from flaketriage.errors import ReplayEnvironmentError
from flaketriage.workers.environment.cache import EnvironmentCache, EnvironmentLease
from flaketriage.workers.environment.key import WORKER_PACKAGES, EnvironmentKey
from flaketriage.workers.materialize import Workspace

_SKIP_DIRS = {".git", ".hg", ".venv", "venv", "node_modules", "__pycache__", ".tox", ".nox", "build", "dist"}
_SEARCH_DEPTH = 2
_PROJECT_FILES = ("pyproject.toml", "setup.cfg", "setup.py")
_SYSTEM_BINS = {"/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"}
"""Directories that hold other tools besides an interpreter: never dropped from a replay's PATH."""


class BundleEnvironment:
    """What a `Replayer` needs to run one bundle in its own environment; `release` when done."""

    def __init__(
        self, lease: EnvironmentLease, site: Path, local_roots: Sequence[Path], old_bins: Sequence[str]
    ) -> None:
        self.lease = lease
        self.site = site
        """A directory on ``PYTHONPATH`` with the worker's flaketriage and the local projects'
        ``.dist-info`` (shared by every run of the replayer)."""
        self.local_roots = list(local_roots)
        """Import roots of local projects, relative to a workspace's root."""
        self.old_bins = set(old_bins)
        """``bin`` directories of the recorded environment, dropped from a replay's PATH."""

    @property
    def root(self) -> Path:
        return self.lease.environment.root

    @classmethod
    def prepare(
        cls,
        manifest: Manifest,
        key: EnvironmentKey,
        cache: EnvironmentCache,
        template: Workspace,
        scratch: Path,
    ) -> BundleEnvironment:
        """Acquire the environment of `key` and lay out what the replays add to it under `scratch`.

        Raises `ReplayEnvironmentError` when it cannot be built or a local project is not in the
        workspace.
        """
        roots = find_local_projects(manifest, key, template)  # before a long build: fail fast
        lease = cache.acquire(key)
        try:
            site = scratch / "environment-site"
            site.mkdir(parents=True, exist_ok=True)
            for name, (_, version) in roots.items():
                _write_dist_info(site, name, version)
            if any(r.name in WORKER_PACKAGES for r in parse_freeze(manifest.environment.packages)):
                _link_worker_flaketriage(site)
            return cls(lease, site, [rel for rel, _ in roots.values()], _recorded_bins(manifest))
        except BaseException:
            lease.release()
            raise

    def release(self) -> None:
        self.lease.release()

    # -- what a run gets ------------------------------------------------------------------------
    def apply(self, env: MutableMapping[str, str], ws: Workspace) -> None:
        """Point `env` at this environment: its ``bin`` first on PATH, ``VIRTUAL_ENV``, and the
        site directory and local projects right after flaketriage's own ``PYTHONPATH`` entry."""
        bin_dir = str(self.root / "bin")
        path = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and p not in self.old_bins]
        env["PATH"] = os.pathsep.join([bin_dir, *(p for p in path if p != bin_dir)])
        env["VIRTUAL_ENV"] = str(self.root)
        env.pop("PYTHONHOME", None)  # it would point the virtualenv's interpreter elsewhere
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        ours = [str(self.site), *(str(ws.root / rel) for rel in self.local_roots)]
        env["PYTHONPATH"] = os.pathsep.join([*parts[:1], *ours, *parts[1:]])

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` with an interpreter (or a script of the recorded environment) named by path mapped
        to this environment's."""
        out = list(argv)
        if not out or os.sep not in out[0]:
            return out  # a bare name resolves on the run's PATH, where this environment comes first
        name = os.path.basename(out[0])
        python_like = re.match(r"^(python|pypy)[0-9.]*$", name) is not None
        if python_like or os.path.dirname(out[0]) in self.old_bins:
            mine = self.root / "bin" / name
            if mine.exists():
                out[0] = str(mine)
            elif python_like:
                out[0] = str(self.root / "bin" / "python")
        return out

    def readable(self) -> list[str]:
        """What a sandbox must keep readable: the environment, its base interpreter's prefix and
        ``sys.path`` (recorded when it was built), the site directory and what it links to."""
        found = [str(self.root), str(self.site), str(Path(flaketriage.__file__).parent)]
        return found + list(self.lease.environment.paths)


def find_local_projects(
    manifest: Manifest, key: EnvironmentKey, ws: Workspace
) -> dict[str, tuple[Path, str]]:
    """For each local project of `key`: its import root relative to `ws.root`, and its version.

    The freeze's recorded path is used when it lies in the workspace; otherwise the workspace is
    searched (its root, the working directory, and two levels below the root) for a
    ``pyproject.toml``, ``setup.cfg`` or ``setup.py`` that names the project. A recorded directory
    whose files do not spell the name out (``setup(name=NAME)``) is taken as the project all the same.
    """
    if not key.local:
        return {}
    recorded = {r.name: r.path for r in parse_freeze(manifest.environment.packages) if r.local}
    projects = _projects_in(ws, manifest, recorded)
    out: dict[str, tuple[Path, str]] = {}
    for name in key.local:
        found = projects.get(name) or _recorded_checkout(ws, manifest, recorded.get(name))
        if found is None:
            raise ReplayEnvironmentError(
                f"the bundle's freeze names {name} as installed from a local directory, but its "
                f"workspace has no project called {name} (looked for pyproject.toml, setup.cfg and "
                "setup.py); capture the failure from the project's repository, or replay in the "
                "worker's own interpreter with FLAKETRIAGE_ENVIRONMENT=worker"
            )
        directory, version = found
        src = directory / "src"
        import_root = src if src.is_dir() else directory
        out[name] = (import_root.relative_to(ws.root), version)
    return out


def _projects_in(
    ws: Workspace, manifest: Manifest, recorded: dict[str, str | None]
) -> dict[str, tuple[Path, str]]:
    candidates = [moved for path in recorded.values() if (moved := _moved(ws, manifest, path))]
    candidates += [ws.root, ws.cwd, *_below(ws.root, _SEARCH_DEPTH)]
    found: dict[str, tuple[Path, str]] = {}
    for directory in dict.fromkeys(candidates):
        described = _project_name(directory)
        if described is not None:
            found.setdefault(normalize_name(described[0]), (directory, described[1]))
    return found


def _moved(ws: Workspace, manifest: Manifest, path: str | None) -> Path | None:
    """Where a directory of the capturing machine lies in `ws`, or None when it lay outside it."""
    if not path or not os.path.isabs(path):
        return None
    moved = Path(os.path.normpath(ws.cwd / os.path.relpath(path, manifest.command.cwd)))
    return moved if moved == ws.root or ws.root in moved.parents else None


def _recorded_checkout(ws: Workspace, manifest: Manifest, path: str | None) -> tuple[Path, str] | None:
    """The directory the freeze says a project was installed from, when the workspace has it as a
    project whose name its files do not spell out (``setup(name=NAME)``): the installer's record
    (PEP 610) named it. Its version is the one a build left in its ``.egg-info``, else ``0``."""
    directory = _moved(ws, manifest, path)
    if directory is None or not any((directory / f).is_file() for f in _PROJECT_FILES):
        return None
    for info in sorted(directory.glob("*.egg-info/PKG-INFO")):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            found = re.search(r"(?m)^Version:\s*(\S+)", info.read_text(encoding="utf-8"))
            if found:
                return directory, found.group(1)
    return directory, "0"


def _below(root: Path, depth: int) -> Iterator[Path]:
    if depth == 0:
        return
    with contextlib.suppress(OSError):
        for child in sorted(root.iterdir()):
            if child.is_dir() and not child.is_symlink() and child.name not in _SKIP_DIRS:
                yield child
                yield from _below(child, depth - 1)


def _project_name(directory: Path) -> tuple[str, str] | None:
    """(name, version) a project directory declares, or None when it declares none."""
    with contextlib.suppress(OSError, ValueError, tomllib.TOMLDecodeError):
        data = tomllib.loads((directory / "pyproject.toml").read_text(encoding="utf-8"))
        project = data.get("project") or data.get("tool", {}).get("poetry") or {}
        if isinstance(project.get("name"), str):
            return project["name"], str(project.get("version") or "0")
    with contextlib.suppress(OSError, configparser.Error, UnicodeDecodeError):
        cfg = configparser.ConfigParser()
        cfg.read_string((directory / "setup.cfg").read_text(encoding="utf-8"))
        if cfg.has_option("metadata", "name"):
            return cfg.get("metadata", "name"), cfg.get("metadata", "version", fallback="0")
    with contextlib.suppress(OSError, UnicodeDecodeError):
        setup = (directory / "setup.py").read_text(encoding="utf-8")
        name = re.search(r"""\bname\s*=\s*["']([A-Za-z0-9._-]+)["']""", setup)
        if name:
            version = re.search(r"""\bversion\s*=\s*["']([^"']+)["']""", setup)
            return name.group(1), version.group(1) if version else "0"
    return None


def _write_dist_info(site: Path, name: str, version: str, entry_points: str | None = None) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", "utf-8")
    if entry_points:
        (info / "entry_points.txt").write_text(entry_points, "utf-8")


def _link_worker_flaketriage(site: Path) -> None:
    package = Path(flaketriage.__file__).parent
    link = site / "flaketriage"
    if not link.exists():
        link.symlink_to(package, target_is_directory=True)
    try:
        dist = importlib.metadata.distribution("flaketriage")
        version, entry_points = dist.version, dist.read_text("entry_points.txt")
    except importlib.metadata.PackageNotFoundError:
        version, entry_points = "0", None
    _write_dist_info(site, "flaketriage", version, entry_points)


def _recorded_bins(manifest: Manifest) -> list[str]:
    """The ``bin`` directories of the environment the bundle ran in (a virtualenv or conda's)."""
    env = manifest.command.env
    out = [os.path.join(env[v], "bin") for v in ("VIRTUAL_ENV", "CONDA_PREFIX") if env.get(v)]
    executable = manifest.environment.executable
    if executable and os.path.isabs(executable):
        bin_dir = os.path.dirname(executable)
        if bin_dir not in _SYSTEM_BINS:  # a virtualenv's, pyenv's, conda's: that interpreter's own
            out.append(bin_dir)
    return out
