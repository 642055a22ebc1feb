"""A project installed as CI installs it (``pip install -e .``), run as CI runs it (``python -m pytest
--flaketriage``), then triaged: the freeze records the checkout, not a version no index has.

``pip install -e .`` (with the setuptools of those projects) leaves ``demoproj.egg-info`` in the
checkout, and ``python -m pytest`` puts the
checkout first on ``sys.path``: the freeze used to read that leftover and record
``demoproj==0.1.dev0``, and triage then asked the package index for a release that never existed
(an ``environment`` verdict). The user's virtualenv here sees the worker's packages (pytest,
flaketriage, setuptools) through a ``.pth`` file, so nothing is downloaded: the editable install is
built with ``--no-index --no-build-isolation``, and triage runs with ``PIP_NO_INDEX``. Triage runs
twice: in the worker's interpreter (``auto``: the freezes match but for demoproj), and in the bundle's
own environment, whose builder is asked for every pin but demoproj.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flaketriage.bundle.io import load_manifest
from flaketriage.store import LocalStore
from flaketriage.workers.environment.build import EnvironmentBuilder
from flaketriage.workers.environment.cache import EnvironmentCache
from flaketriage.workers.environment.key import EnvironmentKey
from flaketriage.workers.replay import ReplayContext
from flaketriage.workers.sandbox import ProcessSandbox
from flaketriage.workers.triage import triage
from flaketriage.workers.verdict import Verdict, VerdictPolicy

pytestmark = pytest.mark.slow

SETUP = "from setuptools import setup\nsetup(name='demoproj', version='0.1.dev0', packages=['demoproj'])\n"
OFFLINE = ("--no-index", "--no-build-isolation", "--disable-pip-version-check", "-e", ".")
TEST = """
import demoproj

def test_answer():
    assert demoproj.answer() == 42
"""


def _venv(root: Path) -> Path:
    """A virtualenv (no pip of its own) that sees the worker's site-packages, .pth files included."""
    subprocess.run(
        [sys.executable, "-m", "uv", "venv", "--quiet", "--python", sys.executable, str(root)], check=True
    )
    (purelib,) = root.glob("lib/python*/site-packages")
    worker_site = next(p for p in site.getsitepackages() if Path(p).is_dir())
    (purelib / "worker.pth").write_text(f"import site; site.addsitedir({worker_site!r})\n")
    return root / "bin" / "python"


def _run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "PYTEST_", "PIP_"))}
    clean.pop("CI", None)
    clean.pop("PYTHONPATH", None)
    clean.update(PIP_NO_INDEX="1", UV_NO_INDEX="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", **env)
    return subprocess.run(argv, cwd=cwd, env=clean, capture_output=True, text=True, timeout=300, check=False)


def test_an_editable_install_is_replayed_from_the_captured_checkout(project: Any, tmp_path: Path) -> None:
    project.write("setup.py", SETUP)
    project.write("demoproj/__init__.py", "def answer():\n    return 42\n")
    project.write("tests/test_demo.py", TEST)
    project.write(".gitignore", ".flaketriage/\n__pycache__/\n*.egg-info/\n")
    project.git_init()
    project.write("demoproj/__init__.py", "def answer():\n    return 41\n")  # uncommitted: the bug
    python = _venv(tmp_path / "venv")
    installed = _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", *OFFLINE],
        project.root,
    )
    assert installed.returncode == 0, installed.stderr
    # The setuptools of those projects' CI wrote demoproj.egg-info into the checkout as it built the
    # editable wheel; the one here builds it in a temporary directory, so it is written as they did.
    if not (project.root / "demoproj.egg-info").is_dir():
        egg_info = _run([str(python), "setup.py", "-q", "egg_info"], project.root)
        assert egg_info.returncode == 0, egg_info.stderr
    assert (project.root / "demoproj.egg-info").is_dir()  # the leftover that shadowed the install

    store = str(project.store)
    argv = [str(python), "-m", "pytest", "-p", "flaketriage", "--flaketriage", "-p", "no:cacheprovider"]
    run = _run(argv, project.root, FLAKETRIAGE_STORE=store)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "flaketriage: captured 1 failure(s): " in run.stdout, run.stdout

    (listed,) = json.loads(project.run("bundle", "list", "--json").stdout)
    bundle_id = listed["id"]
    manifest = load_manifest(LocalStore(project.store), bundle_id)
    (line,) = [p for p in manifest.environment.packages if p.lower().startswith("demoproj")]
    assert line == f"demoproj @ {project.root.resolve().as_uri()}"
    key = EnvironmentKey.of(manifest)
    assert key.local == ("demoproj",) and not any("demoproj" in p for p in key.installs)

    # The checkout moves on (the bug is fixed): a replay that imported it, not the bundle's copy, passes.
    project.write("demoproj/__init__.py", "def answer():\n    return 42\n")
    # Triage in the worker (the freeze matches it but for the local project): the replays import
    # the checkout's code from the bundle's own copy of it, with its uncommitted change.
    result = project.run_json("triage", bundle_id, env={"PIP_NO_INDEX": "1", "UV_NO_INDEX": "1"})
    assert result["verdict"] == "deterministic", result

    # And in the bundle's own environment: built without demoproj (the builder is asked for every
    # other pin, which it lays in from the worker's site-packages instead of an index), and each
    # replay imports demoproj from its copy of the workspace.
    builder = OfflineBuilder()
    cache = EnvironmentCache(tmp_path / "environments", max_bytes=1 << 30, builder=builder)
    context = ReplayContext.from_process(environment_mode="bundle", environment_cache=cache)
    policy = VerdictPolicy()
    done = triage(LocalStore(project.store), bundle_id, sandbox=ProcessSandbox(), policy=policy, sink=None,
                  quarantine=None, context=context)  # fmt: skip
    assert builder.asked and not any("demoproj" in spec.lower() for spec in builder.asked)
    assert done.environment is not None and done.environment["mode"] == "bundle", done.environment
    assert done.environment["local"] == ["demoproj"]
    assert done.verdict.verdict is Verdict.DETERMINISTIC, done.findings


class OfflineBuilder(EnvironmentBuilder):
    """Builds a key's virtualenv, and gives it the worker's packages in place of the pins it names."""

    def __init__(self) -> None:
        super().__init__(dict(os.environ, PIP_NO_INDEX="1"), installer="uv", timeout_s=120)
        self.asked: list[str] = []

    def build(self, key: EnvironmentKey, dest: Path) -> str:
        self.asked += key.installs
        _venv(dest)
        return sys.version.split()[0]
