"""File trees and data inputs in a store: store files as blobs, restore them at their paths.

What a tree may hold is decided here, once, for the source and for data directories (`TreeCapture`):
a symbolic link is never followed; one that points inside the workspace is stored as a link, one
that points out of it is left out, as are credential files, and text files can be masked. Restore
recreates a link only when its target, read from where the link is, stays inside the workspace.
Files go through the store's stat cache: one unchanged since the store took it is not hashed again,
and not read at all when nothing in it can need masking (it is binary, or not masked).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from flaketriage.bundle.manifest import BlobRef, DataInput, ExcludedFile, FileEntry
from flaketriage.bundle.redaction import Redactor
from flaketriage.bundle.safety import check_paths, link_message, link_problem, path_message, path_problem
from flaketriage.bundle.secret_files import CREDENTIAL_REASON, is_credential_file, mask_file
from flaketriage.errors import BundleError, DatasetError
from flaketriage.store import Store
from flaketriage.store.state import FileStamp, KnownFile


def store_file(store: Store, path: Path, name: str) -> FileEntry:
    ref = store.put_file(path)
    return FileEntry(
        path=Path(name).as_posix(), sha256=ref.sha256, size=ref.size, executable=os.access(path, os.X_OK)
    )


@dataclass
class TreeCapture:
    """Stores the files of one workspace as a bundle may hold them, and says what it left out.

    A link is kept as a link when it resolves inside `workspace` (its target rewritten relative
    when it was absolute), and left out otherwise; credential files are left out; with a `redactor`
    the secrets in text files are masked in the stored copy. `excluded` and `masked` collect what
    was left out or masked, by the name each file was added under.
    """

    store: Store
    workspace: Path
    redactor: Redactor | None = None
    excluded: list[ExcludedFile] = field(default_factory=list)
    masked: list[str] = field(default_factory=list)
    _real_dirs: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.workspace = Path(os.path.realpath(self.workspace))

    def add(self, path: Path, name: str) -> FileEntry | None:
        """Store the file or link at `path` as `name` (relative, POSIX); None when it is left out."""
        if is_credential_file(name) or is_credential_file(self._in_workspace(path)):
            self.excluded.append(ExcludedFile(path=name, reason=CREDENTIAL_REASON))
            return None
        if path.is_symlink():
            return self._link(path, name)
        if self.redactor is None:
            return store_file(self.store, path, name)
        return self._masked(path, name, self.redactor)

    def _masked(self, path: Path, name: str, redactor: Redactor) -> FileEntry:
        """Store a file with the secrets of its text masked. One the stat cache knows unchanged is
        not hashed again, and not even read when it cannot need masking: binary (a NUL byte), or
        text that held nothing to mask under the same masking (the same rules and secrets)."""
        masking = redactor.fingerprint(self.store.state.masking_key)
        with open(path, "rb") as fh:
            stamp = FileStamp.of(path, fh.fileno())
            known = self.store.cached_file(stamp)
            if known is not None and (known.binary or known.clean_under == masking):
                return _entry(path, name, known.ref)
            data = fh.read()
            unchanged = FileStamp.of(path, fh.fileno()) == stamp
        masked = mask_file(redactor, name, data)
        if masked is not None:
            self.masked.append(name)
            return _entry(path, name, self.store.put_bytes(masked))
        binary = b"\0" in data
        ref = known.ref if known is not None and unchanged else self.store.put_bytes(data)
        if unchanged:
            self.store.remember_file(stamp, KnownFile(ref, binary, clean_under=None if binary else masking))
        return _entry(path, name, ref)

    def walk(self, root: Path) -> list[FileEntry]:
        """Every file and link under `root`, links not followed, paths relative to it, sorted."""
        entries: list[FileEntry] = []
        for dirpath, dirnames, filenames in os.walk(root):
            base = Path(dirpath)
            links = [d for d in dirnames if (base / d).is_symlink()]  # os.walk lists, never enters them
            dirnames[:] = sorted(d for d in dirnames if d not in links)
            for name in sorted([*filenames, *links]):
                path = base / name
                if path.is_symlink() or path.is_file():
                    entry = self.add(path, path.relative_to(root).as_posix())
                    entries += [entry] if entry is not None else []
        return entries

    def _in_workspace(self, path: Path) -> str:
        parent = str(path.parent)
        real = self._real_dirs.get(parent)
        if real is None:  # resolved once per directory: a tree has far fewer than files
            real = self._real_dirs[parent] = os.path.realpath(parent)
        root = str(self.workspace)
        if real.startswith(root + "/"):  # the usual case, without relpath's work
            return f"{real[len(root) + 1 :]}/{path.name}"
        return os.path.relpath(os.path.join(real, path.name), root)

    def _link(self, path: Path, name: str) -> FileEntry | None:
        target = os.readlink(path)
        resolved = os.path.realpath(path)
        if not _inside(resolved, self.workspace):
            reason = f"symbolic link to {target}, outside the workspace: never followed"
            self.excluded.append(ExcludedFile(path=name, reason=reason))
            return None
        parent = os.path.realpath(path.parent)
        if link_problem(target, _depth(Path(parent), self.workspace)) is not None:
            target = os.path.relpath(resolved, parent)  # absolute, or climbing out and back in
        ref = self.store.put_bytes(os.fsencode(target))
        return FileEntry(path=name, sha256=ref.sha256, size=ref.size, link=target)


def _entry(path: Path, name: str, ref: BlobRef) -> FileEntry:
    return FileEntry(path=name, sha256=ref.sha256, size=ref.size, executable=os.access(path, os.X_OK))


def store_dir(store: Store, root: Path) -> list[FileEntry]:
    """Every file and link under `root` (see `TreeCapture`, with `root` as the workspace)."""
    return TreeCapture(store, root).walk(root)


def _inside(path: str, root: Path) -> bool:
    return path == str(root) or path.startswith(str(root).rstrip("/") + "/")


def _depth(directory: Path, workspace: Path) -> int:
    return len(directory.relative_to(workspace).parts)


def safe_join(root: Path, rel: str) -> Path:
    """`root / rel`, refusing paths that would escape `root` (a hostile or broken manifest): those
    `flaketriage.bundle.safety.path_problem` refuses, and those that lead out through a link."""
    problem = path_problem(rel, directory=True)
    if problem:
        raise BundleError(problem)
    target = (root / rel).resolve()
    if target != root.resolve() and root.resolve() not in target.parents:
        raise BundleError(path_message(rel, "leads out of the workspace through a symbolic link"))
    return target


def restore_files(
    store: Store, entries: Iterable[FileEntry], dest: Path, *, workspace: Path | None = None
) -> None:
    """Write each entry under `dest`, verified, with its executable bit, after checking every path
    (nothing is written when one is refused) and never past the size its entry records. A link is
    made only when its target stays inside `workspace` (default `dest`), else `BundleError`."""
    entries = list(entries)
    check_paths([entry.path for entry in entries])
    for entry in entries:
        if entry.link is not None:
            _restore_link(entry, dest, workspace or dest)
            continue
        target = safe_join(dest, entry.path)
        try:
            store.get_file(entry.sha256, target, max_size=entry.size)
            if entry.executable:
                target.chmod(target.stat().st_mode | 0o111)
        except OSError as exc:
            raise _unwritable(entry.path, dest, exc) from exc


def _restore_link(entry: FileEntry, dest: Path, workspace: Path) -> None:
    """Make the link `entry` describes, after checking its target stays inside `workspace`."""
    assert entry.link is not None
    rel = PurePosixPath(entry.path)
    # The directory the link is made in, as it really is (a path through a link is resolved): its
    # target climbs from there.
    parent = safe_join(dest, str(rel.parent))
    root = Path(os.path.realpath(workspace))
    inside = _inside(str(parent), root)
    problem = link_problem(entry.link, _depth(parent, root)) if inside else "is outside the workspace"
    if problem is not None:
        raise BundleError(link_message(entry.path, entry.link, problem))
    parent.mkdir(parents=True, exist_ok=True)
    link = parent / rel.name
    if link.exists() or link.is_symlink():
        raise BundleError(
            f"link {entry.path!r} in the manifest names a path that is already there; the bundle is "
            "damaged, re-capture the failure"
        )
    os.symlink(entry.link, link)


def _unwritable(rel: str, dest: Path, exc: OSError) -> BundleError:
    return BundleError(
        f"cannot restore {rel!r:.120} under {dest}: {exc.strerror or exc}; free space or fix permissions "
        "there, or re-capture the failure if the bundle's paths clash"
    )


def relative_to_cwd(path: Path, cwd: Path) -> str:
    """`path` as a POSIX path relative to `cwd`; data must live inside the working directory."""
    resolved = (cwd / path).resolve() if not path.is_absolute() else path.resolve()
    try:
        return resolved.relative_to(cwd.resolve()).as_posix()
    except ValueError as exc:
        raise DatasetError(
            f"--data {path} is outside the working directory {cwd}; declared data is restored at the "
            "same relative path on replay, so run the command from a directory that contains it "
            "(or link the data into the working directory)"
        ) from exc


def store_data_input(
    store: Store, path: Path, rel: str, *, items: int | None = None, workspace: Path | None = None
) -> DataInput:
    """Store a declared data input (file or directory) and describe it; `items` when already counted.

    Files are streamed into the store, so memory stays bounded whatever their size. A directory's
    links may point anywhere inside `workspace` (default: the directory itself); its items are the
    top-level entries that were stored (what a replay finds there), whatever `items` says.
    """
    from flaketriage.bundle.datasets import count_items, detect_format

    fmt = detect_format(path)
    if fmt == "dir":
        tree = TreeCapture(store, workspace or path)
        files = tuple(tree.walk(path))
        items = len({PurePosixPath(f.path).parts[0] for f in files})
        return DataInput(path=rel, format=fmt, items=items, files=files, excluded=tuple(tree.excluded))
    if items is None:
        items = count_items(path, fmt)
    return DataInput(path=rel, format=fmt, items=items, blob=store.put_file(path))


def restore_data_input(store: Store, data: DataInput, cwd: Path, *, workspace: Path | None = None) -> Path:
    """Write a data input back at its path under `cwd`, replacing what the source put there; links
    in a directory may point anywhere inside `workspace` (default `cwd`)."""
    target = safe_join(cwd, data.path)
    try:
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        if data.format == "dir":
            target.mkdir(parents=True, exist_ok=True)
        elif data.blob is not None:
            store.get_file(data.blob.sha256, target, max_size=data.blob.size)
    except OSError as exc:
        raise _unwritable(data.path, cwd, exc) from exc
    if data.format == "dir":
        restore_files(store, data.files, target, workspace=workspace or cwd)
    return target
