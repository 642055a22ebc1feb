"""`LocalStore`: a store in a directory, objects at ``objects/ab/cdef...``, refs under ``refs/``.

Every write goes through `flaketriage.atomic`: a unique temp file renamed into place, so concurrent
writers of the same object race harmlessly and a crash never leaves a half-written object under its
final name. An object is written once; a later writer of the same key keeps the one there.

Bundles hold source, logs and data, so what the store creates is its owner's alone (files 0600,
directories 0700); a store `shared` by a team is group-readable instead (files 0640, directories
2770, whose set-group-id bit gives new entries the directory's group).
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

from flaketriage.atomic import STALE_AFTER_S, remove_stale, staged_file, write_atomic
from flaketriage.errors import (
    ConfigError,
    ObjectNotFoundError,
    StoreError,
    StoreNotWritableError,
)
from flaketriage.manifest import BlobRef
from flaketriage.store.base import CHUNK, RAW, ZSTD, Store, check_key
from flaketriage.store.registry import local_path

_SWEPT = ".swept"
"""Touched in ``objects/`` by each full sweep of stale temp files (no object key looks like it)."""


class LocalStore(Store):
    """A content-addressed store under one directory."""

    def __init__(self, root: Path | str, readonly: bool = False, *, shared: bool = False) -> None:
        self.root = Path(root).absolute()
        self.readonly = readonly
        self.shared = shared
        self.file_mode = 0o640 if shared else 0o600
        self.dir_mode = 0o2770 if shared else 0o700
        if readonly:
            try:
                found = self.root.is_dir()
            except OSError as exc:  # a path too long, a component not a directory, ...
                raise self._unreadable(self.root, exc) from exc
            if not found:
                raise StoreError(f"no store at {self.root}: the directory does not exist")
        else:
            self._prepare()

    @classmethod
    def from_url(cls, url: str, *, readonly: bool = False, shared: bool = False) -> LocalStore:
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
            for sub in ("objects", "refs", "tmp"):
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
        path = self._object_path(key)
        if not path.exists():
            self._atomic_write(path, [stored], once=True)

    def has(self, key: str) -> bool:
        return self._object_path(check_key(key)).is_file()

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
    def put_file(self, path: Path) -> BlobRef:
        """Hash and compress a file in one streaming pass; keep it raw when zstd does not help."""
        self._refuse_if_readonly()
        import zstandard

        src = Path(path)
        digest = hashlib.sha256()
        size = 0
        # The key is known only once the file is read: staged in tmp/, named at the end.
        with staged_file(self.root / "tmp", prefix="put-") as staged, src.open("rb") as fh:
            out = staged.file
            out.write(ZSTD)
            writer = zstandard.ZstdCompressor(level=3).stream_writer(out, closefd=False)
            while chunk := fh.read(CHUNK):
                digest.update(chunk)
                size += len(chunk)
                writer.write(chunk)
            writer.close()  # type: ignore[no-untyped-call]
            packed_size = out.tell()
            key = digest.hexdigest()
            final = self._object_path(key)
            if not final.exists():
                if packed_size >= size + 1:
                    self._write_raw_copy(src, final, key)
                else:
                    try:
                        self._make_parents(final)
                        staged.commit(final, mode=self.file_mode, overwrite=False)
                    except OSError as exc:
                        raise self._not_writable(final, exc) from exc
        return BlobRef(sha256=key, size=size)

    def _write_raw_copy(self, src: Path, final: Path, key: str) -> None:
        digest = hashlib.sha256()

        def chunks() -> Iterator[bytes]:
            yield RAW
            with src.open("rb") as fh:
                while chunk := fh.read(CHUNK):
                    digest.update(chunk)
                    yield chunk
            if digest.hexdigest() != key:  # raised before the rename: nothing lands under `key`
                raise StoreError(f"{src} changed while it was being stored; capture it again")

        self._atomic_write(final, chunks(), once=True)
