"""Benchmark: oracle runs the polluter search needs to find the test a victim fails after, against ddmin.

Run from the repository root: ``python bench/polluters.py`` (``--quick`` for fewer positions).
The oracle is simulated (the victim fails when the polluter ran before it, in any subset), because
in real use each call is one ``pytest PRE... NODEID`` replay and the number of calls is the cost.
``find_polluters`` is what ``flaketriage triage`` runs: the full order is known to fail and the victim
alone known to pass, so neither is counted, for either method. Goal for one polluter among n
preceding tests: at most 2·log2(n) + 5 oracle runs.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# Run as a script from a checkout, without installing the package first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import check

from flaketriage.workers.minimize.reducer import ddmin
from flaketriage.workers.polluters import find_polluters

SIZES = (10, 100, 1_000)
Oracle = Callable[[Sequence[str]], bool]


def goal(n: int) -> float:
    return 2 * math.log2(n) + 5


def after_all(polluters: Sequence[str]) -> Oracle:
    """The victim fails when every polluter ran before it."""
    return lambda tests: all(p in tests for p in polluters)


def measure(n: int, polluter_sets: list[list[int]]) -> tuple[list[int], list[int], float]:
    tests = [f"tests/test_mod{i // 10}.py::test_{i}" for i in range(n)]
    ours: list[int] = []
    theirs: list[int] = []
    seconds = 0.0
    for chosen in polluter_sets:
        polluters = [tests[i] for i in sorted(chosen)]
        oracle = after_all(polluters)
        start = time.perf_counter()
        found, calls = find_polluters(tests, oracle)
        seconds += time.perf_counter() - start
        assert found == polluters, (found, polluters)
        ours.append(calls)
        found, calls = ddmin(tests, oracle)
        assert found == polluters, (found, polluters)
        theirs.append(calls)
    return ours, theirs, seconds


def mean(values: list[int]) -> float:
    return sum(values) / len(values)


def table(rng: random.Random, positions: int, k: int) -> bool:
    what = "one polluter" if k == 1 else f"{k} polluters needed together"
    print(f"\n{what} among n preceding tests ({positions} random positions each)\n")
    print(
        f"{'n':>6} | {'search mean':>11} {'max':>4} | {'ddmin mean':>10} {'max':>4} | "
        f"{'goal':>5} | {'result':>6} | seconds"
    )
    print("-" * 72)
    goals = []
    for n in SIZES:
        ours, theirs, seconds = measure(n, [rng.sample(range(n), k) for _ in range(positions)])
        ok = max(ours) <= goal(n) if k == 1 else mean(ours) <= mean(theirs)
        if k == 1:
            goals.append(
                (f"one polluter among n={n:,}: max oracle runs", f"{max(ours)}", f"{goal(n):.1f}", ok)
            )
        else:
            goals.append(
                (
                    f"{k} polluters among n={n:,}: mean oracle runs",
                    f"{mean(ours):.1f}",
                    f"ddmin's {mean(theirs):.1f}",
                    ok,
                )
            )
        target = f"{goal(n):>5.1f}" if k == 1 else "<ddm"
        print(
            f"{n:>6} | {mean(ours):>11.1f} {max(ours):>4} | {mean(theirs):>10.1f} {max(theirs):>4} | "
            f"{target:>5} | {'ok' if ok else 'MISSED':>6} | {seconds:.3f}"
        )
    print()
    return all([check(what, figure, "<=", target, ok) for what, figure, target, ok in goals])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="5 positions per size instead of 50")
    parser.add_argument("--seed", type=int, default=20240601)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    positions = 5 if args.quick else 50
    single = table(rng, positions, 1)
    pair = table(rng, positions, 2)
    return 0 if single and pair else 1


if __name__ == "__main__":
    sys.exit(main())
