"""`S3Store` against a real S3-compatible server (moto's server mode, over HTTP): layout, streaming,
multipart uploads that leave nothing when cut short, corruption, presigned links, error translation
and hostile bucket contents."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import textwrap
import threading
import zlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import zstandard

from flaketriage.bundle.io import list_bundles, read_index
from flaketriage.errors import (
    ConfigError,
    CorruptObjectError,
    ObjectNotFoundError,
    ObjectTooLargeError,
    StoreCredentialsError,
    StoreError,
    StoreNotFoundError,
    StorePermissionError,
    StoreUnreachableError,
)
from flaketriage.settings import load_settings
from flaketriage.store import LocalStore, open_store
from flaketriage.store import s3 as s3_module
from flaketriage.store.s3 import PART_SIZE, S3Store, parse_url
from tests.conftest import S3_BUCKET, S3Server, free_port


def _s3(url: str, **options: Any) -> S3Store:
    store = open_store(url, settings=load_settings(), **options)
    assert isinstance(store, S3Store)
    return store


def _prefix(url: str) -> str:
    return url.split("/", 3)[3]


def test_objects_and_refs_use_the_local_layout(s3_url: str, s3_env: S3Server) -> None:
    store = _s3(s3_url)
    assert store.url == s3_url and store.location == f"{s3_url} (at {s3_env.endpoint})"
    small, packed = b"tiny", b"loss=0.5\n" * 10_000
    keys = [store.put_bytes(small).sha256, store.put_bytes(packed).sha256]
    store.put_ref("bundles/abc", b"{}")
    client = s3_env.client()
    prefix = _prefix(s3_url)
    names = sorted(o["Key"] for o in client.list_objects_v2(Bucket=S3_BUCKET, Prefix=prefix)["Contents"])
    assert names == sorted(
        [*(f"{prefix}/objects/{k[:2]}/{k[2:]}" for k in keys), f"{prefix}/refs/bundles/abc"]
    )
    raw = client.get_object(Bucket=S3_BUCKET, Key=f"{prefix}/objects/{keys[0][:2]}/{keys[0][2:]}")[
        "Body"
    ].read()
    assert raw == b"\x00tiny"  # the local store's stored form: tag, then the bytes
    stored = client.get_object(Bucket=S3_BUCKET, Key=f"{prefix}/objects/{keys[1][:2]}/{keys[1][2:]}")
    body = stored["Body"].read()
    assert body[:1] == b"\x01" and len(body) < len(packed) / 10
    assert zstandard.ZstdDecompressor().stream_reader(body[1:]).read() == packed


def test_a_large_file_goes_up_in_checksummed_parts_and_streams_back(
    s3_url: str, s3_env: S3Server, tmp_path: Path
) -> None:
    store = _s3(s3_url)
    sent: list[tuple[int, str, str]] = []
    upload_part = store._client.upload_part

    def recording(**request: Any) -> Any:
        answer = upload_part(**request)
        sent.append((request["PartNumber"], request["ChecksumAlgorithm"], answer["ChecksumSHA256"]))
        parts[request["PartNumber"]] = request["Body"]
        return answer

    parts: dict[int, bytes] = {}
    store._client.upload_part = recording
    src = tmp_path / "checkpoint.bin"
    with src.open("wb") as fh:  # 20 MiB of random bytes, then 10 MiB of zeros: 8 + 8 + 8 + 6 MiB
        fh.write(os.urandom(20 << 20))
        fh.write(bytes(10 << 20))
    ref = store.put_file(src)
    assert ref.sha256 == hashlib.sha256(src.read_bytes()).hexdigest() and ref.size == 30 << 20
    assert sorted(n for n, _, _ in sent) == [1, 2, 3, 4]
    for number, algorithm, checksum in sent:  # the server checked each part against its SHA-256
        assert algorithm == "SHA256"
        assert checksum == base64.b64encode(hashlib.sha256(parts[number]).digest()).decode()
    head = s3_env.client().head_object(
        Bucket=S3_BUCKET, Key=f"{_prefix(s3_url)}/objects/{ref.sha256[:2]}/{ref.sha256[2:]}"
    )
    assert head["ContentLength"] == (30 << 20) + 1  # raw: the random sample does not compress
    assert head["ETag"].strip('"').endswith("-4")  # one object, of four parts
    dest = tmp_path / "back.bin"
    store.get_file(ref.sha256, dest, max_size=ref.size)
    assert dest.read_bytes() == src.read_bytes()
    sent.clear()
    assert store.put_file(src) == ref and sent == []  # already there: hashed, nothing sent


def test_a_compressible_large_file_is_stored_compressed(s3_url: str, tmp_path: Path) -> None:
    store = _s3(s3_url)
    src = tmp_path / "metrics.log"
    src.write_bytes(b"step=1 loss=0.25 lr=0.001\n" * 800_000)  # ~20 MB
    ref = store.put_file(src)
    with store._open_object(ref.sha256) as stored:
        assert stored.read(1) == b"\x01"
    assert store.get_bytes(ref.sha256) == src.read_bytes()


def _failing(after: int) -> Iterator[bytes]:
    sent = 0
    yield b"\x00"
    while True:
        if sent >= after:
            raise OSError("the disk went away")
        yield os.urandom(1 << 20)
        sent += 1 << 20


def test_an_interrupted_multipart_upload_leaves_nothing(s3_url: str, s3_env: S3Server) -> None:
    store = _s3(s3_url)
    key = "ab" * 32
    with pytest.raises(OSError, match="disk went away"):
        store.put_stored(key, _failing(after=3 * PART_SIZE))  # three parts sent, then the error
    client = s3_env.client()
    assert client.list_objects_v2(Bucket=S3_BUCKET, Prefix=_prefix(s3_url)).get("KeyCount") == 0
    uploads = client.list_multipart_uploads(Bucket=S3_BUCKET, Prefix=_prefix(s3_url)).get("Uploads", [])
    assert uploads == []  # aborted
    assert not store.has(key) and list(store.keys()) == []


def test_a_file_that_changes_while_it_is_sent_is_refused(
    s3_url: str, s3_env: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _s3(s3_url)
    src = tmp_path / "growing.bin"
    src.write_bytes(os.urandom(3 * PART_SIZE))
    real = s3_module._encoded

    def edited_midway(stream: BinaryIO, key: str) -> Iterator[bytes]:
        for n, chunk in enumerate(real(stream, key)):
            if n == 2:
                with src.open("r+b") as fh:
                    fh.seek(-10, os.SEEK_END)
                    fh.write(b"0123456789")
            yield chunk

    monkeypatch.setattr(s3_module, "_encoded", edited_midway)
    with pytest.raises(StoreError, match="changed while it was being stored"):
        store.put_file(src)
    assert list(store.keys()) == []
    assert s3_env.client().list_multipart_uploads(Bucket=S3_BUCKET).get("Uploads", []) == []


def test_a_large_stream_that_cannot_seek_is_spooled(s3_url: str) -> None:
    store = _s3(s3_url)
    data = os.urandom(PART_SIZE) + b"tail" * 1000
    read, write = os.pipe()

    def feed() -> None:
        with os.fdopen(write, "wb") as sink:
            sink.write(data)

    writer = threading.Thread(target=feed)
    writer.start()
    with os.fdopen(read, "rb") as pipe:
        known = store._put_stream(pipe, len(data))
    writer.join()
    assert known.ref.sha256 == hashlib.sha256(data).hexdigest() and known.ref.size == len(data)
    assert store.get_bytes(known.ref.sha256) == data


def test_a_corrupt_object_in_the_bucket_is_detected(s3_url: str, s3_env: S3Server, tmp_path: Path) -> None:
    store = _s3(s3_url)
    data = b"precious checkpoint bytes" * 100
    ref = store.put_bytes(data)
    name = f"{_prefix(s3_url)}/objects/{ref.sha256[:2]}/{ref.sha256[2:]}"
    client = s3_env.client()
    stored = bytearray(client.get_object(Bucket=S3_BUCKET, Key=name)["Body"].read())
    stored[-1] ^= 0xFF
    client.put_object(Bucket=S3_BUCKET, Key=name, Body=bytes(stored))
    with pytest.raises(CorruptObjectError, match=ref.sha256):
        store.get_bytes(ref.sha256)
    with pytest.raises(CorruptObjectError):
        store.get_file(ref.sha256, tmp_path / "restored")
    assert not (tmp_path / "restored").exists()
    local = LocalStore(tmp_path / "local")
    with pytest.raises(CorruptObjectError):
        store.copy_to(local, ref.sha256)
    assert not local.has(ref.sha256)
    assert store.check(drop=True) == [ref.sha256] and not store.has(ref.sha256)


def test_a_bomb_is_refused_before_it_inflates(s3_url: str, s3_env: S3Server, tmp_path: Path) -> None:
    store = _s3(s3_url)
    key = "cd" * 32
    bomb = b"\x01" + zstandard.ZstdCompressor(level=19).compress(bytes(200 << 20))
    assert len(bomb) < 100_000
    s3_env.client().put_object(Bucket=S3_BUCKET, Key=f"{_prefix(s3_url)}/objects/cd/{key[2:]}", Body=bomb)
    with pytest.raises(ObjectTooLargeError, match="inflates past"):
        store.get_file(key, tmp_path / "out", max_size=1000)
    with pytest.raises(ObjectTooLargeError):
        list(store.stored_chunks(key, max_size=1000))
    assert not (tmp_path / "out").exists()


def test_presigned_links_fetch_the_stored_form(s3_url: str, s3_env: S3Server) -> None:
    store = _s3(s3_url)
    data = b"a log line\n" * 1000
    ref = store.put_bytes(data)
    url = store.presigned_url(ref.sha256, expires_s=600)
    parts = urlsplit(url)
    assert f"{parts.scheme}://{parts.netloc}" == s3_env.endpoint
    assert parts.path == f"/{S3_BUCKET}/{_prefix(s3_url)}/objects/{ref.sha256[:2]}/{ref.sha256[2:]}"
    query = parse_qs(parts.query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"] and query["X-Amz-Expires"] == ["600"]
    assert query["X-Amz-Signature"][0] and "testing/" in query["X-Amz-Credential"][0]
    fetched = httpx.get(url, trust_env=False)
    assert fetched.status_code == 200
    assert fetched.content[:1] == b"\x01"
    assert zstandard.ZstdDecompressor().stream_reader(fetched.content[1:]).read() == data
    default = parse_qs(urlsplit(store.presigned_url(ref.sha256)).query)
    assert default["X-Amz-Expires"] == ["3600"]
    with pytest.raises(ConfigError, match="7 days"):
        store.presigned_url(ref.sha256, expires_s=8 * 86400)
    with pytest.raises(ObjectNotFoundError):
        store.presigned_url("0" * 64)


def test_the_endpoint_is_the_openers_settings_not_the_environment(
    s3_url: str, s3_env: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`S3Store.from_url` reads no settings itself: its opener's are the ones it uses."""
    monkeypatch.setenv("FLAKETRIAGE_S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("FLAKETRIAGE_S3_PRESIGN_EXPIRY_S", "60")
    settings = load_settings(s3_endpoint_url=s3_env.endpoint, s3_presign_expiry_s=90)
    store = open_store(s3_url, settings=settings)
    assert isinstance(store, S3Store) and store.endpoint_url == s3_env.endpoint
    assert store.presign_expiry_s == 90


def test_the_presign_expiry_setting(s3_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAKETRIAGE_S3_PRESIGN_EXPIRY_S", "120")
    store = _s3(s3_url)
    key = store.put_bytes(b"x").sha256
    assert parse_qs(urlsplit(store.presigned_url(key)).query)["X-Amz-Expires"] == ["120"]


def test_age_listing_and_deletes(s3_url: str) -> None:
    store = _s3(s3_url)
    keys = sorted(store.put_bytes(f"blob {i}".encode()).sha256 for i in range(5))
    assert list(store.keys()) == keys
    age = store.age(keys[0])
    assert age is not None and timedelta(0) <= age < timedelta(minutes=5)
    assert store.age("0" * 64) is None
    store.delete(keys[0])
    assert list(store.keys()) == keys[1:] and store.age(keys[0]) is None
    for i in range(3):
        store.put_ref(f"bundles/{i}", b"{}")
    store.put_ref("bundles/deeper/x", b"{}")
    store.put_ref("other", b"{}")
    assert sorted(store.list_refs("bundles/")) == ["bundles/0", "bundles/1", "bundles/2"]
    assert store.list_refs("") == ["other"]
    store.delete_ref("bundles/1")
    store.delete_ref("bundles/never-there")
    assert sorted(store.list_refs("bundles/")) == ["bundles/0", "bundles/2"]
    assert store.missing([keys[0], keys[1], "1" * 64]) == [keys[0], "1" * 64]


def test_listing_pages_through(s3_url: str, s3_env: S3Server) -> None:
    client = s3_env.client()
    prefix = _prefix(s3_url)
    names = sorted(hashlib.sha256(str(i).encode()).hexdigest() for i in range(120))
    for key in names:
        client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/objects/{key[:2]}/{key[2:]}", Body=b"\x00")
    store = _s3(s3_url)
    store.page_size = 50
    requests: list[str] = []
    store._client.meta.events.register("before-call.s3.ListObjectsV2", lambda **_: requests.append("list"))
    assert list(store.keys()) == names
    assert len(requests) == 3


def test_a_readonly_store_refuses_writes(s3_url: str) -> None:
    key = _s3(s3_url).put_bytes(b"x").sha256
    ro = _s3(s3_url, readonly=True)
    assert ro.get_bytes(key) == b"x"
    for write in (lambda: ro.put_bytes(b"y"), lambda: ro.put_ref("bundles/a", b"{}"), lambda: ro.delete(key)):
        with pytest.raises(StoreError, match="read-only"):
            write()


# -- errors -------------------------------------------------------------------------------------
def test_a_missing_bucket_says_so(s3_env: S3Server) -> None:
    with pytest.raises(StoreNotFoundError, match=r"bucket 'no-such-bucket' does not exist.*create it"):
        open_store("s3://no-such-bucket/ft", settings=load_settings())


def test_a_dead_endpoint_says_what_to_check(s3_env: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAKETRIAGE_S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(
        StoreUnreachableError, match=r"cannot be reached.*FLAKETRIAGE_S3_ENDPOINT_URL"
    ) as caught:
        open_store(f"s3://{S3_BUCKET}/ft", settings=load_settings())
    assert "\n" not in str(caught.value)


def test_no_credentials_says_where_they_come_from(
    s3_env: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(StoreCredentialsError, match=r"no AWS credentials.*AWS_ACCESS_KEY_ID"):
        open_store(f"s3://{S3_BUCKET}/ft", settings=load_settings())


def _client_error(code: str, status: int, operation: str = "HeadObject") -> Exception:
    from botocore.exceptions import ClientError

    return ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} said the server"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        operation,
    )


@pytest.mark.parametrize(
    ("code", "status", "error", "needle"),
    [
        ("InvalidAccessKeyId", 403, StoreCredentialsError, "rejects the credentials"),
        ("SignatureDoesNotMatch", 403, StoreCredentialsError, "AWS_SECRET_ACCESS_KEY"),
        ("AccessDenied", 403, StorePermissionError, "access denied.*IAM and bucket policies"),
        ("InternalError", 500, StoreError, "answered 500"),
    ],
)
def test_client_errors_become_store_errors(
    s3_url: str, code: str, status: int, error: type[StoreError], needle: str
) -> None:
    # moto accepts any credentials and any request: the server's refusal is made up here.
    store = _s3(s3_url)

    def refuse(**_: Any) -> None:
        raise _client_error(code, status)

    store._client.head_object = refuse
    store._client.put_object = refuse
    with pytest.raises(error, match=needle) as caught:
        store.has("0" * 64)
    assert type(caught.value) is error and "check an object" in str(caught.value)
    with pytest.raises(error):
        store.put_ref("bundles/x", b"{}")


# -- hostile contents ----------------------------------------------------------------------------
def test_hostile_bucket_contents(s3_url: str, s3_env: S3Server, make_manifest: Any) -> None:
    store = _s3(s3_url)
    client = s3_env.client()
    prefix = _prefix(s3_url)
    garbage_id = "e" * 64
    for name, body in {
        f"{prefix}/refs/bundles/{garbage_id}": b"\xff\xfe not json",
        f"{prefix}/refs/bundles/../../escape": b"{}",
        f"{prefix}/refs/bundles/..": b"{}",
        f"{prefix}/objects/../../etc/passwd": b"root",
        f"{prefix}/objects/ab/short": b"\x00x",
        f"{prefix}/objects/ZZ/{'z' * 62}": b"\x00x",
        f"{prefix}/objects/{garbage_id[:2]}/{garbage_id[2:]}": b"\x00{garbage manifest",
    }.items():
        client.put_object(Bucket=S3_BUCKET, Key=name, Body=body)
    from flaketriage.bundle.io import write_bundle

    good = write_bundle(store, make_manifest())
    assert list(store.keys()) == sorted([garbage_id, good])  # keys that are not objects are ignored
    index = read_index(store)
    assert [s.id for s in index.bundles] == [good]
    assert len(index.problems) == 2  # the garbage entry, and "..", which is not a bundle id
    assert "'bundles/..'" in index.problems[0] or "'bundles/..'" in index.problems[1]
    with pytest.raises(CorruptObjectError):
        store.get_bytes(garbage_id)
    with pytest.raises(StoreError, match=r"'\.\.'"):
        store.put_ref("bundles/../../escape", b"{}")
    with pytest.raises(StoreError, match=r"'\.\.'"):
        store.get_ref("../refs")
    with pytest.raises(StoreError, match="64 lowercase hex"):
        store.get_bytes("../" + "a" * 61)
    assert [s.id for s in list_bundles(store)] == [good]


def test_an_oversized_ref_is_refused(s3_url: str, s3_env: S3Server) -> None:
    store = _s3(s3_url)
    s3_env.client().put_object(
        Bucket=S3_BUCKET, Key=f"{_prefix(s3_url)}/refs/bundles/{'f' * 64}", Body=b"x" * ((4 << 20) + 1)
    )
    with pytest.raises(StoreError, match="more than 4194304 bytes"):
        store.get_ref(f"bundles/{'f' * 64}")


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("s3://", "names no store"),
        ("s3://A_Bucket/x", "does not name an S3 bucket"),
        ("s3://bu/x", "does not name an S3 bucket"),
        ("s3://bucket/a/../b", "prefix part '..'"),
        ("s3://bucket/a//b", "prefix part ''"),
        ("s3://bucket/a/\x01", "control character"),
        ("s3://bucket/" + "p" * 1000, "S3 keys hold 1024"),
    ],
)
def test_bad_s3_urls_are_config_errors(url: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        open_store(url)


def test_parse_url() -> None:
    assert parse_url("s3://my.bucket-1/a/b/") == ("my.bucket-1", "a/b")
    assert parse_url("s3://bucket") == ("bucket", "")


# -- memory --------------------------------------------------------------------------------------
def test_a_large_upload_and_download_stay_in_bounded_memory(
    s3_url: str, s3_env: S3Server, tmp_path: Path
) -> None:
    """A 400 MB checkpoint goes up and comes back with the process growing by far less than its size."""
    size = 400 << 20
    code = textwrap.dedent(
        f"""
        import os, resource, sys
        from pathlib import Path
        from flaketriage.settings import load_settings
        from flaketriage.store import open_store
        src = Path({str(tmp_path / "ckpt.bin")!r})
        with src.open("wb") as fh:  # incompressible: every byte of it is sent
            for i in range({size >> 20}):
                fh.write(os.urandom(1 << 20))
        store = open_store({s3_url!r}, settings=load_settings())
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        ref = store.put_file(src)
        up = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        store.get_file(ref.sha256, src.with_name("back.bin"), max_size=ref.size)
        down = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(base, up, down, store._object_key(ref.sha256))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stderr
    *sizes, name = proc.stdout.split()
    base, up, down = (int(x) for x in sizes)
    grown_mb = (max(up, down) - base) / 1024
    # Parts in flight (8 x 8 MiB) and a read buffer; the file itself would be 400 MB.
    print(f"moving {size >> 20} MB grew the process by {grown_mb:.0f} MB")
    assert s3_env.client().head_object(Bucket=S3_BUCKET, Key=name)["ContentLength"] == size + 1
    assert grown_mb < 120, f"the process grew by {grown_mb:.0f} MB moving a {size >> 20} MB file"
    assert zlib.crc32((tmp_path / "back.bin").read_bytes()) == zlib.crc32(
        (tmp_path / "ckpt.bin").read_bytes()
    )
