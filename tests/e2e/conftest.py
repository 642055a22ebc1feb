"""End-to-end fixtures: a real project directory and the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class Project:
    root: Path

    @property
    def store(self) -> Path:
        return self.root / ".flaketriage"

    def write(self, name: str, text: str) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
        full_env["FLAKETRIAGE_STORE"] = str(self.store)
        full_env.update(env or {})
        return subprocess.run(
            [sys.executable, "-m", "flaketriage", *args],
            cwd=self.root,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    def run_json(self, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        proc = (
            self.run(*args, "--json", env=env)
            if "--" not in args
            else self.run(*_json_before_dashes(args), env=env)
        )
        lines = proc.stdout.strip().splitlines()
        assert lines, f"no output\nstdout:{proc.stdout}\nstderr:{proc.stderr}"
        try:
            data: dict[str, Any] = json.loads(lines[-1])
        except ValueError:
            raise AssertionError(
                f"last line is not JSON\nstdout:{proc.stdout}\nstderr:{proc.stderr}"
            ) from None
        data["_exit"] = proc.returncode
        data["_stderr"] = proc.stderr
        return data

    def capture_until_failure(self, *args: str, tries: int = 40) -> dict[str, Any]:
        for _ in range(tries):
            result = self.run_json("capture", *args)
            if result["bundle"]:
                return result
        raise AssertionError(f"no failure in {tries} captures")

    def git_init(self) -> None:
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
        subprocess.run([*git, "init", "-q"], cwd=self.root, check=True)
        subprocess.run([*git, "add", "-A"], cwd=self.root, check=True)
        subprocess.run([*git, "commit", "-qm", "init"], cwd=self.root, check=True)


def _json_before_dashes(args: tuple[str, ...]) -> list[str]:
    i = args.index("--")
    return [*args[:i], "--json", *args[i:]]


@pytest.fixture
def project(tmp_path: Path) -> Project:
    root = tmp_path / "project"
    root.mkdir()
    (root / ".gitignore").write_text(".flaketriage/\n__pycache__/\n")
    return Project(root)


@pytest.fixture
def py() -> str:
    return sys.executable


ProjectFactory = Callable[[], Project]
