"""Hostile and careless input, through the real CLI: one line, nothing lost, nothing escaped.

Every test here runs ``python -m flaketriage`` in a subprocess inside a fresh project directory,
with ``HOME`` and ``TMPDIR`` pointed into the test's own directories, so it can assert:

- the exit status and the one-line message (``error: ...`` on stderr, no ``Traceback``);
- that nothing was written outside the places the command may write (`Sandbox.outside_writes`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


def tree(root: Path) -> set[str]:
    """Every path under `root` (links not followed), relative to it."""
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            found.add(os.path.relpath(os.path.join(dirpath, name), root))
    return found


@dataclass
class Sandbox:
    """A project directory, a HOME and a TMPDIR of the test's own, and the real CLI run inside them."""

    root: Path
    project: Path
    home: Path
    tmp: Path
    outside: Path
    """A directory beside the project that no command may touch (a stand-in for the rest of the disk)."""

    @property
    def store(self) -> Path:
        return self.project / ".flaketriage"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
        env.update(HOME=str(self.home), TMPDIR=str(self.tmp), COLUMNS="200")
        env.update(extra or {})
        return env

    def run(
        self,
        *args: str | bytes,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flaketriage", *args],
            cwd=cwd or self.project,
            env=self.env(env),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )

    def outside_writes(self) -> set[str]:
        """Files that appeared where no command may write: the outside directory and TMPDIR."""
        return {f"outside/{p}" for p in tree(self.outside)} | {f"tmp/{p}" for p in tree(self.tmp)}


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    box = Sandbox(
        root=tmp_path,
        project=tmp_path / "project",
        home=tmp_path / "home",
        tmp=tmp_path / "tmp",
        outside=tmp_path / "outside",
    )
    for d in (box.project, box.home, box.tmp, box.outside):
        d.mkdir()
    yield box


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The command failed with `code` and said why in one ``error:`` line, without a traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def assert_no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
