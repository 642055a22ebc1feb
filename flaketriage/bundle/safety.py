"""Whether a manifest is safe to restore and run: the one place that decides, used by ``bundle
verify`` (which lists every problem) and by every restore (materialize, export,
`flaketriage.bundle.files.restore_files`), which refuses the first, with the same message.

A manifest comes from a store someone else may have written. Every path it restores must stay
inside the workspace: relative, no ``..``, no NUL byte, no empty or ``.`` names, at most
`MAX_DEPTH` levels and names of at most `NAME_MAX` bytes, and no path may be both a file and the
directory of another. A link's target, read from where the link is, must stay inside the workspace
too (`link_problem`). A git source needs the id of a commit; what is handed to git or a program
(remotes, arguments, environment) must be something they can take as it is meant.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence

from flaketriage.bundle.manifest import BlobRef, Manifest
from flaketriage.errors import BundleError

MAX_DEPTH = 64
"""The deepest a restored path may be nested; real trees stay far below."""
NAME_MAX = 255
"""The longest name (bytes) of one path component, as on every common file system."""
_COMMIT = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def _shown(text: str) -> str:
    return repr(text if len(text) <= 120 else f"{text[:80]}…{text[-20:]}")


def path_problem(path: str, *, directory: bool = False) -> str | None:
    """Why `path` cannot be restored under a workspace (a message), or None when it can.

    ``directory`` allows ``.`` itself (a working directory or a data directory that is the cwd).
    """
    reason = _path_reason(path, directory=directory)
    return None if reason is None else path_message(path, reason)


def path_message(path: str, reason: str) -> str:
    """The message for a manifest path that is refused: the same in ``verify`` and every restore."""
    return (
        f"manifest path {_shown(path)} {reason}: flaketriage restores only relative paths inside the "
        "workspace, so the bundle is damaged or was built to write elsewhere; re-capture the failure"
    )


def _path_reason(path: str, *, directory: bool) -> str | None:
    if not path:
        return "is empty"
    if "\x00" in path:
        return "contains a NUL byte"
    if path.startswith("/"):
        return "is absolute"
    if directory and path == ".":
        return None
    parts = path.split("/")
    if ".." in parts:
        return "climbs out of the workspace with '..'"
    if "" in parts:
        return "has an empty name (a doubled or trailing '/')"
    if "." in parts:
        return "has a '.' name"
    if len(parts) > MAX_DEPTH:
        return f"is nested {len(parts)} levels deep, more than the {MAX_DEPTH} allowed"
    for part in parts:
        size = len(part.encode("utf-8", "surrogateescape"))
        if size > NAME_MAX:
            return f"has a name of {size} bytes, more than the {NAME_MAX} a file system holds"
    return None


def tree_problems(paths: Iterable[str]) -> list[str]:
    """Paths of one tree (files, relative to one root) listed twice, or that are a file and also
    the directory of another."""
    problems: list[str] = []
    files: set[str] = set()
    ordered = list(paths)
    for path in ordered:
        if path in files:
            problems.append(f"manifest path {_shown(path)} is listed twice; the bundle is damaged")
        files.add(path)
    for path in ordered:
        problems += _optional(_inside_a_file(path, files, itself=False))
    return problems


def _inside_a_file(path: str, files: set[str], *, itself: bool) -> str | None:
    """The problem when `path` (or, with `itself`, the directory `path` itself) is under a file."""
    if itself and path in files:
        return _file_and_directory(path, path + "/")
    child, parent = path, posixpath.dirname(path)
    while parent and parent != child:  # an absolute path ends at "/", which is its own parent
        if parent in files:
            return _file_and_directory(parent, path)
        child, parent = parent, posixpath.dirname(parent)
    return None


def _file_and_directory(file: str, inside: str) -> str:
    return (
        f"manifest path {_shown(file)} is a file and also the directory of {_shown(inside)}; "
        "the bundle is damaged or hostile, re-capture the failure"
    )


def check_paths(paths: Sequence[str], *, directory: bool = False) -> None:
    """Raise `BundleError` for the first path of a tree that `path_problem` or `tree_problems`
    refuses (what `flaketriage.bundle.files.restore_files` checks before writing anything)."""
    _raise_first([p for path in paths if (p := path_problem(path, directory=directory))])
    _raise_first(tree_problems(paths))


def manifest_problems(manifest: Manifest) -> list[str]:
    """Everything in `manifest` that makes it unsafe to restore or run, one message each."""
    problems: list[str] = []
    src = manifest.source
    problems += _optional(path_problem(src.subdir, directory=True))
    problems += [p for f in src.files if (p := path_problem(f.path))]
    problems += tree_problems(f.path for f in src.files)
    if src.subdir != ".":
        problems += _optional(_inside_a_file(src.subdir, {f.path for f in src.files}, itself=True))
    problems += _data_problems(manifest)
    problems += _link_problems(manifest)
    problems += _source_problems(manifest)
    problems += _command_problems(manifest)
    problems += _size_problems(manifest)
    return problems


def check_manifest(manifest: Manifest) -> None:
    """Raise `BundleError` naming the first problem `manifest_problems` finds."""
    _raise_first(manifest_problems(manifest))


def _raise_first(problems: Sequence[str]) -> None:
    if problems:
        more = (
            f" (and {len(problems) - 1} more: `flaketriage bundle verify` lists them)"
            if len(problems) > 1
            else ""
        )
        raise BundleError(problems[0] + more)


def _optional(problem: str | None) -> list[str]:
    return [problem] if problem else []


def _data_problems(manifest: Manifest) -> list[str]:
    problems: list[str] = []
    src = manifest.source
    source_files = {f.path for f in src.files}
    targets: list[str] = []
    for data in manifest.data:
        problem = path_problem(data.path, directory=data.format == "dir")
        if problem:
            problems.append(problem)
            continue
        problems += [p for f in data.files if (p := path_problem(f.path))]
        problems += tree_problems(f.path for f in data.files)
        target = posixpath.normpath(posixpath.join(src.subdir, data.path))
        # Restored over the source: a data input may replace a file, not be written inside one.
        problems += _optional(_inside_a_file(target, source_files, itself=False))
        targets.append(target)
    for i, target in enumerate(targets):
        for other in targets[i + 1 :]:
            if target == other or other.startswith(target + "/") or target.startswith(other + "/"):
                problems.append(
                    f"data inputs {_shown(target)} and {_shown(other)} overlap (the same path, or one "
                    "inside the other); the bundle is damaged, re-capture the failure"
                )
    return problems


def _source_problems(manifest: Manifest) -> list[str]:
    src = manifest.source
    problems: list[str] = []
    if src.kind == "git" and (
        src.commit is None or not _COMMIT.match(src.commit) or not src.commit.strip("0")
    ):
        problems.append(
            f"source commit {_shown(src.commit or '')} is not a commit id: a git source needs the "
            "40-hex (or 64-hex) id of the commit it was captured at; the bundle is damaged, re-capture "
            "the failure (or capture it with --snapshot)"
        )
    for label, origin in (("remote", src.remote), ("repository path", src.repo_path)):
        if origin and (origin.startswith("-") or "\x00" in origin or "\n" in origin):
            problems.append(
                f"source {label} {_shown(origin)} is not a repository location (git would read it as an "
                "option or cannot take it); the bundle is damaged or hostile, re-capture the failure"
            )
    return problems


def _command_problems(manifest: Manifest) -> list[str]:
    cmd = manifest.command
    problems: list[str] = []
    if not cmd.argv or not cmd.argv[0]:
        problems.append(
            "the manifest records no command to run (command.argv is empty); re-capture the failure"
        )
    for arg in cmd.argv:
        if "\x00" in arg:
            problems.append(
                f"command argument {_shown(arg)} contains a NUL byte, which no program argument can hold; "
                "the bundle is damaged or hostile, re-capture the failure"
            )
    variables = [*cmd.env.items(), *manifest.seeds.env.items()]
    for name, value in variables:
        if not name or "=" in name or "\x00" in name or "\x00" in value:
            problems.append(
                f"environment variable {_shown(name)} cannot be set (an empty name, or '=' or a NUL byte "
                "in it or its value); the bundle is damaged or hostile, re-capture the failure"
            )
    return problems


def _size_problems(manifest: Manifest) -> list[str]:
    sizes: dict[str, set[int]] = {}
    refs = [(f.sha256, f.size) for f in manifest.source.files]
    for data in manifest.data:
        refs += [(f.sha256, f.size) for f in data.files]
    refs += [(ref.sha256, ref.size) for ref in _blob_refs(manifest)]
    for sha, size in refs:
        sizes.setdefault(sha, set()).add(size)
    return [
        f"blob {sha} is recorded with different sizes ({', '.join(map(str, sorted(found)))}); "
        "the bundle is damaged, re-capture the failure"
        for sha, found in sizes.items()
        if len(found) > 1
    ]


def _blob_refs(manifest: Manifest) -> list[BlobRef]:
    src = manifest.source
    refs: list[BlobRef] = [src.diff] if src.diff else []
    refs += [d.blob for d in manifest.data if d.blob]
    refs += [*manifest.logs.values(), *manifest.attachments.values()]
    refs += [manifest.checkpoint] if manifest.checkpoint else []
    return refs


def link_problem(target: str, depth: int) -> str | None:
    """Why a link `depth` directories below the workspace root may not point at `target`, or None.

    Judged by the text alone, so that it holds wherever the workspace is copied: the target must be
    relative and normalized, and climb (``..``) at most `depth` levels, up to the workspace root.
    """
    if not target or "\x00" in target:
        return "is empty or holds a NUL byte"
    if target.startswith("/"):
        return "is absolute"
    parts = target.split("/")
    ups = next((i for i, part in enumerate(parts) if part != ".."), len(parts))
    if target != "." and any(part in ("", ".", "..") for part in parts[ups:]):
        return "is not a normalized path (a '.' or an empty name, or '..' after a name)"
    if ups > depth:
        return "climbs out of the workspace with '..'"
    return None


def link_message(path: str, target: str, reason: str) -> str:
    """The message for a link that is refused: the same in ``verify`` and every restore."""
    return (
        f"link {_shown(path)} in the manifest points to {_shown(target)}, which {reason}: a restored "
        "link may only point inside the workspace, so the bundle is damaged or was built to reach "
        "elsewhere; re-capture the failure"
    )


def _link_problems(manifest: Manifest) -> list[str]:
    """Links whose target would leave the workspace, judged from where the manifest puts them."""
    src = manifest.source
    cwd_depth = 0 if src.subdir == "." else src.subdir.count("/") + 1
    trees = [(0, src.files)]
    trees += [(cwd_depth + (0 if d.path == "." else d.path.count("/") + 1), d.files) for d in manifest.data]
    problems: list[str] = []
    for base, files in trees:
        for f in files:
            reason = None if f.link is None else link_problem(f.link, base + f.path.count("/"))
            if reason is not None and f.link is not None:
                problems.append(link_message(f.path, f.link, reason))
    return problems
