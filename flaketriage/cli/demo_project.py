"""The demo's project: a NumPy training script over a generated dataset with one poisoned row (the
loss goes to Inf) and a pytest test that fails about 20% of the time, committed to git."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

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


def write_project(root: Path, rows: int = 400, poisoned: int = 137) -> None:
    """Write the project into `root` (new) and commit it when git is installed."""
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
