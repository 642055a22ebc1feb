"""Shared fixtures: stores of every backend, and small builders for real manifests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from flaketriage.manifest import Command, Environment, Failure, Manifest
from flaketriage.store import LocalStore, MemoryStore, Store

# Timing-based checks fail on a loaded 2-core CI runner without saying anything about the code.
settings.register_profile("flaketriage", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("flaketriage")


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    return MemoryStore()


@pytest.fixture
def make_manifest() -> Callable[..., Manifest]:
    def build(**overrides: Any) -> Manifest:
        fields: dict[str, Any] = {
            "command": Command(argv=("python", "train.py"), cwd="/work/project"),
            "failure": Failure(
                kind="exception",
                exception_type="ZeroDivisionError",
                message="division by zero",
                fingerprint="ab" * 32,
                signature="python|ZeroDivisionError|division by zero|train.py:main",
            ),
            "environment": Environment(
                python="3.11.7", implementation="CPython", platform="Linux-6.1-x86_64", machine="x86_64"
            ),
        }
        fields.update(overrides)
        return Manifest(**fields)

    return build
