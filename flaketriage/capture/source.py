"""Source capture: the git commit, remote and uncommitted work, or a snapshot of the directory.

In a git repository the bundle records the commit, the remote, ``git diff --binary HEAD`` and the
untracked, non-ignored files; elsewhere (or with ``--snapshot``) every file of the working
directory that .gitignore does not exclude, within size caps. Python environments inside the
checkout (`ENVIRONMENT_MARKERS`) are never source. Git runs through `flaketriage.process.git.Git`
(`CAPTURE_GIT` unless the caller passes its own). What the files may hold is `TreeCapture`'s to
decide (links, credential files, masked secrets); the diff leaves credential files out and has the
secrets of its added lines masked.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from flaketriage.bundle.files import TreeCapture
from flaketriage.bundle.manifest import ExcludedFile, FileEntry, Source
from flaketriage.bundle.redaction import Redactor
from flaketriage.bundle.secret_files import CREDENTIAL_REASON, is_credential_file, mask_patch
from flaketriage.process.git import Git
from flaketriage.settings import Settings
from flaketriage.store import Store

ALWAYS_SKIPPED = {".git", ".flaketriage", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
_URL_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")

ENVIRONMENT_MARKERS = ("pyvenv.cfg", "conda-meta")
"""A directory holding one of these is a Python environment (a virtualenv, a conda environment):
what is installed, not source, and the replay builds its own. Left out whether or not .gitignore
names it: a checkout's ``.venv`` is thousands of files that would make every bundle and replay slow."""

CAPTURE_GIT = Git(timeout_s=60.0)
"""The git capture runs by default: this process's environment, and at most a minute a command, so
that a slow repository costs the user's CI job little (a question git cannot answer in time is
answered as "not a git repository")."""


@dataclass(frozen=True)
class SourceLimits:
    """Size caps on captured source files; larger ones are listed as skipped."""

    max_file_bytes: int
    max_total_bytes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> SourceLimits:
        return cls(
            max_file_bytes=int(settings.snapshot_max_file_mb * 2**20),
            max_total_bytes=int(settings.snapshot_max_total_mb * 2**20),
        )


@dataclass(frozen=True)
class SourcePlan:
    """What to record, listed before the command runs: outputs it writes are not inputs."""

    kind: Literal["git", "snapshot"]
    cwd: Path
    root: Path
    commit: str | None
    files: dict[str, tuple[int, int]]
    """path relative to `root` → (size, mtime_ns) before the run."""


def plan_source(cwd: Path, snapshot: bool = False, git: Git = CAPTURE_GIT) -> SourcePlan:
    """List the untracked files (git) or the snapshot's files, with their size and mtime."""
    cwd = cwd.resolve()
    root = git.root(cwd)
    commit = git.try_text(["rev-parse", "--verify", "HEAD"], cwd) if root else None
    if root is None or commit is None or snapshot:
        if root is not None:
            listed = git.try_run(["ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd)
            names = [n for n in (listed or b"").decode("utf-8", "surrogateescape").split("\0") if n]
        else:
            names = _walk_with_gitignore(cwd)
        return SourcePlan("snapshot", cwd, cwd, None, _stat_all(cwd, names))
    untracked = git.try_run(["ls-files", "--others", "--exclude-standard", "-z", "--full-name", ":/"], cwd)
    names = [n for n in (untracked or b"").decode("utf-8", "surrogateescape").split("\0") if n]
    return SourcePlan("git", cwd, root, commit, _stat_all(root, names))


def is_environment(path: str | os.PathLike[str]) -> bool:
    """Whether the directory at ``path`` is a Python environment (`ENVIRONMENT_MARKERS`)."""
    return any(os.path.lexists(os.path.join(path, marker)) for marker in ENVIRONMENT_MARKERS)


def _stat_all(root: Path, names: list[str]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    environments: dict[str, bool] = {}  # per directory: a tree has far fewer than files

    def in_environment(name: str) -> bool:
        parts = name.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            folder = "/".join(parts[:depth])
            if folder not in environments:
                environments[folder] = is_environment(os.path.join(root, folder))
            if environments[folder]:
                return True
        return False

    for name in names:
        if any(part in ALWAYS_SKIPPED for part in name.split("/")) or in_environment(name):
            continue
        try:
            st = os.lstat(os.path.join(root, name))  # a link is listed as a link: `TreeCapture` decides
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                continue
        except OSError:
            continue
        out[name] = (st.st_size, st.st_mtime_ns)
    return out


def capture_source(
    store: Store,
    plan: SourcePlan,
    limits: SourceLimits,
    exclude: Iterable[Path] = (),
    git: Git = CAPTURE_GIT,
    redactor: Redactor | None = None,
) -> Source:
    """Store what the plan listed, as it was before the run (files changed since are skipped).

    Secrets in text files and in the diff are masked with `redactor` (default: a fresh one).
    """
    excluded = {p.resolve() for p in exclude}
    tree = TreeCapture(store, plan.root, redactor or Redactor())
    files, skipped = _store_files(tree, plan, limits, excluded)
    if plan.kind == "snapshot":
        return Source(
            kind="snapshot",
            repo_path=str(plan.root),
            subdir=".",
            files=tuple(files),
            skipped=tuple(skipped),
            excluded=tuple(tree.excluded),
            masked=tuple(dict.fromkeys(tree.masked)),
        )
    root = plan.root
    diff = _diff(tree, root, git)
    remote = git.try_text(["remote", "get-url", "origin"], root) or None
    return Source(
        kind="git",
        commit=plan.commit,
        branch=git.try_text(["rev-parse", "--abbrev-ref", "HEAD"], root),
        remote=_URL_CREDENTIALS.sub("", remote) if remote else None,
        repo_path=str(root),
        subdir=os.path.relpath(plan.cwd, root),
        diff=store.put_bytes(diff) if diff else None,
        files=tuple(files),
        skipped=tuple(skipped),
        excluded=tuple(tree.excluded),
        masked=tuple(dict.fromkeys(tree.masked)),
    )


def _diff(tree: TreeCapture, root: Path, git: Git) -> bytes | None:
    """``git diff --binary HEAD`` without credential files, its added lines masked (`mask_patch`)."""
    changed = git.try_run(["diff", "--name-only", "-z", "HEAD"], root) or b""
    secret = [
        n for n in changed.decode("utf-8", "surrogateescape").split("\0") if n and is_credential_file(n)
    ]
    tree.excluded += [
        ExcludedFile(path=n, reason=CREDENTIAL_REASON + " (its uncommitted changes are left out)")
        for n in secret
    ]
    # Fixed prefixes and no colour, whatever the user's configuration: the diff must apply.
    args = ["diff", "--binary", "--no-color", "--no-ext-diff", "--src-prefix=a/", "--dst-prefix=b/", "HEAD"]
    if secret:
        args += ["--", ".", *(f":(exclude,literal){n}" for n in secret)]
    diff = git.try_run(args, root)
    if not diff:
        return None
    masked, paths = mask_patch(tree.redactor or Redactor(), diff)
    tree.masked += paths
    return masked


def _walk_with_gitignore(root: Path) -> list[str]:
    import pathspec

    lines: list[str] = []
    ignore = root / ".gitignore"
    if ignore.is_file():
        lines = ignore.read_text(errors="replace").splitlines()
    spec: pathspec.GitIgnoreSpec | None = pathspec.GitIgnoreSpec.from_lines(lines)
    if spec is not None and not spec.patterns:  # nothing to ignore: matching every path finds nothing
        spec = None
    names: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in ALWAYS_SKIPPED
            and not (spec and spec.match_file(os.path.join(rel_dir, d) + "/"))
            and not is_environment(os.path.join(dirpath, d))
        )
        # A linked directory is listed like a file (as a link), never entered.
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        dirnames[:] = [d for d in dirnames if d not in links]
        for name in sorted([*filenames, *links]):
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if not (spec and spec.match_file(rel)):
                names.append(rel)
    return names


def _store_files(
    tree: TreeCapture, plan: SourcePlan, limits: SourceLimits, excluded: set[Path]
) -> tuple[list[FileEntry], list[str]]:
    files: list[FileEntry] = []
    skipped: list[str] = []
    total = 0
    real_dirs: dict[str, str] = {}  # resolved once per directory: a tree has far fewer than files
    excluded_dirs = [str(ex).rstrip("/") for ex in excluded]
    for name, (size, mtime) in sorted(plan.files.items()):
        path = plan.root / name
        parent = os.path.dirname(path)
        real = real_dirs.get(parent)
        if real is None:
            real = real_dirs[parent] = os.path.realpath(parent)
        resolved = os.path.join(real, path.name)  # a link is judged where it is, not where it points
        if any(resolved == ex or resolved.startswith(ex + "/") for ex in excluded_dirs):
            continue
        try:
            st = os.lstat(path)
        except OSError:
            skipped.append(f"{name} (deleted during the run)")
            continue
        if (st.st_size, st.st_mtime_ns) != (size, mtime):
            skipped.append(f"{name} (changed during the run)")
            continue
        if size > limits.max_file_bytes or total + size > limits.max_total_bytes:
            skipped.append(name)
            continue
        total += size
        entry = tree.add(path, Path(name).as_posix())
        files += [entry] if entry is not None else []
    return files, skipped
