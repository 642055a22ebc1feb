"""Benchmark: the pytest plugin's overhead on a passing suite of 2,000 tests (goal: at most 2% wall time).

Run from the repository root: ``python bench/pytest_plugin.py [--quick] [--rounds 11] [--max-rounds
41] [--tests 2000]``. Generates a passing suite in a temporary directory and times what a user runs,
``pytest -q -p no:cacheprovider --flaketriage`` (a whole process each time), against the same command
with the plugin not loaded at all (``-p no:flaketriage``), the baseline. Each round runs the
baseline, the plugin, and the baseline again (the A/A row: the same command against itself) in a
fresh random order, after one warm-up round. Each run is divided by the baseline run of its own
round; the median of those per-pair ratios is the figure, with its quartiles and range, and the A/A
ratios show the noise. Child CPU time is printed beside.

The goal is judged on wall time by the 95% confidence interval of the median ratio (distribution
free, from order statistics): met when its upper end is at most 1.02 (the overhead is at most 2%
with that confidence), missed when its lower end is above. While the interval straddles 1.02 the
machine's noise has not yet told, and rounds are added, ten at a time, up to ``--max-rounds``; a
figure still undecided then is a miss. Two identical runs that differ by 5% can thus neither pass
nor fail the goal by chance: the interval narrows with rounds, the noise does not. The A/A
interval must contain 1.0 (else the setup favours one side, and the run is a miss). Exits 1 on a
miss, or when the plugin wrote anything on a passing run.
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import check
from paired import Spread, interleave, noise_floor, overhead_text

GOAL = 1.02
PER_FILE = 50
BASE, PLUGIN, AA = "without plugin", "--flaketriage", "without plugin (A/A)"


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
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds first (11; --quick 5)")
    parser.add_argument(
        "--max-rounds", type=int, default=None, help="rounds at most while undecided (41; --quick: --rounds)"
    )
    parser.add_argument("--quick", action="store_true", help="5 rounds: a smoke run, noisier")
    parser.add_argument("--tests", type=int, default=2000)
    args = parser.parse_args()
    rounds = args.rounds or (5 if args.quick else 11)
    max_rounds = max(rounds, args.max_rounds or (rounds if args.quick else 41))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "PYTEST_"))}
    flags = {BASE: ["-p", "no:flaketriage"], PLUGIN: ["--flaketriage"], AA: ["-p", "no:flaketriage"]}
    with tempfile.TemporaryDirectory(prefix="flaketriage-bench-") as tmp:
        root = Path(tmp)
        write_suite(root, args.tests)
        variants = {name: functools.partial(run_once, root, extra, env) for name, extra in flags.items()}
        runs = interleave(variants, rounds)
        while _undecided(runs) and len(runs[BASE]) < max_rounds:
            more = interleave(variants, min(10, max_rounds - len(runs[BASE])), warmup=0, seed=len(runs[BASE]))
            for name, measured in more.items():
                runs[name].extend(measured)
        stored = list((root / ".flaketriage").glob("*")) if (root / ".flaketriage").exists() else []
    done = len(runs[BASE])
    wall = {name: [w for w, _ in measured] for name, measured in runs.items()}
    cpu = {name: [c for _, c in measured] for name, measured in runs.items()}
    ratios = {name: Spread.ratios(wall[name], wall[BASE]) for name in (PLUGIN, AA)}
    cpu_ratios = {name: Spread.ratios(cpu[name], cpu[BASE]) for name in (PLUGIN, AA)}
    noise = noise_floor(ratios[AA])
    cpu_noise = noise_floor(cpu_ratios[AA])

    print(f"\npassing suite of {args.tests} tests, {done} interleaved rounds (+1 warm-up), per-pair ratios\n")
    print(f"{'variant':<22} | {'wall s':>6} | {'wall ratio to the baseline':<46} | {'CPU ratio':<46}")
    print("-" * 130)
    print(f"{BASE:<22} | {statistics.median(wall[BASE]):>6.2f} | {'(baseline)':<46} | {'(baseline)':<46}")
    for name in (AA, PLUGIN):
        print(
            f"{name:<22} | {statistics.median(wall[name]):>6.2f} | {ratios[name].ratio_text():<46} | "
            f"{cpu_ratios[name].ratio_text():<46}"
        )
    low, high = ratios[PLUGIN].median_interval()
    aa_low, aa_high = ratios[AA].median_interval()
    print(
        f"\nA/A quartiles: wall ±{noise:.1%}, CPU ±{cpu_noise:.1%}. Plugin overhead: wall "
        f"{overhead_text(ratios[PLUGIN], noise)}, CPU {overhead_text(cpu_ratios[PLUGIN], cpu_noise)}.\n"
        f"95% interval of the median wall ratio: plugin {low:.3f}–{high:.3f}x, "
        f"A/A {aa_low:.3f}–{aa_high:.3f}x ({done} rounds).\n"
    )
    verdict = "at most" if high <= GOAL else ("above" if low > GOAL else "not decided within")
    ok = [
        check(
            f"--flaketriage wall time over {done} rounds, median ratio {ratios[PLUGIN].median:.3f}x, "
            f"{verdict} {GOAL:.2f}x with 95% confidence: upper end of its interval",
            f"{high:.3f}x",
            "<=",
            f"{GOAL:.2f}x",
            high <= GOAL,
        ),
        check(
            f"A/A interval {aa_low:.3f}–{aa_high:.3f}x holds 1.0 (no side favoured): its distance from 1.0",
            f"{max(0.0, aa_low - 1.0, 1.0 - aa_high):.3f}",
            "==",
            "0.000",
            aa_low <= 1.0 <= aa_high,
        ),
        check("files written by the plugin on a passing run", f"{len(stored)}", "==", "0", not stored),
    ]
    return 0 if all(ok) else 1


def _undecided(runs: dict[str, list[tuple[float, float]]]) -> bool:
    """Whether the plugin's median wall ratio still straddles the goal at 95% confidence."""
    wall = {name: [w for w, _ in measured] for name, measured in runs.items()}
    low, high = Spread.ratios(wall[PLUGIN], wall[BASE]).median_interval()
    return low <= GOAL < high


if __name__ == "__main__":
    sys.exit(main())
