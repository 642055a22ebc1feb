"""The whole loop on real programs: capture → replay → verdict → minimize → report, via the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

TRAIN = """
import argparse, csv, math, sys
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=50)
args = parser.parse_args()
rows = list(csv.DictReader(open("data/train.csv")))
w = 0.0
for step in range(args.steps):
    loss = 0.0
    for r in rows:
        x, y = float(r["x"]), float(r["y"])
        loss += (w * x - y) ** 2
    loss /= len(rows)
    if math.isinf(loss) or math.isnan(loss):
        raise FloatingPointError(f"loss became {loss} at step {step}")
    print(f"step={step} loss={loss}")
    w += 0.001
"""


def _dataset(project: Any, n: int, poisoned: dict[int, str]) -> None:
    lines = ["id,x,y"]
    for i in range(n):
        lines.append(f"{i},{poisoned.get(i, str(i % 7 / 7))},{(i % 5) / 5}")
    project.write("data/train.csv", "\n".join(lines) + "\n")


def test_poisoned_row_is_minimized_to_the_single_culprit(project: Any, py: str) -> None:
    project.write("train.py", TRAIN)
    _dataset(project, 300, {211: "1e300"})
    project.git_init()
    cap = project.run_json("capture", "--data", "data/train.csv", "--", py, "train.py", "--steps", "40")
    assert cap["_exit"] == 1 and cap["bundle"], cap["_stderr"]
    out = project.run_json("triage", cap["bundle"], "--minimize")
    assert out["verdict"] == "deterministic", out
    assert out["replays"] == 5 and out["failures"] == 5
    assert out["minimal"]["data"] == {"data/train.csv": {"kept": 1, "of": 300}}
    # at step 0 the weight is still 0, so the overflow needs a second step
    assert out["minimal"]["args"] == {"--steps": {"from": "40", "to": "2"}}
    minimal = out["minimal_bundle"]
    export = project.root.parent / "repro"
    exported = project.run("bundle", "export", minimal, str(export))
    assert exported.returncode == 0, exported.stderr
    rows = (export / "workspace" / "data" / "train.csv").read_text().splitlines()
    assert rows == ["id,x,y", "211,1e300,0.2"]
    report = Path(out["report"]["location"])
    assert report.is_file() and "OverflowError" in report.read_text()  # pure-Python floats raise
    # The same failure again updates the issue instead of opening a second one.
    again = project.run_json("triage", cap["bundle"])
    assert again["report"]["location"] == out["report"]["location"]
    assert len(list(report.parent.glob("*.md"))) == 1


def test_two_interacting_rows_are_both_kept(project: Any, py: str) -> None:
    project.write(
        "load.py",
        """
import csv
seen = {}
for row in csv.DictReader(open("data/users.csv")):
    if row["email"] in seen:
        raise ValueError(f"duplicate email {row['email']} in rows {seen[row['email']]} and {row['id']}")
    seen[row["email"]] = row["id"]
print("loaded", len(seen))
""",
    )
    lines = ["id,email"] + [f"{i},user{i}@example.com" for i in range(200)]
    lines[1 + 150] = "150,user33@example.com"
    project.write("data/users.csv", "\n".join(lines) + "\n")
    cap = project.run_json("capture", "--data", "data/users.csv", "--", py, "load.py")
    assert cap["bundle"], cap["_stderr"]
    out = project.run_json("triage", cap["bundle"], "--minimize")
    assert out["verdict"] == "deterministic"
    assert out["minimal"]["data"]["data/users.csv"] == {"kept": 2, "of": 200}
    manifest = json.loads(project.run("bundle", "show", out["minimal_bundle"], "--json").stdout)
    assert manifest["parent"] == cap["bundle"]


def test_hash_seed_dependent_failure_replays_deterministically(project: Any, py: str) -> None:
    project.write(
        "order.py",
        """
tags = {"alpha", "beta", "gamma", "delta"}
first = next(iter(tags))
assert first != "alpha", f"set order put {first} first"
print("ok", first)
""",
    )
    cap = project.capture_until_failure("--", py, "order.py")
    out = project.run_json("triage", cap["bundle"])
    assert out["verdict"] == "deterministic", out
    show = project.run("bundle", "show", cap["bundle"])
    assert "PYTHONHASHSEED=" in show.stdout and "(chosen)" in show.stdout


def test_flaky_failure_is_classified_flaky_and_quarantined(project: Any, py: str) -> None:
    project.write(
        "flaky.py",
        """
import random
value = random.random()
assert value > 0.35, f"unlucky draw {value:.4f}"
""",
    )
    cap = project.capture_until_failure("--", py, "flaky.py")
    # It fails 35% of the time. With max_flaky_rate 0.9, "deterministic" needs 29 reproductions in
    # a row (0.35**29 ≈ 6e-14), so the test cannot flake on the 0.35**5 ≈ 0.5% the default allows.
    out = project.run_json("triage", cap["bundle"], env={"FLAKETRIAGE_MAX_FLAKY_RATE": "0.9"})
    assert out["verdict"] == "flaky", out
    rate = out["failure_rate"]
    assert 0 < rate["low"] <= rate["estimate"] <= rate["high"] < 1
    assert out["report"]["kind"] == "quarantine"
    entries = json.loads(Path(out["report"]["location"]).read_text())["entries"]
    assert cap["fingerprint"] in entries


def test_a_different_failure_is_never_a_reproduction(project: Any, py: str) -> None:
    project.write(
        "env_dependent.py",
        """
import os
if os.environ.get("FLAKETRIAGE_REPLAY"):
    raise KeyError("config missing on the replay side")
raise RuntimeError("original failure")
""",
    )
    cap = project.run_json("capture", "--", py, "env_dependent.py")
    out = project.run_json("triage", cap["bundle"])
    assert out["verdict"] == "different_failure"
    assert out["failures"] == 0
    assert out["findings"] and "KeyError" in out["findings"][0]["summary"]


def test_not_reproduced(project: Any, py: str) -> None:
    project.write("once.py", "import os, sys\nsys.exit(0 if os.environ.get('FLAKETRIAGE_REPLAY') else 4)\n")
    cap = project.run_json("capture", "--", py, "once.py")
    assert cap["_exit"] == 4
    out = project.run_json("triage", cap["bundle"], "--sandbox", "process")
    assert out["verdict"] == "not_reproduced"
    assert out["replays"] == 59 and out["failures"] == 0
