"""Source capture: the git commit, remote and uncommitted work, or a snapshot of the directory.

In a git repository the bundle records the commit, the remote, ``git diff --binary HEAD`` and the
untracked, non-ignored files; elsewhere (or with ``--snapshot``) every file of the working
directory that .gitignore does not exclude, within size caps. Git runs through `flaketriage.git.Git`
(`CAPTURE_GIT` unless the caller passes its own).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from flaketriage.git import Git
from flaketriage.manifest import FileEntry, Source
from flaketriage.settings import Settings
from flaketriage.store import Store
from flaketriage.stored_files import store_file

ALWAYS_SKIPPED = {".git", ".flaketriage", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
_URL_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")

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


def _stat_all(root: Path, names: list[str]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for name in names:
        if any(part in ALWAYS_SKIPPED for part in Path(name).parts):
            continue
        path = root / name
        try:
            if path.is_symlink() or not path.is_file():
                continue
            st = path.stat()
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
) -> Source:
    """Store what the plan listed, as it was before the run (files changed since are skipped)."""
    excluded = {p.resolve() for p in exclude}
    files, skipped = _store_files(store, plan, limits, excluded)
    if plan.kind == "snapshot":
        return Source(
            kind="snapshot", repo_path=str(plan.root), subdir=".", files=tuple(files), skipped=tuple(skipped)
        )
    root = plan.root
    diff = git.try_run(["diff", "--binary", "HEAD"], root)
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
    )


def _walk_with_gitignore(root: Path) -> list[str]:
    import pathspec

    lines: list[str] = []
    ignore = root / ".gitignore"
    if ignore.is_file():
        lines = ignore.read_text(errors="replace").splitlines()
    spec = pathspec.GitIgnoreSpec.from_lines(lines)
    names: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in ALWAYS_SKIPPED and not spec.match_file(os.path.join(rel_dir, d) + "/")
        )
        for name in sorted(filenames):
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if not spec.match_file(rel):
                names.append(rel)
    return names


def _store_files(
    store: Store, plan: SourcePlan, limits: SourceLimits, excluded: set[Path]
) -> tuple[list[FileEntry], list[str]]:
    files: list[FileEntry] = []
    skipped: list[str] = []
    total = 0
    for name, (size, mtime) in sorted(plan.files.items()):
        path = plan.root / name
        resolved = path.resolve()
        if any(resolved == ex or ex in resolved.parents for ex in excluded):
            continue
        try:
            st = path.stat()
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
        files.append(store_file(store, path, name))
    return files, skipped
