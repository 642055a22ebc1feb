"""Source capture of a checkout: what is listed as source, and what is left to the environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flaketriage.bundle.io import load_manifest
from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits, plan_source
from flaketriage.store import LocalStore

LIMITS = SourceLimits(max_file_bytes=1 << 20, max_total_bytes=10 << 20)
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]


def _environments(root: Path) -> None:
    """A virtualenv (``pyvenv.cfg``) and a conda environment (``conda-meta/``), neither gitignored."""
    venv = root / ".venv"
    (venv / "lib" / "python3.11" / "site-packages" / "dep").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")
    (venv / "lib" / "python3.11" / "site-packages" / "dep" / "__init__.py").write_text("X = 1\n")
    (venv / "bin").mkdir()
    (venv / "bin" / "activate").write_text("# activate\n")
    conda = root / "tools" / "env"
    (conda / "conda-meta").mkdir(parents=True)
    (conda / "conda-meta" / "history").write_text("==> 2024 <==\n")
    (conda / "lib").mkdir()
    (conda / "lib" / "mod.py").write_text("Y = 2\n")
    # Not an environment: a directory that only mentions one in a file name further down.
    (root / "docs" / "venv").mkdir(parents=True)
    (root / "docs" / "venv" / "howto.md").write_text("make a venv\n")


def _capture(root: Path, store: LocalStore) -> list[str]:
    request = CaptureRequest(
        argv=[sys.executable, "-c", "raise SystemExit(5)"], cwd=root, limits=LIMITS, echo=False
    )
    result = run_and_capture(store, request)
    assert result.bundle_id
    return sorted(f.path for f in load_manifest(store, result.bundle_id).source.files)


@pytest.mark.parametrize("gitignored", [False, True])
def test_an_environment_in_a_git_checkout_is_not_source(tmp_path: Path, gitignored: bool) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "main.py").write_text("print(1)\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "c1"], cwd=repo, check=True)
    (repo / "new.py").write_text("NEW = True\n")
    _environments(repo)
    if gitignored:
        (repo / ".gitignore").write_text(".venv/\n")
    expected = ["docs/venv/howto.md", "new.py", *([".gitignore"] if gitignored else [])]
    assert sorted(plan_source(repo).files) == sorted(expected)
    assert _capture(repo, LocalStore(tmp_path / "store")) == sorted(expected)


def test_an_environment_in_a_snapshot_is_not_source(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "main.py").write_text("print(1)\n")
    _environments(root)
    assert sorted(plan_source(root).files) == ["docs/venv/howto.md", "main.py"]
    assert _capture(root, LocalStore(tmp_path / "store")) == ["docs/venv/howto.md", "main.py"]


def test_an_environment_in_a_git_checkout_snapshotted_is_not_source(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "main.py").write_text("print(1)\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    _environments(repo)
    # No commit yet: the checkout is snapshotted from git's list of its files.
    assert sorted(plan_source(repo).files) == ["docs/venv/howto.md", "main.py"]
