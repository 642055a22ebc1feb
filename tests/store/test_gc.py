"""`collect` on every backend (local, memory, S3 on moto): what is referenced is never deleted, the
grace period protects what is being written, and what cannot be read stops the sweep."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from flaketriage.bundle.io import REF_PREFIX, BundleSummary, list_bundles, verify_bundle, write_bundle
from flaketriage.bundle.manifest import BlobRef, FileEntry, Manifest, Source
from flaketriage.store import LocalStore, Store
from flaketriage.store.gc import collect

MakeManifest = Callable[..., Manifest]
NOW = datetime.now(UTC)
OLD = NOW - timedelta(days=40)
TTL = timedelta(days=30)


def _bundle(store: Store, make_manifest: MakeManifest, blobs: dict[str, bytes], **fields: Any) -> str:
    refs = {name: store.put_bytes(data) for name, data in blobs.items()}
    return write_bundle(store, make_manifest(attachments=refs, **fields))


def _key(store: Store, data: bytes) -> str:
    return store.put_bytes(data).sha256


def test_referenced_objects_survive_and_old_bundles_go(store: Store, make_manifest: MakeManifest) -> None:
    old = _bundle(store, make_manifest, {"shared": b"dataset", "mine": b"old log"}, created_at=OLD)
    new = _bundle(store, make_manifest, {"shared": b"dataset", "own": b"new log"}, created_at=NOW)
    orphan = _key(store, b"a blob nobody names")
    keys = {name: _key(store, data) for name, data in {"shared": b"dataset", "old": b"old log"}.items()}

    dry = collect(store, older_than=TTL, grace=timedelta(0))
    assert dry.bundles == [old] and sorted(dry.objects) == sorted([keys["old"], orphan])
    assert not dry.applied and store.has(old) and store.has(orphan)  # a dry run deletes nothing
    assert [s.id for s in list_bundles(store)] == [new, old]

    done = collect(store, older_than=TTL, grace=timedelta(0), apply=True)
    assert (done.bundles, sorted(done.objects)) == (dry.bundles, sorted(dry.objects))
    assert [s.id for s in list_bundles(store)] == [new]
    assert store.get_ref(REF_PREFIX + old) is None and not store.has(old)
    assert not store.has(keys["old"]) and not store.has(orphan)
    assert store.has(keys["shared"]) and store.has(new)
    assert done.kept_bundles == 1 and done.kept_objects == 3  # the manifest and its two blobs
    again = collect(store, older_than=TTL, grace=timedelta(0), apply=True)
    assert (again.bundles, again.objects) == ([], [])


def test_the_grace_period_protects_young_objects(store: Store, make_manifest: MakeManifest) -> None:
    _bundle(store, make_manifest, {"log": b"kept"})
    orphan = _key(store, b"blob of a capture still writing its manifest")
    report = collect(store, older_than=TTL, grace=timedelta(hours=1), apply=True)
    assert report.objects == [] and report.skipped_young == 1 and store.has(orphan)
    assert collect(store, older_than=TTL, grace=timedelta(0), apply=True).objects == [orphan]


def test_kept_bundles_and_their_parents_are_never_dropped(store: Store, make_manifest: MakeManifest) -> None:
    quarantined = _bundle(store, make_manifest, {"log": b"flaky"}, created_at=OLD)
    parent = _bundle(store, make_manifest, {"data": b"all rows"}, created_at=OLD, kind="training")
    child = _bundle(store, make_manifest, {"data": b"one row"}, created_at=NOW, parent=parent)
    report = collect(store, keep={quarantined}, older_than=TTL, grace=timedelta(0), apply=True)
    assert report.bundles == [] and report.objects == []
    assert sorted(s.id for s in list_bundles(store)) == sorted([quarantined, parent, child])
    assert store.get_bytes(_key(store, b"all rows")) == b"all rows"


def test_an_unreadable_manifest_stops_the_sweep(store: Store, make_manifest: MakeManifest) -> None:
    damaged = _bundle(store, make_manifest, {"log": b"its blob"})
    old = _bundle(store, make_manifest, {"log": b"old"}, created_at=OLD, kind="training")
    _key(store, b"orphan")
    store.delete(damaged)
    store._write_object(damaged, b"\x00not the manifest")  # corrupt: its references are unknown
    report = collect(store, older_than=TTL, grace=timedelta(0), apply=True)
    assert not report.swept and report.objects == [] and damaged in report.problems[0]
    assert report.bundles == [old]  # dropping a bundle deletes no blob: that is still safe
    assert store.has(_key(store, b"its blob")) and store.has(_key(store, b"orphan"))


def test_a_manifest_of_another_version_keeps_its_blobs(store: Store, make_manifest: MakeManifest) -> None:
    blob = store.put_bytes(b"a blob a newer flaketriage wrote")
    future = json.dumps(
        {"schema_version": 9, "somewhere": {"new": [{"sha256": blob.sha256, "size": blob.size}]}}
    ).encode()
    bundle_id = store.put_bytes(future).sha256
    summary = BundleSummary.of(make_manifest()).to_json() | {"id": bundle_id}
    store.put_ref(REF_PREFIX + bundle_id, json.dumps(summary).encode())
    report = collect(store, older_than=TTL, grace=timedelta(0), apply=True)
    assert report.swept and report.objects == []
    assert store.has(blob.sha256) and store.has(bundle_id)


def test_hostile_index_entries_do_not_break_collection(store: Store, make_manifest: MakeManifest) -> None:
    good = _bundle(store, make_manifest, {"log": b"good"})
    store.put_ref(REF_PREFIX + "e" * 64, b"\xff garbage")  # names no manifest
    store.put_ref(REF_PREFIX + "not-an-id", b"{}")
    damaged_entry = _bundle(store, make_manifest, {"log": b"entry damaged"}, kind="training", created_at=OLD)
    store.put_ref(REF_PREFIX + damaged_entry, b"[1, 2")  # cannot be dated: kept
    report = collect(store, older_than=TTL, grace=timedelta(0), apply=True)
    assert report.swept and report.bundles == [] and report.objects == []
    assert store.has(good) and store.has(damaged_entry) and store.has(_key(store, b"entry damaged"))


def test_file_lists_and_the_files_they_list_are_kept(store: Store, make_manifest: MakeManifest) -> None:
    files = tuple(
        FileEntry(path=f"src/m{i}.py", sha256=store.put_bytes(f"x = {i}\n".encode()).sha256, size=6)
        for i in range(3)
    )
    bundle_id = write_bundle(store, make_manifest(source=Source(kind="snapshot", files=files)))
    assert len(list(store.keys())) == 5  # three files, their list, the manifest
    report = collect(store, older_than=TTL, grace=timedelta(0), apply=True)
    assert report.objects == [] and report.kept_objects == 5
    assert verify_bundle(store, bundle_id).problems == []


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_an_old_object_a_capture_reuses_is_young_again_for_a_concurrent_sweep(
    tmp_path: Path, make_manifest: MakeManifest
) -> None:
    # Nobody references the object any more (its bundle was dropped); a new capture stores the same
    # bytes, and a collection runs before that capture's manifest is written. Without the refresh
    # (git's "freshen") the old mtime would let the sweep delete what the new bundle names.
    store = LocalStore(tmp_path / "store")
    key = _key(store, b"the same dataset")
    path = store._object_path(key)
    _age(path, 2 * 3600)
    assert _key(store, b"the same dataset") == key  # reused: nothing written
    report = collect(store, older_than=TTL, grace=timedelta(hours=1), apply=True)
    assert report.objects == [] and report.skipped_young == 1 and store.has(key)
    bundle = write_bundle(store, make_manifest(attachments={"data": BlobRef(sha256=key, size=16)}))
    assert verify_bundle(store, bundle).ok


def test_a_file_the_stat_cache_knows_refreshes_its_object_too(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.state.margin_ns = 0  # the file may be recorded as soon as it is read
    source = tmp_path / "data.bin"
    source.write_bytes(b"x" * 100_000)
    first = store.put_file(source)
    path = store._object_path(first.sha256)
    _age(path, 2 * 3600)
    assert store.put_file(source) == first  # from the stat cache: the file is not read again
    assert time.time() - path.stat().st_mtime < 60


def test_a_read_only_store_and_a_plain_check_leave_ages_alone(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    key = _key(store, b"old bytes")
    path = store._object_path(key)
    _age(path, 2 * 3600)
    assert store.has(key) and LocalStore(tmp_path / "store", readonly=True).reuse(key)
    assert time.time() - path.stat().st_mtime > 3600
