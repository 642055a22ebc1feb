"""The file lock: exclusive while held, released on exit (also by an exception), across processes."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flaketriage.files.lock import locked


def _free(path: Path) -> bool:
    """Whether another open file description could take the lock now."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_held_for_the_block_and_released_after(tmp_path: Path) -> None:
    lock = tmp_path / "deep" / "dir" / ".lock"
    with locked(lock):
        assert lock.is_file() and not _free(lock)
    assert _free(lock)


def test_released_when_the_block_raises(tmp_path: Path) -> None:
    lock = tmp_path / ".lock"
    with pytest.raises(RuntimeError), locked(lock):
        raise RuntimeError("boom")
    assert _free(lock)


def test_a_lock_file_that_cannot_be_created_is_an_oserror(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(OSError), locked(blocker / ".lock"):
        pass


def test_another_process_waits_for_the_holder(tmp_path: Path) -> None:
    lock = tmp_path / ".lock"
    log = tmp_path / "log"
    code = textwrap.dedent(
        f"""
        from pathlib import Path
        from flaketriage.files.lock import locked
        with locked(Path({str(lock)!r})):
            with open({str(log)!r}, "a") as fh:
                fh.write("child\\n")
        """
    )
    with locked(lock):
        child = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(0.5)  # time enough for the child to reach the lock and block on it
        with log.open("a") as fh:
            fh.write("parent\n")
    assert child.wait(timeout=60) == 0
    assert log.read_text() == "parent\nchild\n"
