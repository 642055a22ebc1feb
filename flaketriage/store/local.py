"""`LocalStore`: a store in a directory, objects at ``objects/ab/cdef...``, refs under ``refs/``.

Every write goes through `flaketriage.atomic`: a unique temp file renamed into place, so concurrent
writers of the same object race harmlessly and a crash never leaves a half-written object under its
final name. An object is written once; a later writer of the same key keeps the one there.
"""

from __future__ import annotations

import errno
import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from flaketriage.atomic import staged_file, write_atomic
from flaketriage.errors import (
    ConfigError,
    CorruptObjectError,
    ObjectNotFoundError,
    StoreError,
    StoreNotWritableError,
)
from flaketriage.manifest import BlobRef
from flaketriage.store.base import CHUNK, RAW, ZSTD, Store, check_key, decode
from flaketriage.store.registry import local_path


class LocalStore(Store):
    """A content-addressed store under one directory."""

    def __init__(self, root: Path | str, readonly: bool = False) -> None:
        self.root = Path(root).absolute()
        self.readonly = readonly
        if readonly:
            if not self.root.is_dir():
                raise StoreError(f"no store at {self.root}: the directory does not exist")
        else:
            self._prepare()

    @classmethod
    def from_url(cls, url: str, *, readonly: bool = False) -> LocalStore:
        path = local_path(url)
        if path is None:
            raise ConfigError(f"{url} is not a local store: LocalStore opens directories and file:// URLs")
        return cls(path, readonly=readonly)

    @property
    def url(self) -> str:
        return self.root.as_uri()

    @property
    def location(self) -> str:
        return str(self.root)

    def _prepare(self) -> None:
        try:
            for sub in ("objects", "refs", "tmp"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.root / "tmp"):
                pass  # creating a file is the only reliable writability test (root ignores modes)
        except OSError as exc:
            raise StoreNotWritableError(
                f"cannot write to the store at {self.root} ({exc.strerror or exc}); pass --store with a "
                "writable directory or set FLAKETRIAGE_STORE"
            ) from exc

    def _object_path(self, key: str) -> Path:
        return self.root / "objects" / key[:2] / key[2:]

    def _atomic_write(
        self, final: Path, chunks: Iterator[bytes] | list[bytes], *, once: bool = False
    ) -> None:
        """`write_atomic`; with `once`, an object already at `final` is kept (content-addressed)."""
        try:
            write_atomic(final, chunks, overwrite=not once)
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
        try:
            return self._object_path(key).read_bytes()
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(key, self.location) from exc

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

    def get_ref(self, name: str) -> bytes | None:
        try:
            return self._ref_path(name).read_bytes()
        except FileNotFoundError:
            return None

    def list_refs(self, prefix: str) -> list[str]:
        base = self._ref_path(prefix) if prefix else self.root / "refs"
        if not base.is_dir():
            return []
        return [f"{prefix}{p.name}" for p in base.iterdir() if p.is_file() and not p.name.startswith(".")]

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
                        staged.commit(final, overwrite=False)
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

    def get_file(self, key: str, dest: Path) -> None:
        """Stream a blob to `dest`, verifying its hash before it is renamed into place."""
        import zstandard

        check_key(key)
        path = self._object_path(key)
        dest = Path(dest)
        digest = hashlib.sha256()
        with staged_file(dest.parent, prefix=f".{dest.name}.") as staged:
            out = staged.file
            try:
                fh = path.open("rb")
            except FileNotFoundError as exc:
                raise ObjectNotFoundError(key, self.location) from exc
            with fh:
                tag = fh.read(1)
                if tag == ZSTD:
                    try:
                        reader = zstandard.ZstdDecompressor().stream_reader(fh)
                        while chunk := reader.read(CHUNK):
                            digest.update(chunk)
                            out.write(chunk)
                    except zstandard.ZstdError as exc:
                        raise CorruptObjectError(key, "<undecodable zstd frame>", self.location) from exc
                elif tag == RAW:
                    while chunk := fh.read(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                else:
                    decode(tag, key, self.location)
            if digest.hexdigest() != key:
                raise CorruptObjectError(key, digest.hexdigest(), self.location)
            staged.commit(dest)
