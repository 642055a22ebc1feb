"""The README's first command: `flaketriage demo` runs the whole loop on its own project."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_demo_captures_triages_and_reports_both_failures() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "flaketriage", "demo"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "verdict deterministic after 5 replays" in out
    assert "minimized data/train.csv: kept 1 of 400 rows" in out
    assert re.search(r"verdict flaky after \d+ replays", out)
    issue = Path(re.search(r"markdown: (\S+\.md)", out).group(1))  # type: ignore[union-attr]
    quarantine = Path(re.search(r"quarantine: (\S+\.json)", out).group(1))  # type: ignore[union-attr]
    assert "FloatingPointError" in issue.read_text()
    entries = json.loads(quarantine.read_text())["entries"]
    assert len(entries) == 1
    assert "test_flaky.py" in json.dumps(entries)
