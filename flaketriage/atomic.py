"""Atomic file writes: a temp file beside the target, fsynced, renamed over it.

Readers see the old file or the new one, never half of one, and a crash leaves at most a hidden
``.name.*`` temp file, never a truncated target. Every writer of a whole file uses this.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


def write_atomic(path: Path, data: bytes | Iterable[bytes], *, mode: int = 0o644) -> None:
    """Replace `path` with `data` (bytes, or chunks streamed in order); raises OSError.

    Missing parent directories are created. ``mode`` replaces mkstemp's 0600, which would hide
    reports and caches from the people and processes they are for.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in [data] if isinstance(data, bytes) else data:
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
