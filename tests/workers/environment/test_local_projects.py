"""Local projects of a bundle's environment: found in the replay's workspace, never asked of an index.

A freeze line ``demoproj @ file:///ci/checkout`` (an editable install, PEP 610) names the captured
checkout. The replay finds the project there in its own copy of the workspace, by the name its
files declare or, when they do not spell it out (``setup(name=NAME)``), by the directory the
installer recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from flaketriage.bundle.manifest import Command, Environment, Manifest
from flaketriage.errors import ReplayEnvironmentError
from flaketriage.workers.environment.key import EnvironmentKey
from flaketriage.workers.environment.replay import find_local_projects
from flaketriage.workers.materialize import Workspace


def _manifest(make_manifest: Callable[..., Manifest], *packages: str) -> Manifest:
    env = Environment(python="3.11.7", implementation="CPython", platform="Linux", machine="x86_64")
    return make_manifest(
        command=Command(argv=("python", "-m", "pytest"), cwd="/ci/checkout"),
        environment=env.model_copy(update={"packages": packages}),
    )


def _workspace(tmp_path: Path, setup: str) -> Workspace:
    root = tmp_path / "ws"
    (root / "demoproj").mkdir(parents=True)
    (root / "setup.py").write_text(setup)
    (root / "demoproj" / "__init__.py").write_text("")
    return Workspace(root=root, cwd=root)


def test_an_editable_checkout_is_local_and_found_by_its_declared_name(
    tmp_path: Path, make_manifest: Callable[..., Manifest]
) -> None:
    manifest = _manifest(make_manifest, "demoproj @ file:///ci/checkout", "six==1.16.0")
    key = EnvironmentKey.of(manifest)
    assert key.local == ("demoproj",) and key.installs == ("six==1.16.0",)
    ws = _workspace(tmp_path, "from setuptools import setup\nsetup(name='demoproj', version='0.1.dev0')\n")
    assert find_local_projects(manifest, key, ws) == {"demoproj": (Path("."), "0.1.dev0")}


def test_a_recorded_checkout_whose_setup_py_computes_its_name_is_still_found(
    tmp_path: Path, make_manifest: Callable[..., Manifest]
) -> None:
    manifest = _manifest(make_manifest, "demoproj @ file:///ci/checkout")
    key = EnvironmentKey.of(manifest)
    ws = _workspace(tmp_path, "from setuptools import setup\nNAME = 'demo' + 'proj'\nsetup(name=NAME)\n")
    (ws.root / "demoproj.egg-info").mkdir()
    (ws.root / "demoproj.egg-info" / "PKG-INFO").write_text("Name: demoproj\nVersion: 0.1.dev0\n")
    assert find_local_projects(manifest, key, ws) == {"demoproj": (Path("."), "0.1.dev0")}


def test_a_local_project_recorded_outside_the_workspace_is_an_environment_error(
    tmp_path: Path, make_manifest: Callable[..., Manifest]
) -> None:
    manifest = _manifest(make_manifest, "demoproj @ file:///elsewhere")
    ws = _workspace(tmp_path, "from setuptools import setup\nsetup(name=NAME)\n")
    with pytest.raises(ReplayEnvironmentError, match="no project called demoproj"):
        find_local_projects(manifest, EnvironmentKey.of(manifest), ws)
