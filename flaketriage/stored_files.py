"""File trees and data inputs in a store: store files as blobs, restore them at their paths."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from flaketriage.errors import BundleError, DatasetError
from flaketriage.manifest import DataInput, FileEntry
from flaketriage.store import Store


def store_file(store: Store, path: Path, name: str) -> FileEntry:
    ref = store.put_file(path)
    return FileEntry(
        path=Path(name).as_posix(), sha256=ref.sha256, size=ref.size, executable=os.access(path, os.X_OK)
    )


def store_dir(store: Store, root: Path) -> list[FileEntry]:
    """Every regular file under `root` (symlinks are followed), paths relative to it, sorted."""
    entries: list[FileEntry] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_file():
                entries.append(store_file(store, path, str(path.relative_to(root))))
    return entries


def safe_join(root: Path, rel: str) -> Path:
    """`root / rel`, refusing paths that would escape `root` (a hostile or broken manifest)."""
    target = (root / rel).resolve()
    if target != root.resolve() and root.resolve() not in target.parents:
        raise BundleError(f"path {rel!r} in the manifest points outside the workspace; refusing to write it")
    return target


def restore_files(store: Store, entries: Iterable[FileEntry], dest: Path) -> None:
    """Write each entry under `dest`, verified, with its executable bit."""
    for entry in entries:
        target = safe_join(dest, entry.path)
        store.get_file(entry.sha256, target)
        if entry.executable:
            target.chmod(target.stat().st_mode | 0o111)


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


def store_data_input(store: Store, path: Path, rel: str) -> DataInput:
    """Store a declared data input (file or directory) and describe it."""
    from flaketriage.datasets import count_items, detect_format

    fmt = detect_format(path)
    items = count_items(path, fmt)
    if fmt == "dir":
        return DataInput(path=rel, format=fmt, items=items, files=tuple(store_dir(store, path)))
    return DataInput(path=rel, format=fmt, items=items, blob=store.put_file(path))


def restore_data_input(store: Store, data: DataInput, cwd: Path) -> Path:
    """Write a data input back at its path under `cwd`, replacing what the source put there."""
    target = safe_join(cwd, data.path)
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
    if data.format == "dir":
        target.mkdir(parents=True, exist_ok=True)
        restore_files(store, data.files, target)
    elif data.blob is not None:
        store.get_file(data.blob.sha256, target)
    return target
