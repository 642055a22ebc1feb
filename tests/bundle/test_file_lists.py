"""File lists as objects of their own (schema 3): written with the bundle, read back through
`read_manifest` (verified, bounded, canonical), checked by `verify`, kept by `gc`, named by
`bundle_objects`, on every backend."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from flaketriage.bundle.io import bundle_objects, load_manifest, read_manifest, verify_bundle, write_bundle
from flaketriage.bundle.manifest import DataInput, FileEntry, FileListRef, Manifest, Source, encode_file_list
from flaketriage.errors import BundleError, CorruptObjectError, FlaketriageError
from flaketriage.store import LocalStore, Store
from flaketriage.store.gc import collect, referenced

MakeManifest = Callable[..., Manifest]


def _files(store: Store, prefix: str, n: int) -> tuple[FileEntry, ...]:
    entries = []
    for i in range(n):
        ref = store.put_bytes(f"{prefix} file {i}\n".encode())
        entries.append(FileEntry(path=f"{prefix}/f{i:03d}.txt", sha256=ref.sha256, size=ref.size))
    return tuple(entries)


def _manifest(store: Store, make_manifest: MakeManifest, **fields: object) -> Manifest:
    source = Source(kind="snapshot", repo_path="/work/project", files=_files(store, "src", 40))
    data = DataInput(path="data", format="dir", items=1, files=_files(store, "shard", 12))
    return make_manifest(source=source, data=(data,), **fields)


def _stored(store: Store, bundle_id: str) -> dict[str, object]:
    raw = store.get_bytes(bundle_id)
    data: dict[str, object] = json.loads(raw)
    return data


def test_the_lists_are_objects_the_manifest_names(store: Store, make_manifest: MakeManifest) -> None:
    manifest = _manifest(store, make_manifest)
    bundle_id = write_bundle(store, manifest)
    stored = _stored(store, bundle_id)
    source = stored["source"]
    assert isinstance(source, dict) and "files" not in source
    ref = FileListRef.model_validate(source["file_list"])
    assert ref.count == 40 and store.get_bytes(ref.sha256) == encode_file_list(manifest.source.files)
    assert len(store.get_bytes(bundle_id)) < 4000  # the lists are not in it
    loaded = load_manifest(store, bundle_id[:8])
    assert loaded == manifest and loaded.bundle_id == bundle_id
    assert verify_bundle(store, bundle_id).ok


def test_an_unchanged_tree_shares_its_list(store: Store, make_manifest: MakeManifest) -> None:
    first = _manifest(store, make_manifest, annotations={"run": 1})
    second = first.model_copy(update={"annotations": {"run": 2}})
    a, b = write_bundle(store, first), write_bundle(store, second)
    assert a != b
    assert _stored(store, a)["source"] == _stored(store, b)["source"]
    objects = set(store.keys())
    assert objects - {b} == set(bundle_objects(first)) and set(bundle_objects(second)) - {b} <= objects


def test_bundle_objects_names_blobs_then_lists_then_the_manifest(
    store: Store, make_manifest: MakeManifest
) -> None:
    manifest = _manifest(store, make_manifest)
    bundle_id = write_bundle(store, manifest)
    keys = list(bundle_objects(read_manifest(store, bundle_id)))
    lists = [ref.sha256 for ref, _ in manifest.file_lists()]
    blobs = [f.sha256 for f in (*manifest.source.files, *manifest.data[0].files)]
    assert keys[-1] == bundle_id and keys[-1 - len(lists) : -1] == lists
    assert set(keys[: -1 - len(lists)]) == set(blobs) and len(keys) == len(set(keys))
    assert set(keys) <= set(referenced(manifest))


def test_a_copy_with_other_files_gets_its_own_list(make_manifest: MakeManifest, tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    manifest = _manifest(store, make_manifest)
    before = manifest.source.file_list()
    fewer = manifest.source.model_copy(update={"files": manifest.source.files[:3]})
    after = fewer.file_list()
    assert before is not None and after is not None
    assert after[0].count == 3 and after[0].sha256 != before[0].sha256
    assert manifest.source.file_list() == before  # the original keeps its own


def test_a_corrupt_list_is_found_by_verify_and_refused_by_every_reader(
    tmp_path: Path, make_manifest: MakeManifest
) -> None:
    store = LocalStore(tmp_path)
    manifest = _manifest(store, make_manifest)
    bundle_id = write_bundle(store, manifest)
    ref, _ = manifest.file_lists()[0]
    path = store._object_path(ref.sha256)
    stored = bytearray(path.read_bytes())
    stored[len(stored) // 2] ^= 0x01
    path.write_bytes(bytes(stored))
    with pytest.raises(FlaketriageError, match=ref.sha256[:12]):
        read_manifest(store, bundle_id)
    with pytest.raises(CorruptObjectError):  # what restores, exports and minimization load with
        load_manifest(store, bundle_id)
    report = verify_bundle(store, bundle_id)
    assert not report.ok and any(ref.sha256 in p for p in report.problems)


def test_gc_keeps_the_list_and_what_it_lists(store: Store, make_manifest: MakeManifest) -> None:
    manifest = _manifest(store, make_manifest)
    bundle_id = write_bundle(store, manifest)
    orphan = store.put_bytes(b"nobody names me").sha256
    report = collect(store, grace=timedelta(0), apply=True)
    assert report.objects == [orphan]
    assert read_manifest(store, bundle_id) == manifest
    assert verify_bundle(store, bundle_id).ok


def test_gc_stops_when_a_list_cannot_be_read(tmp_path: Path, make_manifest: MakeManifest) -> None:
    """A list that is gone leaves the files it listed unknown: nothing may be deleted."""
    store = LocalStore(tmp_path)
    manifest = _manifest(store, make_manifest)
    write_bundle(store, manifest)
    store.put_bytes(b"an orphan")
    store.delete(manifest.file_lists()[0][0].sha256)
    before = set(store.keys())
    report = collect(store, grace=timedelta(0), apply=True)
    assert not report.swept and report.objects == [] and set(store.keys()) == before


# -- hostile lists --------------------------------------------------------------------------------
def _with_source_list(store: Store, make_manifest: MakeManifest, listed: bytes, **ref: object) -> str:
    """A bundle whose stored manifest names `listed` (put in the store as it is) as its source list."""
    key = store.put_bytes(listed).sha256
    base = json.loads(make_manifest().canonical_json())
    base["source"]["file_list"] = {"sha256": key, "size": len(listed), "count": 1, **ref}
    raw = json.dumps(base, sort_keys=True, separators=(",", ":")).encode()
    bundle_id = store.put_bytes(raw).sha256
    store.put_ref(f"bundles/{bundle_id}", b"{}")
    return bundle_id


@pytest.mark.parametrize(
    ("listed", "ref", "needle"),
    [
        (b'[{"path": "a", "sha256": "' + b"a" * 64 + b'", "size": 1}]', {}, "does not re-encode"),
        (b"[{}]", {}, "not a valid file list"),
        (b"{}", {}, "not a list of file entries"),
        (b"[[[[[[]]]]]]", {}, "not a list of file entries"),
        (b"not json", {}, "not valid JSON"),
        (b"[]", {}, "holds 0 entries, the manifest says 1"),
        (b"[]", {"size": 100 << 20}, "more than the"),
        (b"[]", {"size": 1}, "inflates past the 1 bytes"),
    ],
)
def test_a_hostile_list_is_refused_with_a_reason(
    store: Store, make_manifest: MakeManifest, listed: bytes, ref: dict[str, object], needle: str
) -> None:
    bundle_id = _with_source_list(store, make_manifest, listed, **ref)
    with pytest.raises(FlaketriageError, match=needle):
        read_manifest(store, bundle_id)


def test_a_list_with_a_path_out_of_the_workspace_is_a_verify_problem(
    store: Store, make_manifest: MakeManifest
) -> None:
    blob = store.put_bytes(b"payload")
    evil = FileEntry(path="../../etc/cron.d/x", sha256=blob.sha256, size=blob.size)
    manifest = make_manifest(source=Source(kind="snapshot", files=(evil,)))
    bundle_id = write_bundle(store, manifest)
    report = verify_bundle(store, bundle_id)
    assert any("climbs out of the workspace" in p for p in report.problems)


def test_inline_files_are_refused(store: Store, make_manifest: MakeManifest) -> None:
    base = json.loads(make_manifest().canonical_json())
    base["source"]["files"] = []
    raw = json.dumps(base, sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(BundleError, match="inline"):
        Manifest.from_json(raw, load_list=lambda ref: b"[]")
