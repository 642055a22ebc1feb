"""Benchmark: the pytest plugin's overhead on a passing suite of 2,000 tests (goal: at most 2% wall time).

Run from the repository root: ``python bench/pytest_plugin.py [--runs 11] [--tests 2000]``.
Generates a passing suite in a temporary directory and times ``pytest -q -p no:cacheprovider`` with
``--flaketriage`` against the same command with the plugin not loaded at all (``-p no:flaketriage``),
the two interleaved run by run after one warm-up each, so drifts in machine load hit both alike.
Prints medians side by side (wall time, and the child's CPU time, which is steadier on a busy
machine), their ratio, and the median ratio of adjacent runs.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL = 1.02
PER_FILE = 50


def write_suite(root: Path, tests: int) -> None:
    for f in range((tests + PER_FILE - 1) // PER_FILE):
        count = min(PER_FILE, tests - f * PER_FILE)
        body = ["import math", ""]
        for i in range(count):
            body += [f"def test_{i}():", f"    assert math.isfinite({i} * 0.5)", ""]
        (root / f"test_suite_{f:03d}.py").write_text("\n".join(body))


def run_once(root: Path, args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and child CPU seconds of one pytest run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"the suite did not pass ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=11, help="timed runs of each variant")
    parser.add_argument("--tests", type=int, default=2000)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "PYTEST_"))}
    variants = {"without": ["-p", "no:flaketriage"], "with": ["--flaketriage"]}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="flaketriage-bench-") as tmp:
        root = Path(tmp)
        write_suite(root, args.tests)
        for extra in variants.values():  # warm-up: bytecode caches, the page cache
            run_once(root, extra, env)
        for i in range(args.runs):
            # Alternate which variant goes first, so neither always follows the other.
            order = list(variants.items()) if i % 2 == 0 else list(reversed(variants.items()))
            for name, extra in order:
                times[name].append(run_once(root, extra, env))
        stored = list((root / ".flaketriage").glob("*")) if (root / ".flaketriage").exists() else []
    wall = {name: statistics.median(t[0] for t in runs) for name, runs in times.items()}
    cpu = {name: statistics.median(t[1] for t in runs) for name, runs in times.items()}
    ratio = wall["with"] / wall["without"]
    # Each run against the one beside it: drifts in load cancel out within a pair.
    paired = statistics.median(w[0] / wo[0] for w, wo in zip(times["with"], times["without"], strict=True))
    print(f"\npassing suite of {args.tests} tests, {args.runs} interleaved runs each (medians)\n")
    print(f"{'':>22} | {'without plugin':>14} | {'--flaketriage':>13} | {'ratio':>5}")
    print("-" * 64)
    print(f"{'wall time (s)':>22} | {wall['without']:>14.3f} | {wall['with']:>13.3f} | {ratio:>5.3f}")
    print(
        f"{'CPU time (s)':>22} | {cpu['without']:>14.3f} | {cpu['with']:>13.3f} | "
        f"{cpu['with'] / cpu['without']:>5.3f}"
    )
    print(f"{'wall, paired runs':>22} | {'':>14} | {'':>13} | {paired:>5.3f}")
    ok = ratio <= GOAL and not stored
    print(f"\noverhead within {GOAL:.2f}x wall time (and nothing written): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
