"""`S3Store`: a store in an S3 bucket, or on any S3-compatible server, at ``s3://bucket/prefix``.

The object keys are the local store's, below the prefix: blobs at ``objects/ab/cdef...`` in the same
stored form (a one-byte tag, then the raw or zstd bytes) and refs under ``refs/``, so a bundle copies
either way byte for byte. Reads stream. A write of up to `PART_SIZE` bytes is one PUT; a larger one
is a multipart upload (a few parts in flight, bounded memory), every part sent with its SHA-256
checksum and the upload aborted on any error, so an object exists only once it is complete.
botocore's errors become `StoreError` subclasses that say what failed and what to check.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, BinaryIO, TypeAlias, cast

from flaketriage.bundle.manifest import BlobRef
from flaketriage.dependencies import require
from flaketriage.errors import (
    ConfigError,
    ObjectNotFoundError,
    StoreCredentialsError,
    StoreError,
    StoreNotFoundError,
    StorePermissionError,
    StoreUnreachableError,
)
from flaketriage.store.base import CHUNK, RAW, ZSTD, Store, StoreSettings, check_key
from flaketriage.store.compression import LEVEL, pays
from flaketriage.store.state import KnownFile

S3Client: TypeAlias = Any
"""boto3's S3 client (typed stubs are not a dependency)."""

SCHEME = "s3://"
PART_SIZE = 8 << 20
"""Bytes in a multipart upload's part (S3 wants at least 5 MiB but for the last), and the largest
object written in one PUT."""
MAX_PARTS = 10_000
"""S3's limit on parts in one upload: a file of known size gets larger parts to fit."""
PARTS_IN_FLIGHT = 8
"""Parts being sent at once in this process, all uploads together: at most this many times
`PART_SIZE` bytes are held for them."""
MAX_REF_BYTES = 4 << 20
"""The most a ref is read into memory (bundle index entries are a few hundred bytes)."""
MAX_PRESIGN_EXPIRY_S = 7 * 24 * 3600
"""S3's longest validity for a presigned (SigV4) link."""
CHECK_THREADS = 16
"""Existence checks (HEAD requests) sent at once by `S3Store.missing`."""

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_OBJECT_NAME = re.compile(r"^[0-9a-f]{2}/[0-9a-f]{62}$")
_MAX_PREFIX_BYTES = 900  # S3 keys hold 1024 bytes; objects/ab/<62 hex> and ref names need the rest
_CREDENTIAL_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "InvalidClientTokenId",
}
_MISSING_CODES = {"404", "NoSuchKey", "NotFound"}

_senders_lock = threading.Lock()
_senders: tuple[int, ThreadPoolExecutor, threading.BoundedSemaphore] | None = None


def _part_senders() -> tuple[ThreadPoolExecutor, threading.BoundedSemaphore]:
    """The process's part senders and the slots that bound the parts held for them, started at the
    first multipart upload (again in a forked child: a pool's threads do not survive a fork)."""
    global _senders
    with _senders_lock:
        if _senders is None or _senders[0] != os.getpid():
            pool = ThreadPoolExecutor(max_workers=PARTS_IN_FLIGHT, thread_name_prefix="flaketriage-s3")
            _senders = (os.getpid(), pool, threading.BoundedSemaphore(PARTS_IN_FLIGHT))
        return _senders[1], _senders[2]


def parse_url(url: str) -> tuple[str, str]:
    """The bucket and prefix (``a/b``, or empty) of ``s3://bucket/prefix``; a `ConfigError` for a URL
    that names no bucket, or whose prefix has empty, ``.`` or ``..`` parts or control characters."""
    if not url.lower().startswith(SCHEME):
        raise ConfigError(f"{url!r} is not an S3 store URL: write s3://BUCKET/PREFIX")
    bucket, _, prefix = url[len(SCHEME) :].rstrip("/").partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise ConfigError(
            f"the store {url!r:.120} does not name an S3 bucket ({bucket!r:.70}): write s3://BUCKET/PREFIX, "
            "BUCKET being 3 to 63 lowercase letters, digits, dots and hyphens"
        )
    parts = prefix.split("/") if prefix else []
    bad = [p for p in parts if p in ("", ".", "..") or any(ord(c) < 32 or c in "\x7f?#\\" for c in p)]
    if bad:
        raise ConfigError(
            f"the store {url!r:.120} has a prefix part {bad[0]!r:.40} that S3 tools read differently "
            "(empty, '.', '..', a control character, '?', '#' or '\\'); write s3://BUCKET/PREFIX with "
            "plain path parts"
        )
    if len(prefix.encode()) > _MAX_PREFIX_BYTES:
        raise ConfigError(
            f"the prefix of the store {url:.80}… is {len(prefix.encode())} bytes; S3 keys hold 1024, so "
            f"keep it under {_MAX_PREFIX_BYTES}"
        )
    return bucket, prefix


class S3Store(Store):
    """A content-addressed store below a prefix of an S3 bucket; thread-safe.

    ``endpoint_url`` points at an S3-compatible server (MinIO, Ceph, R2; default AWS S3), and the
    credentials and region come from boto3's usual chain. Opening checks the bucket answers.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        readonly: bool = False,
        endpoint_url: str | None = None,
        presign_expiry_s: int = 3600,
        client: S3Client | None = None,
        max_attempts: int = 3,
    ) -> None:
        self.bucket, self.prefix = parse_url(f"{SCHEME}{bucket}/{prefix}".rstrip("/"))
        self.readonly = readonly
        self.endpoint_url = endpoint_url or None
        self.presign_expiry_s = presign_expiry_s
        self._root = f"{self.prefix}/" if self.prefix else ""
        self.page_size = 1000
        """Keys per listing request (S3's most)."""
        self._client: S3Client = client if client is not None else self._new_client(max_attempts)
        self._call("open the bucket", lambda: self._client.head_bucket(Bucket=self.bucket), bucket=True)

    def _new_client(self, max_attempts: int) -> S3Client:
        boto3 = require("boto3", "s3", "the s3:// store")
        from botocore.config import Config

        config = Config(
            signature_version="s3v4",
            retries={"max_attempts": max_attempts, "mode": "standard"},
            max_pool_connections=CHECK_THREADS + PARTS_IN_FLIGHT + 8,
            connect_timeout=10,
            read_timeout=120,
            # S3-compatible servers (MinIO, Ceph) name buckets in the path, not the host name.
            s3={"addressing_style": "path"} if self.endpoint_url else {},
        )
        # A session of its own: boto3's default session is not safe to share between threads.
        session = boto3.session.Session()
        try:
            return cast(S3Client, session.client("s3", endpoint_url=self.endpoint_url, config=config))
        except ValueError as exc:  # a malformed endpoint URL
            raise ConfigError(
                f"FLAKETRIAGE_S3_ENDPOINT_URL={self.endpoint_url!r} is not an endpoint URL ({exc}); "
                "write http(s)://host:port"
            ) from exc

    @classmethod
    def from_url(
        cls, url: str, *, readonly: bool = False, shared: bool = False, settings: StoreSettings | None = None
    ) -> S3Store:
        """The store at `url`, at the endpoint of `settings` (``FLAKETRIAGE_S3_ENDPOINT_URL``; None:
        AWS S3), its links valid for their ``FLAKETRIAGE_S3_PRESIGN_EXPIRY_S``."""
        bucket, prefix = parse_url(url)
        if settings is None:
            return cls(bucket, prefix, readonly=readonly)
        return cls(
            bucket,
            prefix,
            readonly=readonly,
            endpoint_url=settings.s3_endpoint_url,
            presign_expiry_s=settings.s3_presign_expiry_s,
        )

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}".rstrip("/")

    @property
    def location(self) -> str:
        return self.url if self.endpoint_url is None else f"{self.url} (at {self.endpoint_url})"

    # -- errors -------------------------------------------------------------------------------
    def _call(self, doing: str, request: Callable[[], Any], *, bucket: bool = False) -> Any:
        """`request()`, its botocore errors translated (`bucket`: a 404 means the bucket is missing)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return request()
        except (BotoCoreError, ClientError) as exc:
            raise self._failure(exc, doing, bucket=bucket) from exc

    def _failure(self, exc: Exception, doing: str, *, bucket: bool = False) -> StoreError:
        from botocore import exceptions as bex

        where = f"cannot {doing} in {self.location}"
        endpoint = self.endpoint_url or "AWS S3"
        if isinstance(
            exc, bex.NoCredentialsError | bex.PartialCredentialsError | bex.CredentialRetrievalError
        ):
            return StoreCredentialsError(
                f"{where}: no AWS credentials were found ({exc}); set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run where an instance or workload role applies"
            )
        if isinstance(exc, bex.EndpointConnectionError | bex.ConnectTimeoutError | bex.ProxyConnectionError):
            return StoreUnreachableError(
                f"{where}: {endpoint} cannot be reached ({exc}); check FLAKETRIAGE_S3_ENDPOINT_URL, the "
                "network and proxy settings, and that the server is running"
            )
        if not isinstance(exc, bex.ClientError):
            return StoreError(f"{where}: {exc}; check the connection to {endpoint} and try again")
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        said = f"{code or status}: {error.get('Message') or 'no message'}"
        if code in _CREDENTIAL_CODES:
            return StoreCredentialsError(
                f"{where}: {endpoint} rejects the credentials ({said}); check that AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) are this server's, and the clock is right"
            )
        if code == "NoSuchBucket" or (bucket and status == 404):
            return StoreNotFoundError(
                f"{where}: the bucket {self.bucket!r} does not exist at {endpoint}; create it, or fix the "
                "bucket in the store URL (and FLAKETRIAGE_S3_ENDPOINT_URL when it is not AWS)"
            )
        if code in ("AccessDenied", "AllAccessDisabled", "Forbidden") or status == 403:
            return StorePermissionError(
                f"{where}: access denied ({said}); the credentials in use may not {doing}: check the "
                f"IAM and bucket policies for arn:aws:s3:::{self.bucket}/{self._root}*"
            )
        return StoreError(f"{where}: {endpoint} answered {status} ({said}); try again, or check the server")

    @staticmethod
    def _is_missing(exc: Exception) -> bool:
        """Whether `exc` says the object (not the bucket) is not there."""
        from botocore.exceptions import ClientError

        if not isinstance(exc, ClientError):
            return False
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return code != "NoSuchBucket" and (code in _MISSING_CODES or status == 404)

    # -- names --------------------------------------------------------------------------------
    def _object_key(self, key: str) -> str:
        return f"{self._root}objects/{key[:2]}/{key[2:]}"

    def _ref_key(self, name: str) -> str:
        parts = [p for p in name.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise StoreError(f"ref name {name!r} may not contain '.' or '..' parts")
        return self._root + "refs/" + "/".join(parts)

    # -- primitives ---------------------------------------------------------------------------
    def _head(self, name: str, doing: str) -> dict[str, Any] | None:
        """The object's metadata, or None when it is not there."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return cast(dict[str, Any], self._client.head_object(Bucket=self.bucket, Key=name))
        except (BotoCoreError, ClientError) as exc:
            if self._is_missing(exc):
                # Also what a bucket deleted since the store was opened answers; writes say that.
                return None
            raise self._failure(exc, doing) from exc

    def has(self, key: str) -> bool:
        return self._head(self._object_key(check_key(key)), "check an object") is not None

    def missing(self, keys: Iterable[str]) -> list[str]:
        wanted = [check_key(k) for k in keys]
        if len(wanted) <= 1:
            return [k for k in wanted if not self.has(k)]
        with ThreadPoolExecutor(max_workers=min(CHECK_THREADS, len(wanted))) as pool:
            present = list(pool.map(self.has, wanted))
        return [k for k, there in zip(wanted, present, strict=True) if not there]

    def _open_object(self, key: str) -> BinaryIO:
        name = self._object_key(check_key(key))
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self._client.get_object(Bucket=self.bucket, Key=name)
        except (BotoCoreError, ClientError) as exc:
            if self._is_missing(exc):
                raise ObjectNotFoundError(key, self.location) from exc
            raise self._failure(exc, f"read object {key}") from exc
        return cast(BinaryIO, _Body(response["Body"], self, f"read object {key}"))

    def _read_object(self, key: str) -> bytes:
        with self._open_object(key) as body:
            return body.read()

    def _write_object(self, key: str, stored: bytes) -> None:
        self._put(self._object_key(key), stored, f"write object {key}")

    def _write_stream(self, key: str, stored: Iterator[bytes]) -> None:
        self._upload(self._object_key(key), stored, f"write object {key}")

    def keys(self) -> Iterator[str]:
        start = f"{self._root}objects/"
        for name in self._list(start, "list the objects"):
            rest = name[len(start) :]
            if _OBJECT_NAME.match(rest):  # anything else in the bucket is not an object of the store
                yield rest[:2] + rest[3:]

    def _list(self, prefix: str, doing: str, *, delimiter: str | None = None) -> Iterator[str]:
        """The key of every object under `prefix`, a page (`page_size`) per request."""
        paginator = self._client.get_paginator("list_objects_v2")
        options: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            options["Delimiter"] = delimiter
        pages = iter(paginator.paginate(**options, PaginationConfig={"PageSize": self.page_size}))
        while True:
            page = self._call(doing, lambda: next(pages, None))
            if page is None:
                return
            for item in page.get("Contents", ()):
                yield item["Key"]

    def delete(self, key: str) -> None:
        self._refuse_if_readonly()
        name = self._object_key(check_key(key))
        self._call(f"delete object {key}", lambda: self._client.delete_object(Bucket=self.bucket, Key=name))

    def age(self, key: str) -> timedelta | None:
        head = self._head(self._object_key(check_key(key)), f"check the age of object {key}")
        written = head.get("LastModified") if head else None
        if not isinstance(written, datetime):
            return None
        return max(timedelta(0), datetime.now(UTC) - written)

    def put_ref(self, name: str, data: bytes) -> None:
        self._refuse_if_readonly()
        self._put(self._ref_key(name), data, f"write the ref {name}")

    def get_ref(self, name: str) -> bytes | None:
        ref = self._ref_key(name)
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self._client.get_object(Bucket=self.bucket, Key=ref)
        except (BotoCoreError, ClientError) as exc:
            if self._is_missing(exc):
                return None
            raise self._failure(exc, f"read the ref {name}") from exc
        with _Body(response["Body"], self, f"read the ref {name}") as body:
            data = body.read(MAX_REF_BYTES + 1)
        if len(data) > MAX_REF_BYTES:
            raise StoreError(
                f"the ref {name!r:.80} in {self.location} holds more than {MAX_REF_BYTES} bytes, where "
                "flaketriage writes a few hundred; it was not read: delete it from the bucket"
            )
        return data

    def delete_ref(self, name: str) -> None:
        self._refuse_if_readonly()
        ref = self._ref_key(name)
        self._call(f"delete the ref {name}", lambda: self._client.delete_object(Bucket=self.bucket, Key=ref))

    def list_refs(self, prefix: str) -> list[str]:
        base = self._ref_key(prefix) + ("/" if prefix.endswith("/") else "")
        start = self._root + "refs/"
        return [name[len(start) :] for name in self._list(base, "list the refs", delimiter="/")]

    # -- writes -------------------------------------------------------------------------------
    def _put(self, name: str, data: bytes, doing: str) -> None:
        self._call(
            doing,
            lambda: self._client.put_object(
                Bucket=self.bucket, Key=name, Body=data, ChecksumAlgorithm="SHA256"
            ),
        )

    def _upload(
        self, name: str, chunks: Iterator[bytes], doing: str, *, size_hint: int | None = None
    ) -> None:
        """Write `chunks` under `name`: one PUT up to `PART_SIZE` bytes, else a multipart upload
        that is aborted (nothing appears under `name`) when `chunks` raises or a part fails."""
        buffer = bytearray()
        for chunk in chunks:
            buffer += chunk
            if len(buffer) > PART_SIZE:
                break
        else:
            self._put(name, bytes(buffer), doing)
            return
        part_size = max(PART_SIZE, -(-(size_hint or 0) // (MAX_PARTS - 1)))
        upload = self._call(
            doing,
            lambda: self._client.create_multipart_upload(
                Bucket=self.bucket, Key=name, ChecksumAlgorithm="SHA256"
            ),
        )
        upload_id = upload["UploadId"]
        try:
            parts = self._send_parts(name, upload_id, _parts(buffer, chunks, part_size), doing)
            self._call(
                doing,
                lambda: self._client.complete_multipart_upload(
                    Bucket=self.bucket, Key=name, UploadId=upload_id, MultipartUpload={"Parts": parts}
                ),
            )
        except BaseException:
            self._abort(name, upload_id)
            raise

    def _send_parts(
        self, name: str, upload_id: str, parts: Iterator[bytes], doing: str
    ) -> list[dict[str, Any]]:
        """Send the parts, a few at once; their numbers, ETags and checksums, in order."""
        pool, slots = _part_senders()
        sent: list[Future[dict[str, Any]]] = []
        errors: list[BaseException] = []

        def done(future: Future[dict[str, Any]]) -> None:
            slots.release()
            if not future.cancelled() and future.exception() is not None:
                errors.append(cast(BaseException, future.exception()))

        try:
            for number, data in enumerate(parts, start=1):
                if errors:
                    raise errors[0]  # a part failed: stop reading
                if number > MAX_PARTS:
                    raise StoreError(
                        f"cannot {doing} in {self.location}: it needs more than {MAX_PARTS} parts of "
                        f"{len(data)} bytes, S3's limit"
                    )
                slots.acquire()
                try:
                    future = pool.submit(self._send_part, name, upload_id, number, data, doing)
                except BaseException:
                    slots.release()
                    raise
                future.add_done_callback(done)
                sent.append(future)
            return [f.result() for f in sent]
        except BaseException:
            for future in sent:
                future.cancel()
            for future in sent:  # let running parts end before the upload is aborted
                if not future.cancelled():
                    future.exception()
            raise

    def _send_part(self, name: str, upload_id: str, number: int, data: bytes, doing: str) -> dict[str, Any]:
        answer = self._call(
            f"{doing} (part {number})",
            lambda: self._client.upload_part(
                Bucket=self.bucket,
                Key=name,
                UploadId=upload_id,
                PartNumber=number,
                Body=data,
                ChecksumAlgorithm="SHA256",
            ),
        )
        return {"PartNumber": number, "ETag": answer["ETag"], "ChecksumSHA256": answer["ChecksumSHA256"]}

    def _abort(self, name: str, upload_id: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        # The error being raised says more than a failed abort; a bucket lifecycle rule for
        # incomplete multipart uploads removes what is left, never visible as an object meanwhile.
        with contextlib.suppress(BotoCoreError, ClientError):
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=name, UploadId=upload_id)

    def _put_stream(self, stream: BinaryIO, size: int) -> KnownFile:
        """Store a file's bytes streamed (`Store.put_file` opens it). Up to `PART_SIZE` bytes go in
        one PUT; a larger file is hashed first (nothing is sent when the bucket has it), then sent in
        parts, zstd-compressed when its start says that pays, and hashed again on the way: a file
        that changed meanwhile is refused and its upload aborted."""
        head = stream.read(PART_SIZE + 1)
        if len(head) <= PART_SIZE:
            return KnownFile(self.put_bytes(head), binary=b"\0" in head)
        with contextlib.ExitStack() as stack:
            if not stream.seekable():  # a pipe: kept in a temp file for the second pass
                spool = stack.enter_context(tempfile.TemporaryFile(prefix="flaketriage-s3-"))
                spool.write(head)
                shutil.copyfileobj(stream, spool, CHUNK)
                spool.seek(0)
                stream, head = cast(BinaryIO, spool), b""
            start = stream.tell() - len(head)
            digest = hashlib.sha256(head)
            binary = b"\0" in head
            total = len(head)
            while chunk := stream.read(CHUNK):
                digest.update(chunk)
                binary = binary or b"\0" in chunk
                total += len(chunk)
            key = digest.hexdigest()
            if not self.has(key):
                stream.seek(start)
                self._upload(
                    self._object_key(key), _encoded(stream, key), f"write object {key}", size_hint=total
                )
        return KnownFile(BlobRef(sha256=key, size=total), binary)

    # -- links --------------------------------------------------------------------------------
    def presigned_url(self, key: str, expires_s: int | None = None) -> str:
        """A link that downloads the object `key` without credentials until it expires (`expires_s`,
        default ``FLAKETRIAGE_S3_PRESIGN_EXPIRY_S``). It fetches the stored form: a tag byte
        (``00`` raw, ``01`` zstd), then the bytes."""
        expires = self.presign_expiry_s if expires_s is None else expires_s
        if not 1 <= expires <= MAX_PRESIGN_EXPIRY_S:
            raise ConfigError(
                f"a presigned link may be valid 1 to {MAX_PRESIGN_EXPIRY_S} seconds (7 days), not {expires}"
            )
        if not self.has(key):
            raise ObjectNotFoundError(key, self.location)
        name = self._object_key(key)
        return cast(
            str,
            self._call(
                f"sign a link to object {key}",
                lambda: self._client.generate_presigned_url(
                    "get_object", Params={"Bucket": self.bucket, "Key": name}, ExpiresIn=expires
                ),
            ),
        )

    def __repr__(self) -> str:
        return f"S3Store({self.location!r})"


def _parts(buffer: bytearray, chunks: Iterator[bytes], part_size: int) -> Iterator[bytes]:
    """`buffer` then `chunks`, re-cut into parts of `part_size` bytes (the last may be shorter)."""
    while True:
        while len(buffer) >= part_size:
            yield bytes(buffer[:part_size])
            del buffer[:part_size]
        chunk = next(chunks, None)
        if chunk is None:
            break
        buffer += chunk
    if buffer:
        yield bytes(buffer)


def _encoded(stream: BinaryIO, key: str) -> Iterator[bytes]:
    """The stored form of what `stream` holds, streamed; raises (before the last chunk is out) when
    its bytes no longer hash to `key` (the file changed since it was hashed)."""
    import zstandard

    digest = hashlib.sha256()
    head = stream.read(CHUNK)
    compressor = zstandard.ZstdCompressor(level=LEVEL).compressobj() if pays(head) else None
    yield RAW if compressor is None else ZSTD
    chunk = head
    while chunk:
        digest.update(chunk)
        if compressor is None:
            yield chunk
        elif out := compressor.compress(chunk):
            yield out
        chunk = stream.read(CHUNK)
    tail = b"" if compressor is None else compressor.flush()
    if digest.hexdigest() != key:
        raise StoreError(
            f"{getattr(stream, 'name', 'a file')} changed while it was being stored; capture it again"
        )
    if tail:
        yield tail


class _Body:
    """A response body read in chunks, its botocore errors translated."""

    def __init__(self, body: Any, store: S3Store, doing: str) -> None:
        self._body = body
        self._store = store
        self._doing = doing

    def read(self, size: int = -1) -> bytes:
        from botocore.exceptions import BotoCoreError

        try:
            return cast(bytes, self._body.read(None if size is None or size < 0 else size))
        except BotoCoreError as exc:
            raise self._store._failure(exc, self._doing) from exc

    def close(self) -> None:
        self._body.close()

    def __enter__(self) -> _Body:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


__all__ = ["S3Store", "parse_url"]
