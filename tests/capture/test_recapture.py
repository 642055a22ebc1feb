"""Capturing an unchanged workspace again: no file is read or stored again, and the new bundle adds
its own small manifest only (its file lists are the first bundle's objects); a change is seen;
concurrent captures into one store are safe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flaketriage.bundle.files as stored_files
from flaketriage.bundle.io import load_manifest, verify_bundle
from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.store import LocalStore, Store
from flaketriage.store.state import KnownFile

FAIL = [sys.executable, "-c", "raise SystemExit(3)"]


def _workspace(root: Path) -> Path:
    (root / "ckpt").mkdir(parents=True)
    (root / "ckpt" / "model.bin").write_bytes(os.urandom(3 << 20))
    (root / "ckpt" / "vocab.txt").write_text("".join(f"token{i}\n" for i in range(3000)))
    for i in range(120):
        pkg = root / "src" / f"pkg{i % 6}"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 20)
    (root / "src" / "table.bin").write_bytes(bytes(range(256)) * 40)
    return root


def _request(workspace: Path) -> CaptureRequest:
    return CaptureRequest(
        argv=FAIL,
        cwd=workspace,
        limits=SourceLimits(max_file_bytes=10 << 20, max_total_bytes=200 << 20),
        data=[Path("ckpt")],
        snapshot=True,
        echo=False,
    )


def _objects(store: LocalStore) -> dict[str, int]:
    return {key: store._object_path(key).stat().st_size for key in sorted(store.keys())}


class Reads:
    """Every file read for the store: streamed by `put_file`, or read to be masked."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.files: list[str] = []
        real_stream = store._put_stream
        real_mask = stored_files.mask_file

        def stream(fh: object, size: int) -> KnownFile:
            self.files.append(str(getattr(fh, "name", "?")))
            return real_stream(fh, size)  # type: ignore[arg-type]

        def mask(redactor: object, name: str, data: bytes) -> bytes | None:
            self.files.append(name)
            return real_mask(redactor, name, data)  # type: ignore[arg-type]

        monkeypatch.setattr(store, "_put_stream", stream)
        monkeypatch.setattr(stored_files, "mask_file", mask)


def test_an_unchanged_recapture_reads_and_writes_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = _workspace(tmp_path / "work")
    store = LocalStore(tmp_path / "store")
    store.state.margin_ns = 0  # the workspace was written just now: settled for this test
    first = run_and_capture(store, _request(workspace))
    assert first.bundle_id and first.error is None
    before = _objects(store)

    reads = Reads(store, monkeypatch)
    second = run_and_capture(store, _request(workspace))
    assert second.bundle_id and second.bundle_id != first.bundle_id
    assert reads.files == []
    added = {key: size for key, size in _objects(store).items() if key not in before}
    assert list(added) == [second.bundle_id]  # its manifest; logs, lists and files are shared
    assert added[second.bundle_id] < 16 * 1024

    a, b = load_manifest(store, first.bundle_id), load_manifest(store, second.bundle_id)
    assert a.source.files == b.source.files and len(a.source.files) == 123  # ckpt/ too
    assert a.source.file_list() == b.source.file_list() and a.data == b.data
    assert len(a.data[0].files) == 2
    assert verify_bundle(store, second.bundle_id).ok


def test_a_change_is_seen_and_only_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    workspace = _workspace(tmp_path / "work")
    store = LocalStore(tmp_path / "store")
    store.state.margin_ns = 0
    run_and_capture(store, _request(workspace))
    changed = workspace / "src" / "pkg1" / "mod1.py"
    changed.write_text(changed.read_text().replace("x + 1", "x - 1"))
    secret = workspace / "src" / "pkg2" / "settings.yaml"
    secret.write_text("api_password: hunter2-but-longer\n")

    reads = Reads(store, monkeypatch)
    result = run_and_capture(store, _request(workspace))
    assert sorted(reads.files) == ["src/pkg1/mod1.py", "src/pkg2/settings.yaml"]
    manifest = load_manifest(store, str(result.bundle_id))
    files = {f.path: f for f in manifest.source.files}
    assert store.get_bytes(files["src/pkg1/mod1.py"].sha256).count(b"x - 1") == 20
    assert b"hunter2" not in store.get_bytes(files["src/pkg2/settings.yaml"].sha256)

    again = Reads(store, monkeypatch)
    run_and_capture(store, _request(workspace))
    assert again.files == ["src/pkg2/settings.yaml"]  # a file with a secret is masked every time


def test_a_new_secret_in_the_environment_masks_a_file_read_before(tmp_path: Path) -> None:
    """A text file that held nothing to mask is trusted only under the same secrets."""
    workspace = _workspace(tmp_path / "work")
    (workspace / "src" / "conn.py").write_text("URL = 'postgres://db/app?key=s3cr3t-value-42'\n")
    store = LocalStore(tmp_path / "store")
    store.state.margin_ns = 0
    run_and_capture(store, _request(workspace))
    env = {**os.environ, "DB_TOKEN": "s3cr3t-value-42"}
    request = CaptureRequest(**{**_request(workspace).__dict__, "env": env})
    result = run_and_capture(store, request)
    manifest = load_manifest(store, str(result.bundle_id))
    conn = next(f for f in manifest.source.files if f.path == "src/conn.py")
    assert b"s3cr3t-value-42" not in store.get_bytes(conn.sha256)
    assert "src/conn.py" in manifest.source.masked


def test_concurrent_captures_into_one_store(tmp_path: Path) -> None:
    workspace = _workspace(tmp_path / "work")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    env["FLAKETRIAGE_STORE"] = str(tmp_path / "store")
    argv = [
        sys.executable,
        "-m",
        "flaketriage",
        "capture",
        "--json",
        "--snapshot",
        "--data",
        "ckpt",
        "--",
        *FAIL,
    ]
    procs = [
        subprocess.Popen(
            argv, cwd=workspace, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    bundles = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 3, err
        bundles.append(json.loads(out.strip().splitlines()[-1])["bundle"])
    store = LocalStore(tmp_path / "store")
    assert len(set(bundles)) == 3 and store.check() == []
    for bundle in bundles:
        assert verify_bundle(store, bundle).ok
    lists = {load_manifest(store, b).source.file_list() for b in bundles}
    assert len(lists) == 1
