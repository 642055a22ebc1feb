"""The real CLI in a subprocess, in a fresh project directory."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(tmp_path: Path) -> Run:
    def run(
        *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        full = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
        full.update(env or {})
        return subprocess.run(
            [sys.executable, "-m", "flaketriage", *args],
            cwd=cwd or tmp_path,
            env=full,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    return run
