"""`copy_bundles` between real stores (local directories, a moto S3 server, memory): byte-for-byte
copies, only the missing objects sent, the index entry last, and failures that list nothing."""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from flaketriage.bundle.io import REF_PREFIX, list_bundles, read_manifest, verify_bundle, write_bundle
from flaketriage.bundle.manifest import FileEntry, Manifest, Source
from flaketriage.bundle.transfer import copy_bundles
from flaketriage.errors import BundleNotFoundError, FlaketriageError, StoreError
from flaketriage.settings import load_settings
from flaketriage.store import LocalStore, MemoryStore, Store, open_store
from flaketriage.store.s3 import PART_SIZE, S3Store
from tests.conftest import S3_BUCKET, S3Server

MakeManifest = Callable[..., Manifest]


def _bundle(store: Store, make_manifest: MakeManifest, blobs: dict[str, bytes], **fields: Any) -> str:
    refs = {name: store.put_bytes(data) for name, data in blobs.items()}
    return write_bundle(store, make_manifest(attachments=refs, **fields))


def _stored(store: Store, key: str) -> bytes:
    with store._open_object(key) as fh:
        return fh.read()


def _everything(store: Store) -> dict[str, bytes]:
    found = {key: _stored(store, key) for key in list(store.keys())}
    found |= {name: store.get_ref(name) or b"" for name in store.list_refs(REF_PREFIX)}
    return found


def test_local_to_s3_to_local_is_byte_for_byte(
    tmp_path: Path, s3_url: str, make_manifest: MakeManifest
) -> None:
    local = LocalStore(tmp_path / "a")
    ids = [
        _bundle(local, make_manifest, {"log": b"loss=nan\n" * 5000, "ckpt": os.urandom(PART_SIZE + 12345)}),
        _bundle(local, make_manifest, {"log": b"loss=nan\n" * 5000, "tiny": b""}, kind="training"),
    ]
    remote = open_store(s3_url, settings=load_settings())
    pushed = copy_bundles(local, remote, ids)
    assert sorted(pushed.bundles) == sorted(ids) and pushed.refs_written == 2
    assert pushed.objects_sent == 5 and pushed.objects_present == 0  # 3 distinct blobs, 2 manifests
    back = LocalStore(tmp_path / "b")
    pulled = copy_bundles(remote, back, [i[:8] for i in ids])
    assert pulled.bytes_sent == pushed.bytes_sent
    assert _everything(back) == _everything(local) == _everything(remote)
    for bundle_id in ids:
        assert verify_bundle(remote, bundle_id).ok and verify_bundle(back, bundle_id).ok
    files = sorted(
        p.relative_to(tmp_path / "a") for p in (tmp_path / "a" / "objects").rglob("*") if p.is_file()
    )
    for rel in files:
        if not rel.name.startswith("."):
            assert (tmp_path / "b" / rel).read_bytes() == (tmp_path / "a" / rel).read_bytes()


def test_file_lists_travel_with_their_bundle(
    tmp_path: Path, s3_url: str, make_manifest: MakeManifest
) -> None:
    local = LocalStore(tmp_path / "a")
    files = tuple(
        FileEntry(path=f"src/m{i}.py", sha256=local.put_bytes(f"x = {i}\n".encode()).sha256, size=6)
        for i in range(3)
    )
    bundle_id = write_bundle(local, make_manifest(source=Source(kind="snapshot", files=files)))
    remote = open_store(s3_url, settings=load_settings())
    report = copy_bundles(local, remote, [bundle_id])
    assert report.objects_sent == 5  # three files, their list, the manifest
    assert verify_bundle(remote, bundle_id).problems == []
    assert read_manifest(remote, bundle_id).source.files == files


def test_a_second_push_sends_nothing(tmp_path: Path, s3_url: str, make_manifest: MakeManifest) -> None:
    local = LocalStore(tmp_path / "a")
    bundle_id = _bundle(local, make_manifest, {"log": b"x" * 10_000, "data": os.urandom(50_000)})
    remote = open_store(s3_url, settings=load_settings())
    first = copy_bundles(local, remote, [bundle_id])
    assert first.objects_sent == 3 and first.bytes_sent > 50_000
    second = copy_bundles(local, remote, [bundle_id])
    assert (second.objects_sent, second.bytes_sent, second.refs_written) == (0, 0, 0)
    assert second.objects_present == 3 and second.bundles == [bundle_id]
    assert second.to_json()["bytes_sent"] == 0


def test_only_missing_objects_are_sent(tmp_path: Path, make_manifest: MakeManifest) -> None:
    local, dest = LocalStore(tmp_path / "a"), MemoryStore()
    shared = b"a dataset both bundles use" * 1000
    first = _bundle(local, make_manifest, {"data": shared})
    second = _bundle(local, make_manifest, {"data": shared, "log": b"other"}, kind="training")
    copy_bundles(local, dest, [first])
    report = copy_bundles(local, dest, [second])
    assert report.objects_sent == 2 and report.objects_present == 1  # the log and the manifest


def test_a_parent_is_copied_only_when_asked(tmp_path: Path, make_manifest: MakeManifest) -> None:
    local = LocalStore(tmp_path / "a")
    parent = _bundle(local, make_manifest, {"data": b"all the rows" * 100})
    child = _bundle(local, make_manifest, {"data": b"the row"}, parent=parent)
    alone = MemoryStore()
    assert copy_bundles(local, alone, [child]).bundles == [child]
    assert [s.id for s in list_bundles(alone)] == [child]
    both = MemoryStore()
    assert copy_bundles(local, both, [child], parents=True).bundles == [parent, child]
    assert sorted(s.id for s in list_bundles(both)) == sorted([parent, child])


def test_unknown_ids_are_refused_before_anything_is_sent(tmp_path: Path, make_manifest: MakeManifest) -> None:
    local, dest = LocalStore(tmp_path / "a"), MemoryStore()
    bundle_id = _bundle(local, make_manifest, {"log": b"x"})
    with pytest.raises(BundleNotFoundError, match="no bundle ffffff"):
        copy_bundles(local, dest, [bundle_id, "ffffff"])
    assert list(dest.keys()) == []


def test_concurrent_pushes_sharing_objects_both_complete(
    tmp_path: Path, s3_url: str, make_manifest: MakeManifest
) -> None:
    local = LocalStore(tmp_path / "a")
    shared = {f"shard{i}": os.urandom(200_000) for i in range(12)}
    one = _bundle(local, make_manifest, {**shared, "log": b"one"})
    two = _bundle(local, make_manifest, {**shared, "log": b"two"}, kind="training")
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def push(bundle_id: str) -> None:
        try:
            start.wait()
            copy_bundles(local, open_store(s3_url, settings=load_settings()), [bundle_id], threads=4)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=push, args=(b,)) for b in (one, two)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    remote = open_store(s3_url, readonly=True, settings=load_settings())
    assert sorted(s.id for s in list_bundles(remote)) == sorted([one, two])
    assert verify_bundle(remote, one).ok and verify_bundle(remote, two).ok


class _FailingStream(io.RawIOBase):
    """The stored form of an object that breaks after `after` bytes (a disk error, a dropped mount)."""

    def __init__(self, inner: BinaryIO, after: int, error: BaseException) -> None:
        self.inner, self.left, self.error = inner, after, error

    def read(self, size: int = -1) -> bytes:  # type: ignore[override]
        if self.left <= 0:
            raise self.error
        data = self.inner.read(min(size if size >= 0 else self.left, self.left))
        self.left -= len(data)
        return data

    def close(self) -> None:
        self.inner.close()
        super().close()


def _break(store: LocalStore, key: str, after: int, error: BaseException) -> None:
    real = store._open_object

    def opened(k: str) -> BinaryIO:
        stream = real(k)
        return _FailingStream(stream, after, error) if k == key else stream  # type: ignore[return-value]

    store._open_object = opened  # type: ignore[method-assign]


def test_an_interrupted_upload_leaves_no_bundle_and_no_object(
    tmp_path: Path, s3_url: str, s3_env: S3Server, make_manifest: MakeManifest
) -> None:
    local = LocalStore(tmp_path / "a")
    big = os.urandom(3 * PART_SIZE)
    broken = _bundle(local, make_manifest, {"ckpt": big, "log": b"fine"})
    fine = _bundle(local, make_manifest, {"log": b"fine"}, kind="training")
    ckpt = local.put_bytes(big).sha256
    _break(local, ckpt, after=2 * PART_SIZE + 100, error=OSError(5, "Input/output error"))
    remote = open_store(s3_url, settings=load_settings())
    with pytest.raises(StoreError, match=r"1 of 2 bundle\(s\) were not copied.*Input/output error"):
        copy_bundles(local, remote, [broken, fine])
    assert [s.id for s in list_bundles(remote)] == [fine]  # the other bundle is complete
    assert not remote.has(ckpt) and not remote.has(broken)  # neither the object nor the manifest
    assert remote.get_ref(REF_PREFIX + broken) is None
    client = s3_env.client()
    assert client.list_multipart_uploads(Bucket=S3_BUCKET).get("Uploads", []) == []


def test_ctrl_c_stops_the_copies_and_lists_nothing(
    tmp_path: Path, s3_url: str, s3_env: S3Server, make_manifest: MakeManifest
) -> None:
    local = LocalStore(tmp_path / "a")
    big = os.urandom(2 * PART_SIZE)
    bundle_id = _bundle(local, make_manifest, {"ckpt": big})
    _break(local, local.put_bytes(big).sha256, after=PART_SIZE + 10, error=KeyboardInterrupt())
    remote = open_store(s3_url, settings=load_settings())
    with pytest.raises(KeyboardInterrupt):
        copy_bundles(local, remote, [bundle_id])
    assert list_bundles(remote) == [] and list(remote.keys()) == []
    assert s3_env.client().list_multipart_uploads(Bucket=S3_BUCKET).get("Uploads", []) == []


def test_a_corrupt_source_object_is_not_copied(tmp_path: Path, make_manifest: MakeManifest) -> None:
    local = LocalStore(tmp_path / "a")
    bundle_id = _bundle(local, make_manifest, {"log": b"precious" * 100})
    key = local.put_bytes(b"precious" * 100).sha256
    path = local._object_path(key)
    path.write_bytes(path.read_bytes()[:-1] + b"!")
    dest = LocalStore(tmp_path / "b")
    with pytest.raises(StoreError, match="corrupt"):
        copy_bundles(local, dest, [bundle_id])
    assert not dest.has(key) and list_bundles(dest) == []


def test_pull_from_s3_into_a_local_store(tmp_path: Path, s3_url: str, make_manifest: MakeManifest) -> None:
    remote = open_store(s3_url, settings=load_settings())
    assert isinstance(remote, S3Store)
    bundle_id = _bundle(remote, make_manifest, {"log": b"from the bucket"})
    local = LocalStore(tmp_path / "a")
    report = copy_bundles(
        open_store(s3_url, readonly=True, settings=load_settings()), local, [bundle_id[:10]]
    )
    assert report.bundles == [bundle_id] and verify_bundle(local, bundle_id).ok


def test_a_garbage_manifest_in_the_bucket_is_refused(
    tmp_path: Path, s3_url: str, s3_env: S3Server, make_manifest: MakeManifest
) -> None:
    remote = open_store(s3_url, settings=load_settings())
    bundle_id = _bundle(remote, make_manifest, {"log": b"x"})
    prefix = s3_url.split("/", 3)[3]
    s3_env.client().put_object(
        Bucket=S3_BUCKET, Key=f"{prefix}/objects/{bundle_id[:2]}/{bundle_id[2:]}", Body=b"\x00{not json"
    )
    local = LocalStore(tmp_path / "a")
    with pytest.raises(FlaketriageError, match="corrupt"):
        copy_bundles(remote, local, [bundle_id])
    assert list(local.keys()) == [] and list_bundles(local) == []
