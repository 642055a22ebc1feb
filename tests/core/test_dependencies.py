"""`require`: the one way an optional library is imported, and said to be missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flaketriage.dependencies import require
from flaketriage.errors import FlaketriageError, MissingDependencyError

ROOT = Path(__file__).resolve().parents[2]


def test_an_installed_module_is_returned() -> None:
    import json

    assert require("json", "none") is json


def test_a_missing_module_names_the_exact_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # what `import` does for an absent module
    with pytest.raises(MissingDependencyError) as caught:
        require("boto3", "s3", "the S3 store")
    error = caught.value
    assert str(error) == (
        "the S3 store needs boto3, which is not installed; install it with pip install 'flaketriage[s3]'"
    )
    assert (error.module, error.extra, error.install) == ("boto3", "s3", "pip install 'flaketriage[s3]'")
    assert isinstance(error, FlaketriageError) and isinstance(error, ImportError)


def test_a_missing_submodule_names_its_top_level_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    with pytest.raises(MissingDependencyError, match=r"^scipy.stats needs scipy, .*flaketriage\[testing\]"):
        require("scipy.stats", "testing")


def test_a_broken_installation_is_not_called_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ft_broken_module.py").write_text("raise ImportError('cannot load libfoo.so')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="libfoo") as caught:
        require("ft_broken_module", "guards")
    assert not isinstance(caught.value, MissingDependencyError)


@pytest.mark.parametrize(
    ("hide", "module", "extra"),
    [
        ("torch", "flaketriage.guards", "guards"),
        ("hypothesis", "flaketriage.testing.strategies", "testing"),
        ("transformers", "flaketriage.guards.huggingface", "huggingface"),
    ],
)
def test_optional_parts_name_their_extra(hide: str, module: str, extra: str) -> None:
    code = f"import sys; sys.modules[{hide!r}] = None; import {module}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 1
    assert "flaketriage.errors.MissingDependencyError" in done.stderr
    assert f"pip install 'flaketriage[{extra}]'" in done.stderr, done.stderr


def test_lightning_without_either_package_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['lightning'] = None; sys.modules['pytorch_lightning'] = None; "
        "import flaketriage.guards.lightning"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 1
    assert "pip install 'flaketriage[lightning]'" in done.stderr, done.stderr


def test_npy_data_without_numpy_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flaketriage.bundle.datasets import count_items

    (tmp_path / "x.npy").write_bytes(b"\x93NUMPY")
    monkeypatch.setitem(sys.modules, "numpy", None)
    with pytest.raises(MissingDependencyError, match=r"flaketriage\[data\]"):
        count_items(tmp_path / "x.npy", "npy")
