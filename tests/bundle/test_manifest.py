from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import pytest

from flaketriage.bundle.manifest import (
    SCHEMA_VERSION,
    BlobRef,
    DataInput,
    FileEntry,
    Manifest,
    PytestContext,
    Source,
)
from flaketriage.errors import BundleError


def test_bundle_id_is_sha256_of_canonical_json(make_manifest: Callable[..., Manifest]) -> None:
    m = make_manifest()
    raw = m.canonical_json()
    assert m.bundle_id == hashlib.sha256(raw).hexdigest()
    assert b" " not in raw.replace(b"division by zero", b"").replace(b"python train", b"")
    keys = list(json.loads(raw))
    assert keys == sorted(keys)


def test_round_trip_preserves_the_id(make_manifest: Callable[..., Manifest]) -> None:
    m = make_manifest(
        data=(DataInput(path="d.csv", format="csv", items=3, blob=BlobRef(sha256="c" * 64, size=9)),)
    )
    again = Manifest.from_json(m.canonical_json())
    assert again == m
    assert again.bundle_id == m.bundle_id


def test_any_change_changes_the_id(make_manifest: Callable[..., Manifest]) -> None:
    assert make_manifest().bundle_id != make_manifest(parent="d" * 64).bundle_id


def test_blobs_lists_every_referenced_blob_once(make_manifest: Callable[..., Manifest]) -> None:
    shared = "e" * 64
    m = make_manifest(
        source=Source(kind="snapshot", files=(FileEntry(path="a.py", sha256=shared, size=1),)),
        data=(
            DataInput(path="d", format="dir", items=1, files=(FileEntry(path="x", sha256=shared, size=1),)),
        ),
        logs={"stdout": BlobRef(sha256="f" * 64, size=0)},
    )
    assert sorted(b.sha256 for b in m.blobs()) == [shared, "f" * 64]


def test_newer_schema_is_refused_with_advice(make_manifest: Callable[..., Manifest]) -> None:
    data = json.loads(make_manifest().canonical_json())
    data["schema_version"] = 99
    with pytest.raises(BundleError, match="upgrade flaketriage"):
        Manifest.from_json(json.dumps(data).encode())


def test_an_older_schema_is_refused_with_advice(make_manifest: Callable[..., Manifest]) -> None:
    data = json.loads(make_manifest().canonical_json())
    data["schema_version"] = SCHEMA_VERSION - 1
    expected = rf"schema_version {SCHEMA_VERSION - 1}, .*reads {SCHEMA_VERSION}; .*older flaketriage; capture"
    with pytest.raises(BundleError, match=expected):
        Manifest.from_json(json.dumps(data).encode(), where="manifest of bundle abc")


def test_the_pytest_context_is_typed_and_kept(make_manifest: Callable[..., Manifest]) -> None:
    run = PytestContext(
        node_id="tests/test_z.py::test_victim",
        preceding=("tests/test_a.py::test_one", "tests/test_a.py::test_two"),
        rootdir="/work/project",
        invocation_dir="/work/project",
        duration_s=0.25,
        elapsed_s=3.5,
    )
    m = make_manifest(kind="test", pytest=run)
    again = Manifest.from_json(m.canonical_json())
    assert again.pytest == run and again.bundle_id == m.bundle_id
    assert make_manifest().pytest is None
    data = json.loads(m.canonical_json())
    data["pytest"]["nodeid"] = data["pytest"].pop("node_id")
    with pytest.raises(BundleError, match=r"pytest\.nodeid"):
        Manifest.from_json(json.dumps(data).encode())


def test_unknown_fields_and_garbage_are_refused(make_manifest: Callable[..., Manifest]) -> None:
    data = json.loads(make_manifest().canonical_json())
    data["surprise"] = 1
    with pytest.raises(BundleError, match="surprise"):
        Manifest.from_json(json.dumps(data).encode())
    with pytest.raises(BundleError, match="not valid JSON"):
        Manifest.from_json(b"{nope")


def test_blob_refs_must_be_sha256() -> None:
    with pytest.raises(ValueError):
        BlobRef(sha256="xyz", size=1)
