"""Exported reproductions: a directory that reproduces the failure with plain bash, no flaketriage."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flaketriage.bundle.files import store_dir
from flaketriage.bundle.manifest import Command, Environment, Failure, Manifest, Seeds, Source
from flaketriage.errors import BundleError, FlaketriageError
from flaketriage.process.git import Git
from flaketriage.store import LocalStore
from flaketriage.workers.export import export_bundle, python_image_tag, requirements, run_script

BUNDLE = "f" * 64
FAIL_PY = textwrap.dedent(
    """\
    import os, sys
    here = os.path.dirname(os.path.abspath(__file__))
    export = os.path.dirname(os.path.dirname(here))
    assert os.getcwd() == here, os.getcwd()
    assert os.environ["PYTHONHASHSEED"] == "1234"
    assert os.environ["MY_SEED"] == "7 7"
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    import sitecustomize
    assert os.path.samefile(sitecustomize.__file__, os.path.join(export, "sitecustomize", "sitecustomize.py"))
    data = sys.argv[1].split("=", 1)[1]
    assert open(data).read() == "a,b\\n1,2\\n", data
    print("loading", data)
    print("boom: loss is nan", file=sys.stderr)
    sys.exit(3)
    """
)


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


@pytest.fixture
def manifest(tmp_path: Path, store: LocalStore) -> Manifest:
    """A snapshot bundle of a project whose script exits 3; the original project is deleted after."""
    proj = tmp_path / "orig" / "proj"
    (proj / "sub").mkdir(parents=True)
    (proj / "sub" / "fail.py").write_text(FAIL_PY)
    (proj / "sub" / "data.csv").write_text("a,b\n1,2\n")
    (proj / "README").write_text("the project\n")
    files = tuple(store_dir(store, proj))
    cwd = proj / "sub"
    manifest = Manifest(
        command=Command(argv=(sys.executable, str(cwd / "fail.py"), f"--data={cwd}/data.csv"), cwd=str(cwd)),
        source=Source(kind="snapshot", repo_path=str(proj), subdir="sub", files=files),
        seeds=Seeds(python_hash_seed="1234", python_hash_seed_chosen=True, env={"MY_SEED": "7 7"}),
        failure=Failure(
            kind="exit",
            exit_code=3,
            detail="boom: loss is nan",
            traceback="Traceback (most recent call last):\nRuntimeError: nan",
            fingerprint="ab" * 32,
            signature="exit 3|boom: loss is nan",
        ),
        environment=Environment(
            python="3.11.7",
            implementation="CPython",
            platform="Linux",
            machine="x86_64",
            packages=(
                "editable @ file:///src/editable",
                "flaketriage==0.1.0",
                "mylib==1.0+g1234abc",
                "numpy==1.26.4",
                "proj==0.0.1",
                "torch==2.3.0+cu121",
            ),
        ),
        logs={
            "stdout": store.put_bytes(b"loading data.csv\n"),
            "stderr": store.put_bytes(b"boom: loss is nan\n"),
        },
    )
    shutil.rmtree(tmp_path / "orig")
    return manifest


def run(script: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "PYTHONPATH")}
    return subprocess.run(["bash", str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_exported_run_sh_reproduces_the_exit_code_without_flaketriage(
    tmp_path: Path, store: LocalStore, manifest: Manifest
) -> None:
    dest = export_bundle(store, manifest, BUNDLE, tmp_path / "repro", git=Git())
    assert dest == tmp_path / "repro"
    assert os.access(dest / "run.sh", os.X_OK)
    assert (dest / "workspace" / "README").read_text() == "the project\n"
    done = run(dest / "run.sh", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert "boom: loss is nan" in done.stderr
    # The export is relocatable: it finds its own files from wherever it is moved.
    moved = tmp_path / "elsewhere" / "copy"
    moved.parent.mkdir()
    dest.rename(moved)
    again = run(moved / "run.sh", cwd=tmp_path)
    assert again.returncode == 3, again.stderr
    assert f"loading {moved}/workspace/sub/data.csv" in again.stdout


def test_export_writes_environment_logs_and_readme(
    tmp_path: Path, store: LocalStore, manifest: Manifest
) -> None:
    dest = export_bundle(store, manifest, BUNDLE, tmp_path / "repro", git=Git())
    assert sorted(p.name for p in dest.iterdir()) == [
        "Dockerfile", "README.md", "logs", "requirements.txt", "run.sh", "sitecustomize", "workspace",
    ]  # fmt: skip
    script = (dest / "run.sh").read_text()
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in script and "export PYTHONHASHSEED=1234" in script
    assert "export MY_SEED='7 7'" in script and 'cd "$here"/workspace/sub' in script
    reqs = (dest / "requirements.txt").read_text().splitlines()
    pins = [line for line in reqs if line and not line.startswith("#")]
    assert pins == [
        "--extra-index-url https://download.pytorch.org/whl/cu121",
        "numpy==1.26.4",
        "torch==2.3.0+cu121",
    ]
    assert (
        "#   mylib==1.0+g1234abc" in reqs and "#   proj==0.0.1" in reqs and "#   flaketriage==0.1.0" in reqs
    )
    docker = (dest / "Dockerfile").read_text()
    assert "FROM python:3.11.7-slim" in docker
    assert "RUN pip install --no-cache-dir -r requirements.txt" in docker
    assert 'CMD ["bash", "run.sh"]' in docker
    assert (dest / "logs" / "stdout.txt").read_text() == "loading data.csv\n"
    assert (dest / "logs" / "stderr.txt").read_text() == "boom: loss is nan\n"
    assert (dest / "logs" / "traceback.txt").read_text().endswith("RuntimeError: nan")
    readme = (dest / "README.md").read_text()
    assert "bash run.sh" in readme and "docker build -t repro-ffffffffffff ." in readme
    assert "**Expected:** the command exits 0." in readme
    assert "| Exit code | 3 |" in readme and f"| Fingerprint | `{'ab' * 32}` |" in readme
    assert "`PYTHONHASHSEED=1234` (the run left it unset" in readme and "`MY_SEED=7 7`" in readme
    assert "| Python | 3.11.7 (CPython) |" in readme and "| Platform | Linux x86_64 |" in readme


def test_export_refuses_a_directory_that_is_not_empty(
    tmp_path: Path, store: LocalStore, manifest: Manifest
) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    with pytest.raises(BundleError, match="not an empty directory"):
        export_bundle(store, manifest, BUNDLE, tmp_path / "busy", git=Git())
    (tmp_path / "file").write_text("")
    with pytest.raises(BundleError, match="already exists"):
        export_bundle(store, manifest, BUNDLE, tmp_path / "file", git=Git())
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    assert (export_bundle(store, manifest, BUNDLE, tmp_path / "empty", git=Git()) / "run.sh").is_file()


def test_a_failed_export_leaves_nothing_behind(tmp_path: Path, manifest: Manifest) -> None:
    out = tmp_path / "exports"
    out.mkdir()
    with pytest.raises(FlaketriageError):
        export_bundle(LocalStore(tmp_path / "empty-store"), manifest, BUNDLE, out / "repro", git=Git())
    assert list(out.iterdir()) == []


def test_run_script_uses_plain_argv_and_seeds(manifest: Manifest) -> None:
    plain = manifest.model_copy(
        update={
            "command": Command(argv=("python", "-c", "print('it''s')", "$HOME"), cwd=manifest.command.cwd),
            "seeds": Seeds(env={"bad name": "1"}),
        }
    )
    script = run_script(plain, BUNDLE, Path("workspace/sub"), sitecustomize=False)
    assert "exec " + shlex.join(plain.command.argv) + "\n" in script
    assert "# skipped seed variable 'bad name'" in script
    assert "PYTHONHASHSEED" not in script and "PYTHONPATH" not in script


@pytest.mark.parametrize(
    ("python", "tag"),
    [("3.11.7", "3.11.7"), ("3.12.1 (main, Jan 1 2024)", "3.12.1"), ("3.10", "3.10"), ("?", "3")],
)
def test_python_image_tag(python: str, tag: str) -> None:
    assert python_image_tag(python) == tag


def test_requirements_of_an_empty_environment(manifest: Manifest) -> None:
    bare = manifest.model_copy(
        update={
            "environment": Environment(
                python="3.11.7", implementation="CPython", platform="Linux", machine="x"
            )
        }
    )
    assert [line for line in requirements(bare, BUNDLE).splitlines() if not line.startswith("#")] == []


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_export_of_a_git_bundle_keeps_the_checkout_and_the_uncommitted_change(
    tmp_path: Path, store: LocalStore, manifest: Manifest
) -> None:
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    (repo / "sub" / "fail.py").write_text("import sys\nsys.exit(0)\n")

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
            cwd=repo, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return done.stdout

    git("init", "--quiet")
    git("add", ".")
    git("commit", "--quiet", "-m", "passing")
    (repo / "sub" / "fail.py").write_text("import sys\nsys.exit(5)\n")
    diff = store.put_bytes(git("diff", "--binary", "HEAD").encode())
    cwd = repo / "sub"
    bundle = manifest.model_copy(
        update={
            "command": Command(argv=("python3", "fail.py"), cwd=str(cwd)),
            "source": Source(kind="git", commit=git("rev-parse", "HEAD").strip(), repo_path=str(repo),
                             subdir="sub", diff=diff),
        }
    )  # fmt: skip
    dest = export_bundle(store, bundle, BUNDLE, tmp_path / "repro", git=Git())
    assert (dest / "workspace" / ".git").is_dir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(["bash", str(dest / "run.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 5, done.stderr
