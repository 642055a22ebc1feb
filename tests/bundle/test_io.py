from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from flaketriage.bundle.io import list_bundles, load_manifest, resolve_id, verify_bundle, write_bundle
from flaketriage.bundle.manifest import BlobRef, Manifest
from flaketriage.errors import BundleError, BundleNotFoundError, CorruptObjectError
from flaketriage.store import LocalStore, Store


def test_write_refuses_manifest_with_missing_blobs(
    store: Store, make_manifest: Callable[..., Manifest]
) -> None:
    m = make_manifest(logs={"stdout": BlobRef(sha256="1" * 64, size=3)})
    with pytest.raises(BundleError, match="missing"):
        write_bundle(store, m)
    assert list_bundles(store) == []


def test_write_load_and_resolve_prefix(store: Store, make_manifest: Callable[..., Manifest]) -> None:
    log = store.put_bytes(b"Traceback ...")
    m = make_manifest(logs={"stderr": log})
    bundle_id = write_bundle(store, m)
    assert bundle_id == m.bundle_id
    assert load_manifest(store, bundle_id[:8]) == m
    assert resolve_id(store, bundle_id.upper()) == bundle_id


def test_unknown_and_bad_ids_are_clear_errors(store: Store, make_manifest: Callable[..., Manifest]) -> None:
    write_bundle(store, make_manifest())
    with pytest.raises(BundleNotFoundError, match="bundle list"):
        resolve_id(store, "ffffffff")
    with pytest.raises(BundleNotFoundError, match="not a bundle id"):
        resolve_id(store, "xy")


def test_ambiguous_prefix(store: Store) -> None:
    store.put_ref("bundles/" + "aaaa1" + "0" * 59, b"{}")
    store.put_ref("bundles/" + "aaaa2" + "0" * 59, b"{}")
    with pytest.raises(BundleError, match="matches 2 bundles"):
        resolve_id(store, "aaaa")
    assert resolve_id(store, "aaaa1") == "aaaa1" + "0" * 59


def test_list_is_newest_first(store: Store, make_manifest: Callable[..., Manifest]) -> None:
    now = datetime.now(UTC)
    older = write_bundle(store, make_manifest(created_at=now - timedelta(hours=1)))
    newer = write_bundle(store, make_manifest(created_at=now))
    listed = list_bundles(store)
    assert [s.id for s in listed] == [newer, older]
    assert listed[0].command == "python train.py"
    assert listed[0].fingerprint == "ab" * 32
    assert listed[0].failure == "ZeroDivisionError: division by zero"


def test_verify_reports_corrupt_and_missing_blobs(
    tmp_path: Path, make_manifest: Callable[..., Manifest]
) -> None:
    st = LocalStore(tmp_path)
    good = st.put_bytes(b"stdout text" * 100)
    bad = st.put_bytes(b"stderr text" * 100)
    bundle_id = write_bundle(st, make_manifest(logs={"stdout": good, "stderr": bad}))
    assert verify_bundle(st, bundle_id).ok
    st._object_path(bad.sha256).write_bytes(b"\x00garbage")
    report = verify_bundle(st, bundle_id)
    assert not report.ok
    assert bad.sha256 in report.problems[0]
    st._object_path(good.sha256).unlink()
    assert len(verify_bundle(st, bundle_id).problems) == 2


def test_tampered_manifest_is_detected(tmp_path: Path, make_manifest: Callable[..., Manifest]) -> None:
    st = LocalStore(tmp_path)
    bundle_id = write_bundle(st, make_manifest())
    path = st._object_path(bundle_id)
    path.write_bytes(b"\x00" + path.read_bytes()[1:].replace(b"division", b"DIVISION"))
    with pytest.raises(CorruptObjectError, match=bundle_id):
        load_manifest(st, bundle_id)


def test_an_exit_is_described_once_with_pytest_s_reason_or_the_last_error_line(
    make_manifest: Callable[..., Manifest],
) -> None:
    from flaketriage.bundle.io import describe_failure
    from flaketriage.failure.fingerprint import fingerprint_failure

    def described(exit_code: int, stdout: str = "", stderr: str = "") -> str:
        info = fingerprint_failure(exit_code=exit_code, stdout=stdout, stderr=stderr)
        assert info is not None
        return describe_failure(make_manifest(failure=info.to_failure()))

    not_found = "ERROR: not found: /w/t.py::test_gone\n(no match in any of [<Module t.py>])\n"
    refused = described(4, stderr=not_found)
    assert refused == "exit 4 (pytest usage error): ERROR: not found: /w/t.py::test_gone"
    assert described(3, stderr="boom: loss is nan\n") == "exit 3: boom: loss is nan"
    assert described(2) == "exit 2"
