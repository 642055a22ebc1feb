"""Source capture: the git commit, remote and uncommitted work, or a snapshot of the directory.

In a git repository the bundle records the commit, the remote, ``git diff --binary HEAD`` and the
untracked, non-ignored files; elsewhere (or with ``--snapshot``) every file of the working
directory that .gitignore does not exclude, within size caps.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from flaketriage.manifest import FileEntry, Source
from flaketriage.store import Store
from flaketriage.trees import store_file

ALWAYS_SKIPPED = {".git", ".flaketriage", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
_URL_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")


@dataclass(frozen=True)
class SourceLimits:
    max_file_bytes: int
    max_total_bytes: int


def _git(cwd: Path, *args: str) -> bytes | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _git_text(cwd: Path, *args: str) -> str | None:
    out = _git(cwd, *args)
    return out.decode("utf-8", "replace").strip() if out is not None else None


def git_root(cwd: Path) -> Path | None:
    top = _git_text(cwd, "rev-parse", "--show-toplevel")
    return Path(top) if top else None


def capture_source(
    store: Store, cwd: Path, limits: SourceLimits, snapshot: bool = False, exclude: Iterable[Path] = ()
) -> Source:
    """Record the code the command ran: git state, or a snapshot when not in git or asked to."""
    cwd = cwd.resolve()
    root = git_root(cwd)
    commit = _git_text(cwd, "rev-parse", "--verify", "HEAD") if root else None
    excluded = {p.resolve() for p in exclude}
    if root is None or commit is None or snapshot:
        return _snapshot(store, cwd, limits, excluded, in_git=root is not None)
    untracked = _git(cwd, "ls-files", "--others", "--exclude-standard", "-z", "--full-name", ":/")
    names = [n for n in (untracked or b"").decode("utf-8", "surrogateescape").split("\0") if n]
    files, skipped = _store_files(store, root, names, limits, excluded)
    diff = _git(root, "diff", "--binary", "HEAD")
    remote = _git_text(root, "remote", "get-url", "origin") or None
    return Source(
        kind="git",
        commit=commit,
        branch=_git_text(root, "rev-parse", "--abbrev-ref", "HEAD"),
        remote=_URL_CREDENTIALS.sub("", remote) if remote else None,
        repo_path=str(root),
        subdir=os.path.relpath(cwd, root),
        diff=store.put_bytes(diff) if diff else None,
        files=tuple(files),
        skipped=tuple(skipped),
    )


def _snapshot(store: Store, cwd: Path, limits: SourceLimits, excluded: set[Path], in_git: bool) -> Source:
    if in_git:
        listed = _git(cwd, "ls-files", "--cached", "--others", "--exclude-standard", "-z")
        names = [n for n in (listed or b"").decode("utf-8", "surrogateescape").split("\0") if n]
        names = [n for n in names if (cwd / n).is_file()]  # deleted-but-tracked files are gone
    else:
        names = _walk_with_gitignore(cwd)
    files, skipped = _store_files(store, cwd, names, limits, excluded)
    return Source(kind="snapshot", repo_path=str(cwd), subdir=".", files=tuple(files), skipped=tuple(skipped))


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
    store: Store, root: Path, names: list[str], limits: SourceLimits, excluded: set[Path]
) -> tuple[list[FileEntry], list[str]]:
    files: list[FileEntry] = []
    skipped: list[str] = []
    total = 0
    for name in sorted(names):
        path = root / name
        if any(part in ALWAYS_SKIPPED for part in Path(name).parts):
            continue
        if path.is_symlink() or not path.is_file():
            continue
        resolved = path.resolve()
        if any(resolved == ex or ex in resolved.parents for ex in excluded):
            continue
        size = path.stat().st_size
        if size > limits.max_file_bytes or total + size > limits.max_total_bytes:
            skipped.append(name)
            continue
        total += size
        files.append(store_file(store, path, name))
    return files, skipped
