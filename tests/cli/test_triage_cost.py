"""``flaketriage triage`` says what a triage cost, and ``--budget`` caps it: what a person reads."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _captured(cli, tmp_path: Path) -> str:  # type: ignore[no-untyped-def]
    (tmp_path / "job.py").write_text(
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.05:\n    pass\n"
        "raise SystemExit('fatal: the job failed')\n"
    )
    done = cli("capture", "--json", "--", sys.executable, "job.py")
    return str(json.loads(done.stdout)["bundle"])


def test_triage_prints_its_cost_and_json_carries_it(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bundle = _captured(cli, tmp_path)
    done = cli("triage", bundle, "--sandbox", "process")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("deterministic: reproduced 5 of 5")
    (line,) = [x for x in done.stdout.splitlines() if x.strip().startswith("cost:")]
    assert "CPU s, 0 GPU s (no GPU given)" in line and "(5 runs: verdict 5)" in line
    data = json.loads(cli("triage", bundle, "--sandbox", "process", "--json").stdout)
    cost = data["cost"]
    assert cost["runs"] == 5 and cost["cpu_s"] >= 5 * 0.05 and cost["gpu_s"] == 0 and cost["gpus"] == 0
    assert cost["phases"]["verdict"]["runs"] == 5 and cost["budget_s"] is None


def test_a_spent_budget_prints_undecided_never_the_guess_as_the_verdict(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bundle = _captured(cli, tmp_path)
    done = cli("triage", bundle, "--sandbox", "process", "--budget", "0.01")
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith(
        "undecided (triage budget spent; best guess so far deterministic, nothing reported)"
    )
    assert "reproduced 1 of 1 replays" in first and "report (" not in done.stdout
    data = json.loads(
        cli(
            "triage", bundle, "--sandbox", "process", "--json", env={"FLAKETRIAGE_TRIAGE_BUDGET_S": "0.01"}
        ).stdout
    )
    assert data["decided"] is False and data["replays"] == 1 and data["report"]["kind"] == "none"
    assert data["cost"]["budget_s"] == 0.01 and data["cost"]["budget_spent"] is True
