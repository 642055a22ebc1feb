"""The `Store` base: a content-addressed blob store plus a few small named refs.

Blobs are keyed by the SHA-256 of their raw bytes and verified on every read. A backend keeps an
encoded form (a one-byte tag, then the raw or zstd-compressed bytes) so compression never changes a
key. Refs are small mutable documents (the bundle index) that backends list by prefix.

Every read streams and is bounded: the caller passes the size the manifest records (``max_size``)
and a blob that inflates past it is refused before more than that reaches the destination, so a
small object that decompresses to gigabytes costs neither memory nor disk. Reads into memory are
also capped at `MAX_IN_MEMORY_BYTES`, manifests at `MAX_MANIFEST_BYTES`.
"""

from __future__ import annotations

import hashlib
import io
import re
import shutil
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO, Protocol, Self, cast

from flaketriage.bundle.manifest import BlobRef
from flaketriage.errors import CorruptObjectError, ObjectTooLargeError, StoreError
from flaketriage.files.atomic import write_atomic
from flaketriage.store.compression import SAMPLE, compressor, packed_sample
from flaketriage.store.state import NO_STATE, FileStamp, FileState, KnownFile

RAW = b"\x00"
ZSTD = b"\x01"
CHUNK = 1 << 20
MAX_MANIFEST_BYTES = 64 << 20
"""The most a manifest may hold: real ones are kilobytes (file lists, a package freeze)."""
MAX_IN_MEMORY_BYTES = 512 << 20
"""The most `Store.get_bytes` reads into memory, whatever size a manifest records; larger blobs
(checkpoints, datasets) are streamed to files with `Store.get_file`."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode(data: bytes) -> bytes:
    """The stored form of `data`: zstd where that pays (`flaketriage.store.compression`), raw
    otherwise."""
    packed = packed_sample(data)
    if packed is None:
        return RAW + data
    if len(data) > SAMPLE:
        packed = compressor().compress(data)
    return ZSTD + packed if len(packed) < len(data) else RAW + data


def decode(stored: bytes, key: str, where: str) -> bytes:
    """The raw bytes of a stored form (not verified, not bounded: for forms already in memory)."""
    return b"".join(decoded_chunks(io.BytesIO(stored), key, where))


def decoded_chunks(stream: BinaryIO, key: str, where: str) -> Iterator[bytes]:
    """The raw bytes of the stored form read from `stream`, a chunk (at most `CHUNK`) at a time.

    Decompression is incremental, so a consumer that stops early (a size bound) stops the work.
    """
    tag = stream.read(1)
    if tag == RAW:
        while chunk := stream.read(CHUNK):
            yield chunk
        return
    if tag == ZSTD:
        import zstandard

        try:
            # Streamed frames carry no content size: read a bounded chunk at a time.
            reader = zstandard.ZstdDecompressor().stream_reader(stream, closefd=False)
            while chunk := reader.read(CHUNK):
                yield chunk
        except zstandard.ZstdError as exc:
            raise CorruptObjectError(
                key, "", where, detail=f"its zstd data cannot be decompressed ({exc})"
            ) from exc
        return
    if not tag:
        raise CorruptObjectError(
            key,
            "",
            where,
            detail="it is empty (0 bytes, where every stored object starts with a 1-byte encoding tag), "
            "so a write was cut short or the file was truncated",
        )
    raise CorruptObjectError(
        key,
        "",
        where,
        detail=f"it starts with the unknown encoding tag {tag!r} (expected {RAW!r} or {ZSTD!r})",
    )


def _free_bytes(dest: Path) -> tuple[int, Path] | None:
    """Free space on the file system `dest` would land on (its nearest existing ancestor), or None
    when it cannot be told."""
    for place in [dest.parent, *dest.parent.parents]:
        try:
            return shutil.disk_usage(place).free, place
        except OSError:
            continue
    return None


_KEY = re.compile(r"[0-9a-f]{64}")


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise StoreError(f"{key!r} is not a blob key: expected 64 lowercase hex characters (a SHA-256)")
    return key


class StoreSettings(Protocol):
    """What a backend reads from its opener's settings besides the URL (`flaketriage.settings.Settings`
    has it all): the opener passes them, no backend reads the environment itself."""

    @property
    def s3_endpoint_url(self) -> str | None: ...

    @property
    def s3_presign_expiry_s(self) -> int: ...


class Store(ABC):
    """A content-addressed store. Subclasses provide raw object and ref I/O, and open their URLs.

    Get one with `flaketriage.store.open_store`, which picks the backend by the URL's scheme.
    """

    readonly: bool = False
    state: FileState = NO_STATE
    """The stat cache (`flaketriage.store.state`): files this store took, known by their stat so
    that `put_file` need not read them again. Backends with a place to keep one set their own."""

    @classmethod
    @abstractmethod
    def from_url(
        cls, url: str, *, readonly: bool = False, shared: bool = False, settings: StoreSettings | None = None
    ) -> Self:
        """The store at `url`, a canonical URL of this backend's scheme (see `store_url`).

        `shared`: what it writes is readable by the group too (backends with file permissions);
        by default only by the owner. `settings`: the opener's, for what the backend reads there
        (S3: the endpoint, the expiry of links); None: the backend's defaults.
        """

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

    def _open_object(self, key: str) -> BinaryIO:
        """The stored form as a stream; backends that can stream override this."""
        return io.BytesIO(self._read_object(key))

    @abstractmethod
    def _write_object(self, key: str, stored: bytes) -> None:
        """Store the encoded form atomically; a no-op when the key exists."""

    def _write_stream(self, key: str, stored: Iterator[bytes]) -> None:
        """Store the encoded form, streamed, atomically: an exception raised by `stored` leaves
        nothing under `key`. Backends that can stream override this; the default joins the chunks."""
        self._write_object(key, b"".join(stored))

    def missing(self, keys: Iterable[str]) -> list[str]:
        """The keys of `keys` that are not present, in order, asked by a writer that will name the
        others (`reuse`): one batch, which backends where each check is a round trip override to
        check in parallel."""
        return [key for key in keys if not self.reuse(key)]

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
    def delete_ref(self, name: str) -> None:
        """Remove the ref `name` (nothing when it is not there)."""

    @abstractmethod
    def age(self, key: str) -> timedelta | None:
        """How long ago the object `key` was written (None when the backend cannot tell, or it is gone).
        Garbage collection never deletes an object younger than its grace period."""

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
        if not self.reuse(key):
            self._write_object(key, encode(data))
        return BlobRef(sha256=key, size=len(data))

    def put_file(self, path: Path) -> BlobRef:
        """Store a file's bytes, each read once and hashed as it is read (`_put_stream`).

        A file the stat cache knows (unchanged since this store took it: same path, device, inode,
        size, mtime and ctime) whose object is still here is not read at all.
        """
        self._refuse_if_readonly()
        with open(path, "rb") as fh:
            stamp = FileStamp.of(path, fh.fileno())
            known = self.cached_file(stamp)
            if known is not None:
                return known.ref
            stored = self._put_stream(fh, stamp.size)
            if FileStamp.of(path, fh.fileno()) == stamp:  # else it changed while it was read
                self.remember_file(stamp, stored)
        return stored.ref

    def _put_stream(self, stream: BinaryIO, size: int) -> KnownFile:
        """Store what `stream` holds (about `size` bytes), read once. The default reads it into
        memory; backends that can stream override this."""
        data = stream.read()
        return KnownFile(self.put_bytes(data), binary=b"\0" in data)

    def cached_file(self, stamp: FileStamp) -> KnownFile | None:
        """What this store holds of the file `stamp` describes, when the stat cache knows that file
        unchanged and its object is still here; else None (read the file)."""
        known = self.state.get(stamp)
        return known if known is not None and self.reuse(known.ref.sha256) else None

    def reuse(self, key: str) -> bool:
        """Whether the object `key` is present, asked by a writer about to name it in a new bundle.
        A backend whose garbage collection dates objects by their write time refreshes an old one
        (git's "freshen"), so a collection running meanwhile sees it as young: its grace period
        then covers the object until the new manifest references it. Default: `has`."""
        return self.has(key)

    def remember_file(self, stamp: FileStamp, stored: KnownFile) -> None:
        """Record in the stat cache that the file `stamp` describes (read after the stamp was taken,
        unchanged meanwhile) is stored as `stored`; a file changed too recently is not recorded."""
        self.state.put(stamp, stored)

    def flush(self) -> None:
        """Make every object written so far durable, before a manifest names them (`write_bundle`
        calls it). Backends that write without syncing each object override this."""
        self.state.flush()

    def chunks(self, key: str, *, max_size: int | None = None, why: str | None = None) -> Iterator[bytes]:
        """A blob's raw bytes, streamed; the hash is checked once the last chunk is out.

        More than `max_size` bytes raise `ObjectTooLargeError` before the chunk that passes it is
        handed out; `why` says what the bound is (default: the size the manifest records). A
        consumer must treat the bytes as unverified until the iterator is exhausted.
        """
        check_key(key)
        digest = hashlib.sha256()
        size = 0
        with self._open_object(key) as stream:
            for chunk in decoded_chunks(stream, key, self.location):
                size += len(chunk)
                if max_size is not None and size > max_size:
                    raise self._inflates_past(key, max_size, why)
                digest.update(chunk)
                yield chunk
        if digest.hexdigest() != key:
            raise CorruptObjectError(key, digest.hexdigest(), self.location)

    def _inflates_past(self, key: str, max_size: int, why: str | None) -> ObjectTooLargeError:
        return ObjectTooLargeError(
            key,
            self.location,
            max_size,
            f"it inflates past {why or f'the {max_size} bytes its manifest records'}",
            "The bundle that names it is damaged or was built to exhaust the reader: "
            "re-capture the failure, or restore the store from a copy",
        )

    def get_bytes(self, key: str, *, max_size: int | None = None, why: str | None = None) -> bytes:
        """A blob's raw bytes, after checking they hash to `key`: at most `max_size` of them (the
        size the manifest records) and never more than `MAX_IN_MEMORY_BYTES`."""
        if max_size is None or max_size > MAX_IN_MEMORY_BYTES:
            if max_size is not None:
                raise ObjectTooLargeError(
                    check_key(key),
                    self.location,
                    MAX_IN_MEMORY_BYTES,
                    f"its manifest records {max_size} bytes, more than the {MAX_IN_MEMORY_BYTES} "
                    "flaketriage reads into memory",
                    "Only files (data, checkpoints) may be that large; the bundle is damaged or hostile",
                )
            max_size, why = MAX_IN_MEMORY_BYTES, f"{MAX_IN_MEMORY_BYTES} bytes, the most read into memory"
        return b"".join(self.chunks(key, max_size=max_size, why=why))

    def get_file(self, key: str, dest: Path, *, max_size: int | None = None) -> None:
        """Write a verified blob to `dest` atomically (a temp file beside it, renamed into place).

        With `max_size` (the size the manifest records) the blob is refused when that is more than
        the free space at `dest`, or as soon as it inflates past it; the temp file is removed and
        nothing appears at `dest`.
        """
        dest = Path(dest)
        free = _free_bytes(dest) if max_size is not None else None
        if max_size is not None and free is not None and max_size > free[0]:
            raise ObjectTooLargeError(
                check_key(key),
                self.location,
                max_size,
                f"its manifest records {max_size} bytes, more than the {free[0]} bytes free at {free[1]}",
                "Free space there or write somewhere else; if the size is absurd, the bundle is damaged",
            )
        write_atomic(dest, self.chunks(key, max_size=max_size))

    def verify(self, key: str, *, max_size: int | None = None) -> int:
        """The blob's size; raise ObjectNotFoundError, CorruptObjectError or (past `max_size`)
        ObjectTooLargeError unless it is intact. Streams: memory stays bounded whatever the size."""
        return sum(len(chunk) for chunk in self.chunks(key, max_size=max_size))

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

    def stored_chunks(self, key: str, *, max_size: int | None = None) -> Iterator[bytes]:
        """A blob's stored (encoded) form, streamed as it is stored, for a byte-for-byte copy.

        Verified on the way: the stored form is decoded beside the copy and the raw bytes are hashed
        (and bounded by `max_size`, like `chunks`), and a mismatch raises once the last chunk is
        out, so a writer that commits only after the stream ends (`put_stored`) never commits it.
        """
        check_key(key)
        digest = hashlib.sha256()
        size = 0
        with self._open_object(key) as stream:
            tee = _Tee(stream)
            for chunk in decoded_chunks(cast(BinaryIO, tee), key, self.location):
                size += len(chunk)
                if max_size is not None and size > max_size:
                    raise self._inflates_past(key, max_size, None)
                digest.update(chunk)
                if passed := tee.take():
                    yield passed
            while tee.read(CHUNK):  # what follows a zstd frame is copied as stored, too
                yield tee.take()
            if rest := tee.take():
                yield rest
        if digest.hexdigest() != key:
            raise CorruptObjectError(key, digest.hexdigest(), self.location)

    def put_stored(self, key: str, stored: Iterable[bytes]) -> int:
        """Write a blob's stored form (another store's `stored_chunks`) under `key`, streamed, and
        return the bytes written. The caller has checked the key is missing; an exception raised
        by `stored` leaves nothing under `key`."""
        self._refuse_if_readonly()
        counter = _Counter(stored)
        self._write_stream(check_key(key), iter(counter))
        return counter.size

    def copy_to(self, other: Store, key: str, *, max_size: int | None = None) -> int:
        """Copy one blob into another store as it is stored (byte for byte), verified on the way;
        the bytes sent (0 when `other` has it already)."""
        if other.reuse(check_key(key)):
            return 0
        return other.put_stored(key, self.stored_chunks(key, max_size=max_size))


class _Tee:
    """A stream that keeps what is read from it: the stored form passes on while it is decoded."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._seen: list[bytes] = []

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self._seen.append(data)
        return data

    def take(self) -> bytes:
        data = b"".join(self._seen)
        self._seen.clear()
        return data


class _Counter:
    """The chunks of an iterable, counting their bytes as they pass."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks
        self.size = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            self.size += len(chunk)
            yield chunk
