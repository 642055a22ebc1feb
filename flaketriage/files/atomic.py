"""Atomic file writes: a temp file beside the target, fsynced, renamed over it.

Readers see the old file or the new one, never half of one, and a crash leaves at most a hidden
temp file, never a truncated target (`remove_stale` deletes those once they are an hour old).
Every writer of a whole file uses this: `write_atomic` when the content and the target are known
up front, `staged_file` when the target is only known once the content is written (a
content-addressed object named by its hash), `write_unsynced` for many small files that the caller
syncs together later (a store's objects).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


class StagedFile:
    """A temp file being written; `commit` renames it to its target, else it is deleted."""

    def __init__(self, file: BinaryIO, path: Path) -> None:
        self.file = file
        """Open for writing (binary); closed by `commit`."""
        self.path = path
        """Where the temp file is (hidden, in the directory `staged_file` was given)."""
        self.committed = False

    def commit(self, target: Path, *, mode: int = 0o644, overwrite: bool = True, fsync: bool = True) -> bool:
        """Flush, fsync and rename the temp file to `target` (parents created); raises OSError.

        ``mode`` replaces mkstemp's 0600, which would hide reports and caches from the people and
        processes they are for. With ``overwrite=False`` an existing `target` is kept and False
        returned: for content-addressed targets, where any writer of a name writes the same bytes.
        ``fsync=False`` leaves syncing to the caller, who syncs many files at once later (a store's
        small objects) and must do so before anything durable names them.
        """
        self.file.flush()
        if fsync:
            os.fsync(self.file.fileno())
        self.file.close()
        if not overwrite and target.exists():
            return False
        os.chmod(self.path, mode)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.path, target)
        self.committed = True
        return True


@contextmanager
def staged_file(directory: Path, *, prefix: str = ".tmp-") -> Iterator[StagedFile]:
    """A temp file in `directory` (created if missing) for the block; deleted unless committed.

    `directory` must be on the target's file system, so the rename is atomic.
    """
    directory.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=directory, prefix=prefix)
    staged = StagedFile(os.fdopen(fd, "wb"), Path(name))
    try:
        yield staged
    finally:
        staged.file.close()
        if not staged.committed:
            staged.path.unlink(missing_ok=True)


def write_atomic(
    path: Path,
    data: bytes | Iterable[bytes],
    *,
    mode: int = 0o644,
    overwrite: bool = True,
    fsync: bool = True,
) -> bool:
    """Replace `path` with `data` (bytes, or chunks streamed in order); raises OSError.

    Missing parent directories are created; an exception raised while `data` is consumed leaves
    `path` untouched and removes the temp file. With ``overwrite=False`` an existing `path` is kept,
    and with ``fsync=False`` the caller syncs it later (see `StagedFile.commit`). Returns whether
    `path` was written.
    """
    with staged_file(path.parent, prefix=f".{path.name}.") as staged:
        for chunk in [data] if isinstance(data, bytes) else data:
            staged.file.write(chunk)
        return staged.commit(path, mode=mode, overwrite=overwrite, fsync=fsync)


_UNIQUE = itertools.count()


def write_unsynced(path: str, data: bytes, *, mode: int = 0o644) -> None:
    """Write `data` to a hidden temp file in `path`'s directory (which must exist) and rename it to
    `path`, replacing what is there, without syncing: the fewest system calls for one of thousands
    of small files that the caller syncs together (``syncfs``) before anything durable names them.
    Raises OSError; a failed write leaves `path` untouched and removes the temp file."""
    directory, name = os.path.split(path)
    temp = os.path.join(directory, f".{name}.{os.getpid()}.{next(_UNIQUE)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask may have narrowed it
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


STALE_AFTER_S = 3600.0
"""A temp file untouched this long was left by a writer that died: a live one keeps writing to it."""


def remove_stale(directory: Path, *, hidden_only: bool = True, older_than_s: float = STALE_AFTER_S) -> int:
    """Delete the temp files in `directory` (not below it) left by writers killed mid-write.

    Those are hidden ``.name.*`` files (`write_atomic`'s names), or, with `hidden_only` False,
    every file (a directory that holds only temp files). Only files untouched for `older_than_s`
    are deleted, by modification time. Never raises: a file that cannot be deleted stays. Returns
    how many were deleted.
    """
    cutoff = time.time() - older_than_s
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        if hidden_only and not entry.name.startswith("."):
            continue
        try:
            if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                os.unlink(entry.path)
                removed += 1
        except OSError:
            continue
    return removed
