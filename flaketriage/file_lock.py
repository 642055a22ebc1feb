"""The file lock: an exclusive ``fcntl`` lock on a lock file, held for a read-modify-write.

Writers that update one file in place (an issue, the quarantine list) take it around the read and
the `flaketriage.atomic` write, so concurrent processes never lose each other's changes. POSIX
only, like the sandboxes.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_path` (created, with its directory, if missing) for the block.

    Raises OSError when the lock file cannot be created; callers translate it into their own error.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
