"""The `Store` base: a content-addressed blob store plus a few small named refs.

Blobs are keyed by the SHA-256 of their raw bytes and verified on every read. A backend keeps an
encoded form (a one-byte tag, then the raw or zstd-compressed bytes) so compression never changes a
key. Refs are small mutable documents (the bundle index) that backends list by prefix.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Self

from flaketriage.atomic import write_atomic
from flaketriage.errors import CorruptObjectError, StoreError
from flaketriage.manifest import BlobRef

RAW = b"\x00"
ZSTD = b"\x01"
CHUNK = 1 << 20
_MIN_COMPRESS = 512  # below this the frame overhead eats any saving


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode(data: bytes) -> bytes:
    """The stored form of `data`: zstd where that saves space, raw otherwise."""
    if len(data) >= _MIN_COMPRESS:
        import zstandard

        packed = zstandard.ZstdCompressor(level=3).compress(data)
        if len(packed) < len(data):
            return ZSTD + packed
    return RAW + data


def decode(stored: bytes, key: str, where: str) -> bytes:
    tag, body = stored[:1], stored[1:]
    if tag == RAW:
        return body
    if tag == ZSTD:
        import zstandard

        try:
            # Streamed frames carry no content size, so decompress incrementally.
            return zstandard.ZstdDecompressor().decompressobj().decompress(body)
        except zstandard.ZstdError as exc:
            raise CorruptObjectError(key, "<undecodable zstd frame>", where) from exc
    raise CorruptObjectError(key, f"<unknown encoding tag {tag!r}>", where)


def check_key(key: str) -> str:
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise StoreError(f"{key!r} is not a blob key: expected 64 lowercase hex characters (a SHA-256)")
    return key


class Store(ABC):
    """A content-addressed store. Subclasses provide raw object and ref I/O, and open their URLs.

    Get one with `flaketriage.store.open_store`, which picks the backend by the URL's scheme.
    """

    readonly: bool = False

    @classmethod
    @abstractmethod
    def from_url(cls, url: str, *, readonly: bool = False) -> Self:
        """The store at `url`, a canonical URL of this backend's scheme (see `store_url`)."""

    @property
    @abstractmethod
    def url(self) -> str:
        """The canonical URL of the store (``file:///...``, ``memory://name``): `open_store` on it
        opens this store again."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the store lives, for messages (a path or URL)."""

    # -- backend primitives -------------------------------------------------------------------
    @abstractmethod
    def _read_object(self, key: str) -> bytes:
        """The stored (encoded) form; raises ObjectNotFoundError."""

    @abstractmethod
    def _write_object(self, key: str, stored: bytes) -> None:
        """Store the encoded form atomically; a no-op when the key exists."""

    @abstractmethod
    def has(self, key: str) -> bool:
        """Whether a blob with this key is present (not verified)."""

    @abstractmethod
    def keys(self) -> Iterator[str]:
        """Every blob key in the store."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Drop a blob (used by `check` for corrupt entries and by garbage collection)."""

    @abstractmethod
    def put_ref(self, name: str, data: bytes) -> None:
        """Write a named ref atomically (``bundles/<id>``)."""

    @abstractmethod
    def get_ref(self, name: str) -> bytes | None:
        """A ref's bytes, or None when absent."""

    @abstractmethod
    def list_refs(self, prefix: str) -> list[str]:
        """Names of the refs under `prefix` (``bundles/``)."""

    # -- blobs --------------------------------------------------------------------------------
    def _refuse_if_readonly(self) -> None:
        if self.readonly:
            raise StoreError(f"the store at {self.location} is read-only; open it writable to add objects")

    def put_bytes(self, data: bytes) -> BlobRef:
        self._refuse_if_readonly()
        key = sha256_bytes(data)
        if not self.has(key):
            self._write_object(key, encode(data))
        return BlobRef(sha256=key, size=len(data))

    def put_file(self, path: Path) -> BlobRef:
        """Store a file's bytes. Backends may stream; the default reads it whole."""
        return self.put_bytes(Path(path).read_bytes())

    def get_bytes(self, key: str) -> bytes:
        """A blob's raw bytes, after checking they hash to `key`."""
        check_key(key)
        data = decode(self._read_object(key), key, self.location)
        actual = sha256_bytes(data)
        if actual != key:
            raise CorruptObjectError(key, actual, self.location)
        return data

    def get_file(self, key: str, dest: Path) -> None:
        """Write a verified blob to `dest` atomically (a temp file renamed into place)."""
        write_atomic(Path(dest), self.get_bytes(key))

    def verify(self, key: str) -> None:
        """Raise ObjectNotFoundError or CorruptObjectError unless the blob is intact."""
        self.get_bytes(key)

    def check(self, drop: bool = False) -> list[str]:
        """Re-hash every blob; return the corrupt keys (and delete them when `drop`)."""
        bad: list[str] = []
        for key in list(self.keys()):
            try:
                self.verify(key)
            except CorruptObjectError:
                bad.append(key)
                if drop:
                    self.delete(key)
        return bad

    def copy_to(self, other: Store, key: str) -> None:
        """Copy one verified blob into another store."""
        if not other.has(key):
            other.put_bytes(self.get_bytes(key))
