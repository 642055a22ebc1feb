"""The package freeze reads the distribution that is installed, not a build's leftover that shadows it.

``pip install -e .`` leaves ``proj.egg-info`` in the checkout; under ``python -m pytest`` the
checkout is first on ``sys.path``, before the site-packages ``.dist-info`` that says (PEP 610) the
project was installed from that directory. These tests lay out such a ``sys.path`` by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from flaketriage.bundle.freeze import installed_packages, parse_freeze


def _metadata(directory: Path, name: str, version: str, direct_url: dict[str, object] | None = None) -> None:
    directory.mkdir(parents=True)
    header = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    (directory / ("PKG-INFO" if directory.suffix == ".egg-info" else "METADATA")).write_text(header)
    if direct_url is not None:
        (directory / "direct_url.json").write_text(json.dumps(direct_url))


def _checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "setup.py").write_text("from setuptools import setup\nsetup(name='demoproj')\n")
    _metadata(root / "demoproj.egg-info", "demoproj", "0.1.dev0")
    return root


def _freeze(monkeypatch: pytest.MonkeyPatch, *path: Path) -> dict[str, str]:
    with monkeypatch.context() as patched:
        patched.setattr(sys, "path", [str(p) for p in path])
        lines = installed_packages()
    return {line.split()[0].split("==")[0]: line for line in lines}


def test_an_editable_install_shadowed_by_its_checkouts_egg_info_is_recorded_as_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _checkout(tmp_path)
    site = tmp_path / "site-packages"
    editable: dict[str, object] = {"dir_info": {"editable": True}, "url": root.as_uri()}
    _metadata(site / "demoproj-0.1.dev0.dist-info", "demoproj", "0.1.dev0", editable)
    _metadata(site / "six-1.16.0.dist-info", "six", "1.16.0")
    frozen = _freeze(monkeypatch, root, site)
    assert frozen == {"demoproj": f"demoproj @ {root.as_uri()}", "six": "six==1.16.0"}
    (demoproj, _) = parse_freeze(frozen.values())
    assert demoproj.local and demoproj.path == str(root)  # a worker never asks an index for it


def test_a_checkout_installed_with_setup_py_develop_is_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No dist-info anywhere (an .egg-link put the checkout on sys.path): the checkout is the install.
    root = _checkout(tmp_path)
    assert _freeze(monkeypatch, root) == {"demoproj": f"demoproj @ {root.as_uri()}"}


def test_a_release_installed_behind_the_checkout_is_not_what_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _checkout(tmp_path)
    site = tmp_path / "site-packages"
    _metadata(site / "demoproj-0.1.dev0.dist-info", "demoproj", "0.1.dev0")
    assert _freeze(monkeypatch, root, site) == {"demoproj": f"demoproj @ {root.as_uri()}"}


def test_an_egg_info_an_installer_put_in_place_is_a_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site-packages"
    _metadata(site / "oldstyle-2.0-py3.11.egg-info", "oldstyle", "2.0")
    assert _freeze(monkeypatch, site) == {"oldstyle": "oldstyle==2.0"}
