"""Building a bundle's environment: find its Python, create a virtualenv, install its pinned freeze.

`uv` builds when it is installed (on PATH or beside the worker's interpreter), pip otherwise. The
freeze is the complete list of what the run had, so it is installed as it is (``--no-deps``): no
resolver picks other versions. A bundle may be hostile, and building runs outside the sandbox, so
only wheels are installed (``--only-binary :all:``: a source distribution's build would run its
code here) and never a package a bundle names by URL. Packages come from the indexes the runner's
pip configuration names (``pip config``: index, extra indexes, find-links, ``no-index``,
constraints, certificate); uv is given the same, and considers every index as pip does
(``--index-strategy unsafe-best-match``).
Whatever fails (a missing Python, a package that does not install, a build past its time limit)
raises `ReplayEnvironmentError` saying what, never a replay against other versions.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from flaketriage.errors import CaptureError, ReplayEnvironmentError
from flaketriage.process.child import ProcessResult, run_command
from flaketriage.workers.environment.key import EnvironmentKey

Installer = Literal["auto", "uv", "pip"]

_WHEELS_ONLY = (
    " (only wheels are installed: building a source distribution would run the bundle's choice of "
    "code on the worker, outside the sandbox)"
)
_VERSION_PROBE = "import platform, sys; print(platform.python_implementation(), *sys.version_info[:3])"
_PIP_LIST_OPTIONS = {"extra-index-url", "find-links", "trusted-host", "constraint"}
"""pip options whose value is a list (whitespace-separated in ``pip config list``)."""


class EnvironmentBuilder:
    """Builds environments for keys, as the worker's environment (`env`) allows.

    `env` is the worker's environment: its PATH is searched for interpreters and installers, and
    pip's ``PIP_*`` variables there count as pip configuration.
    """

    def __init__(
        self, env: Mapping[str, str], *, timeout_s: float = 1800.0, installer: Installer = "auto"
    ) -> None:
        self.env = dict(env)
        self.timeout_s = timeout_s
        self.installer = installer

    # -- the interpreter ------------------------------------------------------------------------
    def find_python(self, key: EnvironmentKey) -> tuple[str, str]:
        """(path, ``X.Y.Z``) of an interpreter for `key`: ``pythonX.Y`` on PATH, this worker's own
        interpreter, or a Python uv already installed (never downloaded)."""
        stem = "pypy" if key.implementation == "PyPy" else "python"
        candidates = _all_on_path(f"{stem}{key.python}", self.env.get("PATH", os.defpath))
        candidates.append(sys.executable)
        uv = self._uv()
        if uv is not None:
            found = self._run(
                [
                    uv,
                    "python",
                    "find",
                    "--managed-python",
                    "--no-python-downloads",
                    "--no-project",
                    key.python,
                ],
                timeout_s=30,
            )
            if found.exit_code == 0 and found.stdout.strip():
                candidates.append(found.stdout.strip().splitlines()[-1])
        for candidate in dict.fromkeys(candidates):
            probe = self._run([candidate, "-c", _VERSION_PROBE], timeout_s=30)
            parts = probe.stdout.split()
            ok = probe.exit_code == 0 and len(parts) == 4 and parts[0] == key.implementation
            if ok and f"{parts[1]}.{parts[2]}" == key.python:
                return candidate, ".".join(parts[1:])
        where = "PATH" + (" and uv's installed Pythons" if uv is not None else "")
        raise ReplayEnvironmentError(
            f"this runner has no {key.implementation} {key.python}, which the bundle ran on (looked for "
            f"{stem}{key.python} on {where}); install that Python on the runner, or replay in the "
            "worker's own interpreter with FLAKETRIAGE_ENVIRONMENT=worker"
        )

    # -- building -------------------------------------------------------------------------------
    def build(self, key: EnvironmentKey, dest: Path) -> str:
        """Create the environment of `key` at `dest` (absent) and return its Python's ``X.Y.Z``."""
        deadline = time.monotonic() + self.timeout_s
        by_url = [spec for spec in key.installs if " @ " in spec]
        if by_url:
            raise ReplayEnvironmentError(
                f"the bundle's freeze names {by_url[0]!r:.120} by URL; environments are built only from "
                "the package indexes this runner's pip configuration names, never from a URL a bundle "
                "brings; replay in the worker's own interpreter with FLAKETRIAGE_ENVIRONMENT=worker"
            )
        python, version = self.find_python(key)
        uv = self._uv() if self.installer in ("auto", "uv") else None
        if self.installer == "uv" and uv is None:
            raise ReplayEnvironmentError(
                "the uv installer was asked for but uv is not installed; pip install uv"
            )
        if uv is not None:
            self._step(
                [uv, "venv", "--quiet", "--python", python, str(dest)], "create the virtualenv", deadline
            )
        else:
            self._step([python, "-m", "venv", "--without-pip", str(dest)], "create the virtualenv", deadline)
        if key.installs:
            reqs = dest / "flaketriage-requirements.txt"
            reqs.write_text("\n".join(key.installs) + "\n", encoding="utf-8")
            target = str(dest / "bin" / "python")
            if uv is not None:
                argv = [
                    uv,
                    "pip",
                    "install",
                    "--quiet",
                    "--python",
                    target,
                    "--no-deps",
                    "--only-binary",
                    ":all:",
                    "--index-strategy",
                    "unsafe-best-match",
                    *self._uv_index_options(),
                    "-r",
                    str(reqs),
                ]
            else:
                argv = [
                    sys.executable,
                    "-m",
                    "pip",
                    "--python",
                    target,
                    "install",
                    "--quiet",
                    "--no-deps",
                    "--only-binary",
                    ":all:",
                    "--no-input",
                    "--disable-pip-version-check",
                    "-r",
                    str(reqs),
                ]
            what = f"install the bundle's {len(key.installs)} pinned packages"
            self._step(argv, what, deadline, hint=_WHEELS_ONLY)
        return version

    def _step(self, argv: Sequence[str], what: str, deadline: float, hint: str = "") -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise self._too_slow(what)
        done = self._run(argv, timeout_s=left)
        if done.timed_out:
            raise self._too_slow(what)
        if done.exit_code != 0:
            raise ReplayEnvironmentError(
                f"could not {what} ({Path(argv[0]).name} exited with {done.exit_code}): "
                f"{_gist(done.stderr or done.stdout)}{hint}; check that the runner's package index has these "
                "releases (pip's configuration is used), or replay in the worker's own interpreter with "
                "FLAKETRIAGE_ENVIRONMENT=worker"
            )

    def _too_slow(self, what: str) -> ReplayEnvironmentError:
        return ReplayEnvironmentError(
            f"could not {what} within {self.timeout_s:g} s (FLAKETRIAGE_ENVIRONMENT_BUILD_TIMEOUT_S); "
            "raise the limit, or check that the runner reaches its package index"
        )

    def _run(self, argv: Sequence[str], *, timeout_s: float) -> ProcessResult:
        try:
            # From "/": no project's pyproject.toml or uv.toml is picked up by accident.
            return run_command(argv, "/", self.env, timeout_s, contain=True, dump_hang=False)
        except CaptureError as exc:  # the program could not start
            return ProcessResult(exit_code=127, stdout="", stderr=str(exc), timed_out=False, duration_s=0.0)

    # -- installers and their configuration -----------------------------------------------------
    def _uv(self) -> str | None:
        if self.installer == "pip":
            return None
        beside = Path(sys.executable).parent / "uv"
        return shutil.which("uv", path=self.env.get("PATH", os.defpath)) or (
            str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None
        )

    def pip_configuration(self) -> dict[str, list[str]]:
        """pip's configuration as this worker's pip reads it (files and ``PIP_*``): option → values."""
        done = self._run([sys.executable, "-m", "pip", "config", "list"], timeout_s=60)
        return parse_pip_config(done.stdout) if done.exit_code == 0 else {}

    def _uv_index_options(self) -> list[str]:
        config = self.pip_configuration()
        args: list[str] = []
        for url in config.get("index-url", [])[-1:]:
            args += ["--index-url", url]
        for url in config.get("extra-index-url", []):
            args += ["--extra-index-url", url]
        for place in config.get("find-links", []):
            args += ["--find-links", place]
        for host in config.get("trusted-host", []):
            args += ["--allow-insecure-host", host]
        for path in config.get("constraint", []):
            args += ["--constraint", path]
        if _truthy(config.get("no-index", [])):
            args.append("--no-index")
        if config.get("cert"):
            self.env.setdefault("SSL_CERT_FILE", config["cert"][-1])
        return args


def parse_pip_config(text: str) -> dict[str, list[str]]:
    """``pip config list`` output as option → values, later sources (``PIP_*``) after earlier ones.

    Lines read ``global.index-url='https://...'``, ``install.no-index='1'`` or ``:env:.find-links='...'``;
    the ``:env:`` ones (environment variables) override files, as in pip.
    """
    files: dict[str, list[str]] = {}
    env: dict[str, list[str]] = {}
    for line in text.splitlines():
        found = re.match(r"^([^.=]*)\.([A-Za-z0-9_-]+)=(.*)$", line.strip())
        if found is None:
            continue
        section, option, raw = found.groups()
        try:
            value = " ".join(shlex.split(raw))
        except ValueError:
            value = raw.strip("'\"")
        values = value.split() if option in _PIP_LIST_OPTIONS else [value]
        (env if section == ":env:" else files)[option] = values
    return {**files, **env}


def _truthy(values: list[str]) -> bool:
    return bool(values) and values[-1].strip().lower() in ("1", "true", "yes", "on")


def _all_on_path(name: str, path: str) -> list[str]:
    """Every executable called `name` on `path`, in order (a pyenv shim first may not work)."""
    out = []
    for entry in path.split(os.pathsep):
        candidate = os.path.join(entry or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            out.append(candidate)
    return out


def _gist(output: str, limit: int = 600) -> str:
    """The part of an installer's error output that says why: its error lines, else its last lines."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^(ERROR|error|cause|Caused by|×|╰─▶|Because|hint)", line)]
    text = " ".join(errors or lines[-3:]) or "no output"
    return text if len(text) <= limit else text[: limit - 1] + "…"
