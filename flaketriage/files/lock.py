"""The file lock: an exclusive ``fcntl`` lock on a lock file, held for a read-modify-write.

Writers that update one file in place (an issue, the quarantine list) take it around the read and
the `flaketriage.files.atomic` write, so concurrent processes never lose each other's changes. POSIX
only, like the sandboxes.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def locked(lock_path: Path, mode: int | None = None) -> Iterator[None]:
    """Hold an exclusive lock on `lock_path` (created, with its directory, if missing) for the block.

    A lock file created here has `mode` exactly (a store's file mode: the umask neither widens nor
    narrows it), or with None 0644 through the umask. Raises OSError when the lock file cannot be
    created; callers translate it into their own error.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open(lock_path, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _open(path: Path, mode: int | None) -> int:
    # Read-only is all flock needs, and it lets a member of a shared store's group lock a file
    # another member created (0640: not writable by the group).
    try:
        fd = os.open(
            path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644 if mode is None else mode
        )
    except FileExistsError:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    if mode is not None:
        os.fchmod(fd, mode)  # the umask may have narrowed it
    return fd
