"""`LocalStore`: a store in a directory, objects at ``objects/ab/cdef...``, refs under ``refs/``.

Every write goes through `flaketriage.files.atomic`: a unique temp file renamed into place, so concurrent
writers of the same object race harmlessly and a crash never leaves a half-written object under its
final name. An object is written once; a later writer of the same key keeps the one there.

Durability is batched: a large object (a file of `CHUNK` bytes or more) is synced before it is
named, but small ones, thousands per capture, are named at once and made durable together by
`LocalStore.flush`, which `write_bundle` calls before the manifest that names them is listed (one
``syncfs`` for many, an ``fsync`` each for a few). What a power cut can leave is an object file
that is empty: it counts as absent, and the next writer of that key replaces it.

`put_file` reads each byte once: it hashes, samples for compression and writes in the same pass,
and a file the stat cache (``state/<uid>.sqlite``, one per user: `flaketriage.store.state`) knows
unchanged is not read at all.

Bundles hold source, logs and data, so what the store creates is its owner's alone (files 0600,
directories 0700); a store `shared` by a team is group-readable instead (files 0640, directories
2770, whose set-group-id bit gives new entries the directory's group).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from flaketriage.bundle.manifest import BlobRef
from flaketriage.errors import (
    ConfigError,
    ObjectNotFoundError,
    StoreError,
    StoreNotWritableError,
)
from flaketriage.files.atomic import (
    STALE_AFTER_S,
    StagedFile,
    remove_stale,
    staged_file,
    write_atomic,
    write_unsynced,
)
from flaketriage.files.modes import FileModes
from flaketriage.store.base import CHUNK, RAW, ZSTD, Store, StoreSettings, check_key
from flaketriage.store.compression import LEVEL, pays
from flaketriage.store.registry import local_path
from flaketriage.store.state import KnownFile, SqliteFileState

_SWEPT = ".swept"
"""Touched in ``objects/`` by each full sweep of stale temp files (no object key looks like it)."""
SYNC_EACH_MAX = 64
"""`LocalStore.flush` syncs up to this many objects one by one, more with one ``syncfs``."""
RECENT_S = 60.0
"""An object found written this recently by another writer may not be on disk yet: `flush` syncs it
too before a manifest of this process names it."""
FRESHEN_AFTER_S = 60.0
"""An object a writer reuses whose mtime is older than this gets the current time (`Store.reuse`):
garbage collection's grace period (an hour by default) is counted from there."""


class LocalStore(Store):
    """A content-addressed store under one directory."""

    def __init__(self, root: Path | str, readonly: bool = False, *, shared: bool = False) -> None:
        self.root = Path(root).absolute()
        self.readonly = readonly
        self.shared = shared
        self.modes = FileModes.of(shared)
        self.file_mode = self.modes.file
        self.dir_mode = self.modes.directory
        if readonly:
            try:
                found = self.root.is_dir()
            except OSError as exc:  # a path too long, a component not a directory, ...
                raise self._unreadable(self.root, exc) from exc
            if not found:
                raise StoreError(f"no store at {self.root}: the directory does not exist")
        else:
            self._prepare()
            self.state = SqliteFileState(self.root / "state" / f"{os.getuid()}.sqlite")
        self._unsynced: set[str] = set()
        self._unsynced_lock = threading.Lock()

    @classmethod
    def from_url(
        cls, url: str, *, readonly: bool = False, shared: bool = False, settings: StoreSettings | None = None
    ) -> LocalStore:
        path = local_path(url)
        if path is None:
            raise ConfigError(f"{url} is not a local store: LocalStore opens directories and file:// URLs")
        return cls(path, readonly=readonly, shared=shared)

    @property
    def url(self) -> str:
        return self.root.as_uri()

    @property
    def location(self) -> str:
        return str(self.root)

    def _prepare(self) -> None:
        try:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            self._make_dir(self.root)  # an existing root may be a directory of the user's own
            for sub in ("objects", "refs", "tmp", "state"):
                self._make_dir(self.root / sub, existing=True)
            with tempfile.NamedTemporaryFile(dir=self.root / "tmp"):
                pass  # creating a file is the only reliable writability test (root ignores modes)
        except OSError as exc:
            raise StoreNotWritableError(
                f"cannot write to the store at {self.root} ({exc.strerror or exc}); pass --store with a "
                "writable directory or set FLAKETRIAGE_STORE"
            ) from exc
        self._sweep_stale()

    def _sweep_stale(self) -> None:
        """Delete what writers killed mid-write left (`atomic.remove_stale`, an hour old): ``tmp/`` at
        every open (one listing), the hidden temp files beside objects and refs at most hourly
        (a listing of every object directory), as ``objects/.swept`` records."""
        remove_stale(self.root / "tmp", hidden_only=False)
        marker = self.root / "objects" / _SWEPT
        try:
            if time.time() - marker.stat().st_mtime < STALE_AFTER_S:
                return
        except OSError:
            pass  # never swept
        try:
            marker.touch(mode=self.file_mode)
        except OSError:
            return
        for top in (self.root / "objects", self.root / "refs"):
            for directory, _, _ in os.walk(top):
                remove_stale(Path(directory))

    def _make_dir(self, directory: Path, *, existing: bool = False) -> None:
        """Create `directory` with the store's mode; with `existing`, one of the store's own that
        is already there (and is this user's) gets that mode too, so that a store written before
        the modes were set, or switched to or from shared, follows the setting."""
        try:
            directory.mkdir()
        except FileExistsError:
            if not existing or directory.stat().st_uid != os.getuid():
                return
        os.chmod(directory, self.dir_mode)  # mkdir's mode would pass through the umask

    def _make_parents(self, path: Path) -> None:
        """The directories between the store root and `path`, created with the store's mode."""
        missing: list[Path] = []
        directory = path.parent
        while directory != self.root and not directory.is_dir():
            missing.append(directory)
            directory = directory.parent
        for directory in reversed(missing):
            self._make_dir(directory)

    def _object_path(self, key: str) -> Path:
        return self.root / "objects" / key[:2] / key[2:]

    def _atomic_write(
        self, final: Path, chunks: Iterator[bytes] | list[bytes], *, once: bool = False
    ) -> None:
        """`write_atomic`; with `once`, an object already at `final` is kept (content-addressed)."""
        try:
            self._make_parents(final)
            write_atomic(final, chunks, mode=self.file_mode, overwrite=not once)
        except OSError as exc:
            raise self._not_writable(final, exc) from exc

    @staticmethod
    def _not_writable(final: Path, exc: OSError) -> OSError | StoreNotWritableError:
        if exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM, errno.ENOSPC):
            return StoreNotWritableError(
                f"cannot write {final} ({exc.strerror}); free space or fix permissions on the store"
            )
        return exc

    # -- primitives ---------------------------------------------------------------------------
    def _read_object(self, key: str) -> bytes:
        with self._open_object(key) as fh:
            return fh.read()

    def _open_object(self, key: str) -> BinaryIO:
        path = self._object_path(key)
        try:
            return path.open("rb")
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(key, self.location) from exc
        except OSError as exc:
            raise self._unreadable(path, exc) from exc

    @staticmethod
    def _unreadable(path: Path, exc: OSError) -> StoreError:
        return StoreError(
            f"cannot read {path} ({exc.strerror or exc}); the store is damaged or not readable by you: "
            "fix its permissions, or restore it from a copy"
        )

    def _write_object(self, key: str, stored: bytes) -> None:
        path = f"{self.root}/objects/{key[:2]}/{key[2:]}"  # a string: it runs per file
        if self._present(path, freshen=True):
            return
        try:
            try:  # an empty file a power cut left is replaced: it is no object
                write_unsynced(path, stored, mode=self.file_mode)
            except FileNotFoundError:  # the first object under this prefix
                self._make_parents(Path(path))
                write_unsynced(path, stored, mode=self.file_mode)
        except OSError as exc:
            raise self._not_writable(Path(path), exc) from exc
        with self._unsynced_lock:
            self._unsynced.add(path)

    def _present(self, path: Path | str, *, freshen: bool = False) -> bool:
        """Whether an object file is there and not empty (every stored form has its tag byte). With
        `freshen` (a writer reuses it), an old one gets the current mtime (`Store.reuse`)."""
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        if not st.st_size:
            return False
        age = time.time() - st.st_mtime
        if age < RECENT_S:
            with self._unsynced_lock:
                self._unsynced.add(os.fspath(path))
        elif freshen and age > FRESHEN_AFTER_S and not self.readonly:
            with contextlib.suppress(OSError):  # not ours to touch: a shared store's other owner
                os.utime(path)
        return True

    def reuse(self, key: str) -> bool:
        check_key(key)
        return self._present(f"{self.root}/objects/{key[:2]}/{key[2:]}", freshen=True)

    def flush(self) -> None:
        """Sync the objects written (or found just written) since the last flush."""
        with self._unsynced_lock:
            paths, self._unsynced = self._unsynced, set()
        try:
            if len(paths) > SYNC_EACH_MAX:
                _sync_file_system(self.root)
            else:
                for path in sorted(paths):
                    _fsync(Path(path))
        except OSError as exc:
            with self._unsynced_lock:
                self._unsynced |= paths
            raise self._not_writable(self.root / "objects", exc) from exc
        super().flush()

    def _write_stream(self, key: str, stored: Iterator[bytes]) -> None:
        """A copied object (`Store.put_stored`), synced as it is named; an empty file a power cut
        left under its name is replaced (any writer of a key writes the same bytes)."""
        path = self._object_path(key)
        if not self._present(path, freshen=True):
            self._atomic_write(path, stored)

    def has(self, key: str) -> bool:
        check_key(key)
        return self._present(f"{self.root}/objects/{key[:2]}/{key[2:]}")  # a string: it runs per file

    def keys(self) -> Iterator[str]:
        objects = self.root / "objects"
        for sub in sorted(objects.glob("??")):
            for obj in sorted(sub.iterdir()):
                if not obj.name.startswith("."):
                    yield sub.name + obj.name

    def delete(self, key: str) -> None:
        self._refuse_if_readonly()
        self._object_path(check_key(key)).unlink(missing_ok=True)

    def put_ref(self, name: str, data: bytes) -> None:
        self._refuse_if_readonly()
        self._atomic_write(self._ref_path(name), [data])

    def delete_ref(self, name: str) -> None:
        self._refuse_if_readonly()
        self._ref_path(name).unlink(missing_ok=True)

    def age(self, key: str) -> timedelta | None:
        try:
            mtime = self._object_path(check_key(key)).stat().st_mtime
        except OSError:
            return None
        return timedelta(seconds=max(0.0, time.time() - mtime))

    def get_ref(self, name: str) -> bytes | None:
        path = self._ref_path(name)
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._unreadable(path, exc) from exc

    def list_refs(self, prefix: str) -> list[str]:
        base = self._ref_path(prefix) if prefix else self.root / "refs"
        try:
            if not base.is_dir():
                return []
            return [f"{prefix}{p.name}" for p in base.iterdir() if p.is_file() and not p.name.startswith(".")]
        except OSError as exc:
            raise self._unreadable(base, exc) from exc

    def _ref_path(self, name: str) -> Path:
        parts = [p for p in name.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise StoreError(f"ref name {name!r} may not contain '.' or '..' parts")
        return self.root.joinpath("refs", *parts)

    # -- streaming ----------------------------------------------------------------------------
    def _put_stream(self, stream: BinaryIO, size: int) -> KnownFile:
        """One pass: each chunk is hashed, checked for NUL bytes and written as it is read.

        A file shorter than `CHUNK` goes through `put_bytes` (nothing is written when the key is
        here). A larger one is streamed into a staged file in ``tmp/``, zstd-compressed when its
        first chunk says that pays, and named by its hash at the end, or dropped when the store has
        that key already.
        """
        head = stream.read(CHUNK)
        if len(head) < CHUNK:  # a regular file reads short only at its end
            return KnownFile(self.put_bytes(head), binary=b"\0" in head)
        compress = pays(head)
        digest = hashlib.sha256()
        total = 0
        binary = False
        with staged_file(self.root / "tmp", prefix="put-") as staged:
            out = staged.file
            out.write(ZSTD if compress else RAW)
            sink: BinaryIO = out
            if compress:
                import zstandard

                # Several threads for a large file: the output differs, the key (raw bytes) does not.
                sink = zstandard.ZstdCompressor(level=LEVEL, threads=-1).stream_writer(out, closefd=False)
            buffer = bytearray(CHUNK)
            view = memoryview(buffer)
            buffer[:] = head
            n = len(head)
            kicked = synced = 0
            while n:
                chunk = view[:n]
                digest.update(chunk)
                binary = binary or buffer.find(0, 0, n) >= 0
                sink.write(chunk)
                total += n
                if total - kicked >= _WRITEBACK_EVERY:
                    out.flush()
                    synced, kicked = _start_writeback(out.fileno(), synced, out.tell()), total
                n = stream.readinto(buffer)  # type: ignore[attr-defined]
            if compress:
                sink.close()
            key = digest.hexdigest()
            final = self._object_path(key)
            if not self._present(final, freshen=True):
                self._commit(staged, final)
        return KnownFile(BlobRef(sha256=key, size=total), binary)

    def _commit(self, staged: StagedFile, final: Path) -> None:
        """Sync and name a staged large object (an empty file under its name is replaced)."""
        try:
            if final.is_file() and final.stat().st_size == 0:
                final.unlink()  # what a power cut left: no object (a full one is kept, below)
            self._make_parents(final)
            staged.commit(final, mode=self.file_mode, overwrite=False)
        except OSError as exc:
            raise self._not_writable(final, exc) from exc


_WRITEBACK_EVERY = 32 << 20


def _start_writeback(fd: int, start: int, end: int) -> int:
    """Have the kernel start writing bytes `start`..`end` of `fd` to disk, without waiting (Linux's
    ``sync_file_range``): the fsync before a large object is named then waits for its tail only,
    and the disk works while the rest is read and hashed. Returns `end`."""
    writeback = _writeback_call()
    if writeback is not None and end > start:
        writeback(fd, start, end - start, 2)  # SYNC_FILE_RANGE_WRITE; a failure is the fsync's to say
    return end


@functools.cache
def _writeback_call() -> Any:
    import ctypes

    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    return call


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return  # deleted since (garbage collection): nothing to make durable
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_file_system(directory: Path) -> None:
    """``syncfs(2)`` on the file system that holds `directory`; ``sync()`` where there is none."""
    import ctypes

    try:
        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        os.sync()
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(directory))
    finally:
        os.close(fd)
