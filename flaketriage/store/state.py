"""The stat cache: which files a store already holds, known by their stat, so they are not read again.

An entry maps a file's absolute path, device, inode, size, modification and change times to the
SHA-256 of the bytes stored from it (the way git's index and DVC's state database do). A later
``put_file`` of the same path whose stat still matches, and whose object is still in the store,
reads nothing. Any write to the file changes its mtime and ctime; a rename puts another inode
there; ``touch -d`` or ``os.utime`` set the mtime back but move the ctime, which nobody can set.

The racy case (git's "racily clean" entries): a file can be modified within the same timestamp
tick that it was read in, and keep the stat the entry recorded. So an entry is recorded only when
the file's mtime and ctime are older, by `RACY_MARGIN_NS`, than the moment the read began: a write
after the read then lands in a later tick and shows. The margin covers file systems that keep
whole seconds (ext3, HFS+) and FAT's two-second ticks; a file written in the last two seconds is
simply read again next time.

A text file stored with its secrets masked depends on the secrets too: its entry also says under
which masking (`KnownFile.clean_under`, a keyed hash of the redactor's rules and the secret values it
knows, see `FileState.masking_key`) it held nothing to mask. The database is its owner's alone
(0600), like the environment those values come from.

The cache never decides what a bundle holds on its own: a miss reads the file, and a cache that
cannot be opened or written (a damaged database, a read-only directory, another process holding
the lock too long) is passed over without failing the capture.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flaketriage.bundle.manifest import BlobRef

RACY_MARGIN_NS = 2_000_000_000
"""How much older than the read a file's mtime and ctime must be for its entry to be trusted."""
KEEP_NS = 90 * 86400 * 10**9
"""Entries not rewritten for this long are dropped (a file deleted long ago, a moved workspace)."""
_BATCH = 512
"""Entries kept in memory before they are written (and at every `FileState.flush`)."""
_SCHEMA = 2
"""The database's ``user_version``: a database of another version is emptied, not read."""


@dataclass(frozen=True)
class FileStamp:
    """What the stat of one file says about its content; equal stamps mean an unchanged file."""

    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int
    taken_ns: int = field(default=0, compare=False)
    """When the stamp was taken (wall clock), before the file was read: what the racy rule compares."""

    @classmethod
    def of(cls, path: str | os.PathLike[str], fd: int) -> FileStamp:
        """The stamp of the file open as `fd` (opened from `path`)."""
        st = os.fstat(fd)
        text = os.fspath(path)
        return cls(
            path=text if os.path.isabs(text) and "/." not in text else os.path.abspath(text),
            device=st.st_dev,
            inode=st.st_ino,
            size=st.st_size,
            mtime_ns=st.st_mtime_ns,
            ctime_ns=st.st_ctime_ns,
            taken_ns=time.time_ns(),
        )

    def settled(self, margin_ns: int = RACY_MARGIN_NS) -> bool:
        """Whether the file was last changed at least `margin_ns` before the stamp was taken."""
        return max(self.mtime_ns, self.ctime_ns) + margin_ns <= self.taken_ns


@dataclass(frozen=True)
class KnownFile:
    """A file's stored bytes: their blob, and whether they hold a NUL byte (binary: never masked)."""

    ref: BlobRef
    binary: bool
    clean_under: str | None = None
    """For a text file: the masking (`flaketriage.bundle.redaction.Redactor.fingerprint`) under which it
    held no secret, so it was stored as it is; None when that is not known."""


_Row = tuple[int, int, int, int, int, str, int, str | None]
"""device, inode, size, mtime_ns, ctime_ns, sha256, binary, clean_under"""


class FileState:
    """A stat cache that remembers nothing: for stores with no place of their own to keep one."""

    margin_ns: int = RACY_MARGIN_NS

    @property
    def masking_key(self) -> bytes:
        """The key `KnownFile.clean_under` hashes are made with: random, kept with the entries."""
        key: bytes | None = getattr(self, "_masking_key", None)
        if key is None:
            key = self._masking_key = secrets.token_bytes(32)
        return key

    def get(self, stamp: FileStamp) -> KnownFile | None:
        """What was stored from the file `stamp` describes, if it is still that file."""
        return None

    def put(self, stamp: FileStamp, known: KnownFile) -> None:
        """Remember what was stored from the file `stamp` describes (racy stamps are left out)."""

    def flush(self) -> None:
        """Write what `put` holds in memory."""


NO_STATE = FileState()


class MemoryFileState(FileState):
    """A stat cache in a dictionary: for in-memory stores, shared like their objects."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[FileStamp, KnownFile]] = {}
        self._lock = threading.Lock()

    def get(self, stamp: FileStamp) -> KnownFile | None:
        found = self._entries.get(stamp.path)
        return found[1] if found is not None and found[0] == stamp else None

    def put(self, stamp: FileStamp, known: KnownFile) -> None:
        if stamp.settled(self.margin_ns) and stamp.size == known.ref.size:
            with self._lock:
                self._entries[stamp.path] = (stamp, known)


class SqliteFileState(FileState):
    """A stat cache in a SQLite database (WAL mode), safe for several processes at once.

    Opened at first use. Entries are written in batches (and at `flush`); a write that waits on
    another process longer than a few seconds, or any database error, turns the cache off for the
    rest of the process: the files are read instead.
    """

    def __init__(self, path: Path, *, mode: int = 0o600) -> None:
        self.path = path
        self.mode = mode
        self._db: sqlite3.Connection | None = None
        self._broken = False
        self._key: bytes | None = None
        self._pending: dict[str, tuple[FileStamp, KnownFile]] = {}
        self._loaded: dict[str, dict[str, _Row]] = {}
        """The entries of each directory asked about, read with one query: files come by directory."""
        self._lock = threading.Lock()

    def get(self, stamp: FileStamp) -> KnownFile | None:
        with self._lock:
            pending = self._pending.get(stamp.path)
            if pending is not None:
                return pending[1] if pending[0] == stamp else None
            directory, name = os.path.split(stamp.path)
            rows = self._loaded.get(directory)
            if rows is None:
                rows = self._loaded[directory] = self._directory(directory)
            row = rows.get(name)
        if row is None or tuple(row[:5]) != (
            stamp.device,
            stamp.inode,
            stamp.size,
            stamp.mtime_ns,
            stamp.ctime_ns,
        ):
            return None
        return KnownFile(BlobRef(sha256=row[5], size=stamp.size), bool(row[6]), row[7])

    @property
    def masking_key(self) -> bytes:
        with self._lock:
            if self._key is None and self._connect() is not None:
                self._guarded(self._read_key)
            return self._key if self._key is not None else super().masking_key

    def _read_key(self, db: sqlite3.Connection) -> None:
        query = "SELECT value FROM meta WHERE name = 'masking_key'"
        row = db.execute(query).fetchone()
        if row is None:
            with db:  # one key for every process: the first to come writes it
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT OR IGNORE INTO meta VALUES ('masking_key', ?)", (secrets.token_bytes(32),))
                row = db.execute(query).fetchone()
        self._key = bytes(row[0])

    def put(self, stamp: FileStamp, known: KnownFile) -> None:
        if not stamp.settled(self.margin_ns) or stamp.size != known.ref.size:
            return
        with self._lock:
            self._pending[stamp.path] = (stamp, known)
            full = len(self._pending) >= _BATCH or known.ref.size >= 1 << 20
        if full:  # a large file's entry is worth a write at once: a read of it costs far more
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
            if not pending or self._connect() is None:
                return
            for s, k in pending.values():
                directory, name = os.path.split(s.path)
                if directory in self._loaded:
                    row = (s.device, s.inode, s.size, s.mtime_ns, s.ctime_ns, k.ref.sha256, int(k.binary))
                    self._loaded[directory][name] = (*row, k.clean_under)
            rows = [
                (
                    os.fsencode(s.path),
                    os.fsencode(os.path.dirname(s.path)),
                    s.device,
                    s.inode,
                    s.size,
                    s.mtime_ns,
                    s.ctime_ns,
                    k.ref.sha256,
                    int(k.binary),
                    k.clean_under,
                    s.taken_ns,
                )
                for s, k in pending.values()
            ]
            self._guarded(lambda db: self._write(db, rows))

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # -- the database ---------------------------------------------------------------------------
    def _directory(self, directory: str) -> dict[str, _Row]:
        """The entries of the files in `directory` (not below it), by name."""
        found: dict[str, _Row] = {}
        if self._connect() is None:
            return found

        def query(db: sqlite3.Connection) -> None:
            for path, *row in db.execute(
                "SELECT path, device, inode, size, mtime_ns, ctime_ns, sha256, binary, clean_under "
                "FROM files WHERE dir = ?",
                (os.fsencode(directory),),
            ):
                found[os.path.basename(os.fsdecode(path))] = tuple(row)

        self._guarded(query)
        return found

    @staticmethod
    def _write(db: sqlite3.Connection, rows: Sequence[tuple[object, ...]]) -> None:
        with db:
            db.execute("BEGIN IMMEDIATE")
            db.executemany("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            if random.random() < 0.02:  # now and then, not at every write: a full scan
                db.execute("DELETE FROM files WHERE stored_ns < ?", (time.time_ns() - KEEP_NS,))

    def _connect(self) -> sqlite3.Connection | None:
        if self._db is not None or self._broken:
            return self._db
        for attempt in range(2):
            try:
                self._db = self._open()
                return self._db
            except sqlite3.DatabaseError as exc:
                damaged = getattr(exc, "sqlite_errorname", "") in ("SQLITE_CORRUPT", "SQLITE_NOTADB")
                if attempt == 0 and damaged and self._discard_damaged():
                    continue  # never for a lock another process holds: only a file SQLite cannot read
                break
            except (sqlite3.Error, OSError):
                break
        self._broken = True
        return None

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Created before SQLite opens it, so that it (and its -wal and -shm files, which take its
        # mode) holds its owner's paths for its owner alone.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, self.mode))
        db = sqlite3.connect(self.path, timeout=5.0, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # a cache: a crash may lose entries, never corrupt it
            with db:
                db.execute("BEGIN IMMEDIATE")
                if db.execute("PRAGMA user_version").fetchone()[0] != _SCHEMA:
                    db.execute("DROP TABLE IF EXISTS files")
                    db.execute("DROP TABLE IF EXISTS meta")
                    db.execute(f"PRAGMA user_version = {_SCHEMA}")
                db.execute(
                    "CREATE TABLE IF NOT EXISTS files (path BLOB PRIMARY KEY, dir BLOB, device INTEGER, "
                    "inode INTEGER, size INTEGER, mtime_ns INTEGER, ctime_ns INTEGER, sha256 TEXT, "
                    "binary INTEGER, clean_under TEXT, stored_ns INTEGER) WITHOUT ROWID"
                )
                db.execute("CREATE INDEX IF NOT EXISTS files_by_dir ON files (dir)")
                db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BLOB)")
        except sqlite3.Error:
            db.close()
            raise
        return db

    def _discard_damaged(self) -> bool:
        """Remove a database file SQLite cannot read (it is only a cache); whether one was there."""
        removed = False
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")
                removed = True
        return removed

    def _guarded(self, action: Callable[[sqlite3.Connection], Any]) -> None:
        db = self._db
        if db is None:
            return
        try:
            action(db)
        except sqlite3.Error:
            self._broken = True
            with contextlib.suppress(sqlite3.Error):
                db.close()
            self._db = None
