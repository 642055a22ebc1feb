from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flaketriage.bundle.io import load_manifest
from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.errors import SandboxError
from flaketriage.process.git import Git
from flaketriage.store import LocalStore
from flaketriage.workers.materialize import materialize

LIMITS = SourceLimits(max_file_bytes=1 << 20, max_total_bytes=10 << 20)
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]


def _capture(root: Path, store: LocalStore, **kw: object) -> str:
    request = CaptureRequest(
        argv=[sys.executable, "-c", "raise SystemExit(5)"],
        cwd=root,
        limits=LIMITS,
        echo=False,
        **kw,  # type: ignore[arg-type]
    )
    result = run_and_capture(store, request)
    assert result.bundle_id
    return result.bundle_id


def test_git_checkout_plus_diff_plus_untracked(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "code.py").write_text("VALUE = 1\n")
    (repo / "README").write_text("committed\n")
    (repo / ".gitignore").write_text("ignored.txt\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "c1"], cwd=repo, check=True)
    (repo / "pkg" / "code.py").write_text("VALUE = 2  # uncommitted\n")
    (repo / "pkg" / "new.py").write_text("NEW = True\n")
    (repo / "ignored.txt").write_text("never captured\n")
    (repo / "big.bin").write_bytes(b"x" * (2 << 20))
    store = LocalStore(tmp_path / "store")
    manifest = load_manifest(store, _capture(repo / "pkg", store))
    src = manifest.source
    assert src.kind == "git" and src.subdir == "pkg" and src.diff is not None
    assert [f.path for f in src.files] == ["pkg/new.py"]
    assert src.skipped == ("big.bin",)
    ws = materialize(store, manifest, tmp_path / "ws", git=Git())
    assert ws.cwd == ws.root / "pkg"
    assert (ws.cwd / "code.py").read_text() == "VALUE = 2  # uncommitted\n"
    assert (ws.cwd / "new.py").read_text() == "NEW = True\n"
    assert (ws.root / "README").read_text() == "committed\n"
    assert not (ws.root / "ignored.txt").exists()


def test_snapshot_honours_gitignore_and_restores_data(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "data").mkdir(parents=True)
    (root / "main.py").write_text("print(1)\n")
    (root / ".gitignore").write_text("*.log\ncache/\n")
    (root / "run.log").write_text("noise")
    (root / "cache").mkdir()
    (root / "cache" / "x").write_text("cached")
    (root / "data" / "d.csv").write_text("a,b\n1,2\n3,4\n")
    (root / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "tool.sh").chmod(0o755)
    store = LocalStore(tmp_path / "store")
    manifest = load_manifest(store, _capture(root, store, data=[Path("data/d.csv")]))
    assert manifest.source.kind == "snapshot"
    assert sorted(f.path for f in manifest.source.files) == [".gitignore", "data/d.csv", "main.py", "tool.sh"]
    assert manifest.data[0].items == 2
    ws = materialize(store, manifest, tmp_path / "ws", git=Git())
    assert (ws.cwd / "data" / "d.csv").read_text() == "a,b\n1,2\n3,4\n"
    assert not (ws.cwd / "run.log").exists()
    assert subprocess.run([str(ws.cwd / "tool.sh")], capture_output=True, text=True).stdout == "hi\n"


def test_missing_repository_is_a_clear_error(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "c1"], cwd=repo, check=True)
    store = LocalStore(tmp_path / "store")
    manifest = load_manifest(store, _capture(repo, store))
    subprocess.run(["rm", "-rf", str(repo)], check=True)
    with pytest.raises(SandboxError, match="--snapshot"):
        materialize(store, manifest, tmp_path / "ws", git=Git())


def test_refuses_a_non_empty_destination(tmp_path: Path) -> None:
    root = tmp_path / "p"
    root.mkdir()
    store = LocalStore(tmp_path / "store")
    manifest = load_manifest(store, _capture(root, store))
    dest = tmp_path / "busy"
    dest.mkdir()
    (dest / "file").write_text("x")
    with pytest.raises(SandboxError, match="not empty"):
        materialize(store, manifest, dest, git=Git())
