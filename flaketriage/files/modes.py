"""File modes: what flaketriage writes in and beside a local store is its owner's alone, unless the
store is shared through a Unix group. Light on purpose: the pytest plugin writes its caches and
outbox with these modes without importing the store."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FileModes:
    """The modes of what flaketriage writes in and beside a local store: its objects and refs, and
    the issues, comment replies, quarantine list and databases the CLI and the service keep there.
    They hold source and logs, so they are their owner's alone unless the store is `shared`."""

    file: int
    directory: int

    @classmethod
    def of(cls, shared: bool) -> FileModes:
        """Owner-only (0600, 0700), or for a store a team shares through a Unix group, readable by
        the group (0640, and 2770: the set-group-id bit gives new entries the directory's group)."""
        return cls(0o640, 0o2770) if shared else cls(0o600, 0o700)

    def make_dirs(self, directory: Path) -> None:
        """Create `directory` and its missing parents with `self.directory` (raises OSError).
        Directories already there keep their modes: they may be the user's own."""
        missing: list[Path] = []
        while not directory.is_dir():
            missing.append(directory)
            if directory.parent == directory:
                break
            directory = directory.parent
        for path in reversed(missing):
            try:
                path.mkdir()
            except FileExistsError:
                if not path.is_dir():
                    raise
                continue  # made by another writer meanwhile
            os.chmod(path, self.directory)  # mkdir's mode would pass through the umask

    def create_file(self, path: Path) -> None:
        """Create `path` empty with `self.file` unless it exists (a database SQLite then opens:
        SQLite gives its journal and WAL files the database's mode)."""
        self.make_dirs(path.parent)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, self.file)
        except FileExistsError:
            return
        try:
            os.fchmod(fd, self.file)  # the umask may have narrowed it
        finally:
            os.close(fd)


OWNER_ONLY = FileModes.of(shared=False)
