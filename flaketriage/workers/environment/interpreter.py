"""What a replay's Python needs to see: its prefix, its ``sys.path`` and editable source trees.

A sandbox that gives the run a private /tmp and hides the original workspace must keep these
readable, or an interpreter installed under /tmp (or a virtualenv inside the project) cannot
start or import its packages. The interpreter itself is the only reliable source, so it is asked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

_PROBE = """
import json, sys, urllib.parse
paths = [sys.prefix, sys.base_prefix, sys.exec_prefix] + [p for p in sys.path if p]
try:
    import importlib.metadata as md
    for dist in md.distributions():
        raw = dist.read_text("direct_url.json")
        if raw:
            info = json.loads(raw)
            url = info.get("url", "")
            if info.get("dir_info", {}).get("editable") and url.startswith("file://"):
                paths.append(urllib.parse.unquote(url[len("file://"):]))
except Exception:
    pass
print(json.dumps(paths))
"""


def find_python(argv0: str, env: Mapping[str, str]) -> str | None:
    """The interpreter a command runs: `argv0` when it is Python, else ``python3`` on its PATH."""
    path = env.get("PATH")
    if Path(argv0).name.startswith("python"):
        return shutil.which(argv0, path=path)
    return shutil.which("python3", path=path) or shutil.which("python", path=path)


def interpreter_paths(argv0: str, env: Mapping[str, str], temp_root: Path) -> list[Path]:
    """Directories the command's Python reads at start-up and import time (empty if unknown).

    The interpreter is asked from a fresh directory under `temp_root`, in environment `env`.
    """
    python = find_python(argv0, env)
    if python is None:
        return []
    try:
        # Not the workspace: '' on sys.path is the cwd.
        with tempfile.TemporaryDirectory(prefix="flaketriage-probe-", dir=temp_root) as neutral:
            done = subprocess.run(
                [python, "-c", _PROBE],
                env=dict(env),
                cwd=neutral,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        found = json.loads(done.stdout) if done.returncode == 0 else []
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    out: list[Path] = []
    for raw in found:
        if isinstance(raw, str) and raw and os.path.exists(raw):
            path = Path(raw)
            if path not in out:
                out.append(path)
    return out
