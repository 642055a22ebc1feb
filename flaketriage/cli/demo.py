"""``flaketriage demo``: a small real project with one deterministic and one flaky failure.

It writes a NumPy training script over a generated dataset with one poisoned row (the loss goes
to Inf) and a pytest test that fails about 20% of the time, captures both failures with the real
CLI, triages them, and shows where the issue and the quarantine entry were written.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from flaketriage.cli.console import err, out
from flaketriage.dependencies import require
from flaketriage.errors import FlaketriageError
from flaketriage.process.git import Git

TRAIN_PY = '''\
"""Linear regression by gradient descent on data/train.csv."""
import argparse
import csv

import numpy as np


def load(path):
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    x = np.array([[float(r["x1"]), float(r["x2"])] for r in rows])
    y = np.array([float(r["y"]) for r in rows])
    return x, y


def train(x, y, steps, lr):
    w = np.zeros(x.shape[1])
    for step in range(steps):
        err = x @ w - y
        loss = float(np.mean(err**2))
        if not np.isfinite(loss):
            raise FloatingPointError(f"loss became {loss} at step {step}")
        w -= lr * 2 * x.T @ err / len(y)
        if step % 50 == 0:
            print(f"step={step} loss={loss:.6f}", flush=True)
    return w


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    with np.errstate(over="ignore", invalid="ignore"):
        w = train(*load("data/train.csv"), args.steps, args.lr)
    print("weights", w)


if __name__ == "__main__":
    main()
'''

TEST_FLAKY_PY = '''\
import random


def fetch_with_retry_budget():
    """Stands in for a call that times out now and then (unseeded randomness, like the network)."""
    return random.random()


def test_service_answers_in_time():
    latency = fetch_with_retry_budget()
    assert latency > 0.2, f"timed out: latency budget exceeded ({latency:.3f})"
'''


def _write_project(root: Path, rows: int = 400, poisoned: int = 137) -> None:
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text(TRAIN_PY)
    (root / "test_flaky.py").write_text(TEST_FLAKY_PY)
    (root / ".gitignore").write_text(".flaketriage/\n__pycache__/\n")
    rnd = random.Random(7)
    lines = ["x1,x2,y"]
    for i in range(rows):
        x1, x2 = rnd.uniform(-1, 1), rnd.uniform(-1, 1)
        y = 3 * x1 - 2 * x2 + rnd.gauss(0, 0.1)
        if i == poisoned:
            x1 = 1e200  # one corrupt record: its squared error overflows to inf
        lines.append(f"{x1:.6g},{x2:.6g},{y:.6g}")
    (root / "data" / "train.csv").write_text("\n".join(lines) + "\n")
    if shutil.which("git"):
        git = Git()
        author = ["-c", "user.name=flaketriage demo", "-c", "user.email=demo@example.invalid"]
        for args in (
            ["init", "-q"],
            ["add", "train.py", "test_flaky.py", ".gitignore"],
            ["commit", "-qm", "demo"],
        ):
            git.run([*author, *args], root)


def _flaketriage(
    root: Path, *args: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(extra_env or {}), "FLAKETRIAGE_STORE": str(root / ".flaketriage")}
    return subprocess.run(
        [sys.executable, "-m", "flaketriage", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def _last_json(proc: subprocess.CompletedProcess[str], what: str) -> dict[str, object]:
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            data: dict[str, object] = json.loads(line)
            return data
    raise FlaketriageError(f"{what} printed no JSON result:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def run_demo(keep: bool = True) -> Path:
    """Run the whole loop on a fresh demo project; return its path."""
    for module in ("numpy", "pytest"):
        require(module, "demo", "the demo")
    root = Path(tempfile.mkdtemp(prefix="flaketriage-demo-"))
    _write_project(root)
    out.print(f"[bold]demo project[/bold] {root}")

    out.print("1. capture the training run (one poisoned row drives the loss to inf)")
    cap = _flaketriage(
        root,
        "capture",
        "--json",
        "--data",
        "data/train.csv",
        "--",
        sys.executable,
        "train.py",
        "--steps",
        "200",
    )
    train_bundle = str(_last_json(cap, "capture")["bundle"])
    out.print(f"   captured bundle {train_bundle[:12]}")

    out.print("2. capture the flaky test (rerun until it fails once)")
    test_bundle = None
    for _attempt in range(60):
        cap = _flaketriage(
            root,
            "capture",
            "--json",
            "--",
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "test_flaky.py",
            # The test needs no plugin: those installed here (some take seconds to load) stay out
            # of its runs, and the capture records this for its replays (about 20 of them).
            extra_env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        )
        result = _last_json(cap, "capture")
        if result["bundle"]:
            test_bundle = str(result["bundle"])
            break
    if test_bundle is None:
        raise FlaketriageError("the flaky demo test never failed in 60 runs; run the demo again")
    out.print(f"   captured bundle {test_bundle[:12]}")

    out.print("3. triage the training failure, with minimization")
    tri = _last_json(_flaketriage(root, "triage", train_bundle, "--minimize", "--json"), "triage")
    _describe(tri)
    out.print("4. triage the flaky test")
    tri_flaky = _last_json(_flaketriage(root, "triage", test_bundle, "--json"), "triage")
    _describe(tri_flaky)

    out.print("\n[bold]where to look[/bold]")
    for tri_result in (tri, tri_flaky):
        report = tri_result["report"]
        assert isinstance(report, dict)
        if report["kind"] == "none":
            out.print(f"  no report for {str(tri_result['bundle'])[:12]} (verdict {tri_result['verdict']})")
        else:
            out.print(f"  {report['kind']}: {report['location']}")
    out.print(f"  bundles: flaketriage bundle list --store {root / '.flaketriage'}")
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return root


def _describe(result: dict[str, object]) -> None:
    rate = result["failure_rate"]
    assert isinstance(rate, dict)
    line = (
        f"   verdict [bold]{result['verdict']}[/bold] after {result['replays']} replays "
        f"(failure rate {rate['estimate']:.2f}, 95% interval {rate['low']:.2f}–{rate['high']:.2f})"
    )
    out.print(line)
    minimal = result.get("minimal")
    if isinstance(minimal, dict):
        for path, kept in minimal["data"].items():
            out.print(f"   minimized {path}: kept {kept['kept']} of {kept['of']} rows")
        for flag, change in minimal["args"].items():
            out.print(f"   minimized {flag}: {change['from']} → {change['to']}")
    if result.get("minimize_error"):
        err.print(f"   not minimized: {result['minimize_error']}")
