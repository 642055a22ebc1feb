"""Benchmark: predicate calls the SubsetReducer needs to find culprits, against plain ddmin.

Run from the repository root: ``python bench/minimize.py`` (``--quick`` for fewer culprit positions).
Every call of the predicate is a replay in real use, so calls are the cost that matters; wall time
is printed only to show the benchmark itself is cheap.
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

from flaketriage.workers.subset_reducer import SubsetReducer, ddmin

SIZES = (1_000, 10_000, 100_000)
Predicate = Callable[[Sequence[int]], bool]
HEADER = f"{'n':>8} | {'SubsetReducer mean':>12} {'max':>4} | {'ddmin mean':>10} {'max':>4}"


def goal(n: int) -> float:
    return 2 * math.log2(n) + 10


def needs_all(culprits: Sequence[int]) -> Predicate:
    """Fails only when every culprit is present: they interact."""
    return lambda subset: all(c in subset for c in culprits)


def measure(n: int, culprit_sets: list[list[int]]) -> tuple[list[int], list[int], float, float]:
    """Calls per culprit set for the SubsetReducer and for ddmin, and their total seconds."""
    ours: list[int] = []
    theirs: list[int] = []
    ours_s = theirs_s = 0.0
    items = range(n)
    for culprits in culprit_sets:
        predicate = needs_all(culprits)
        start = time.perf_counter()
        reducer = SubsetReducer(predicate)
        found = reducer.reduce(items)
        ours_s += time.perf_counter() - start
        assert found == sorted(culprits), (found, culprits)
        ours.append(reducer.calls)
        start = time.perf_counter()
        found, calls = ddmin(items, predicate)
        theirs_s += time.perf_counter() - start
        assert found == sorted(culprits), (found, culprits)
        theirs.append(calls)
    return ours, theirs, ours_s, theirs_s


def mean(values: list[int]) -> float:
    return sum(values) / len(values)


def single_culprit(rng: random.Random, positions: int) -> bool:
    print(f"\nOne culprit among n items ({positions} random positions each; goal: 2*log2(n)+10 calls)\n")
    print(f"{HEADER} | {'goal':>5} | result")
    print("-" * 70)
    passed = True
    for n in SIZES:
        ours, theirs, _, _ = measure(n, [[rng.randrange(n)] for _ in range(positions)])
        ok = max(ours) <= goal(n)
        passed &= ok
        print(
            f"{n:>8} | {mean(ours):>12.1f} {max(ours):>4} | {mean(theirs):>10.1f} {max(theirs):>4} | "
            f"{goal(n):>5.1f} | {'PASS' if ok else 'FAIL'}"
        )
    return passed


def interacting_culprits(rng: random.Random, positions: int, k: int) -> bool:
    print(f"\n{k} interacting culprits (fails only with all {k} present; {positions} random sets each)\n")
    print(f"{HEADER} | {'ratio':>5} | seconds")
    print("-" * 76)
    passed = True
    for n in SIZES:
        ours, theirs, ours_s, theirs_s = measure(n, [rng.sample(range(n), k) for _ in range(positions)])
        ratio = mean(ours) / mean(theirs)
        passed &= ratio < 1
        print(
            f"{n:>8} | {mean(ours):>12.1f} {max(ours):>4} | {mean(theirs):>10.1f} {max(theirs):>4} | "
            f"{ratio:>5.2f} | {ours_s:.2f} vs {theirs_s:.2f}"
        )
    return passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="5 positions per size instead of 30")
    parser.add_argument("--seed", type=int, default=20240501)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    positions = 5 if args.quick else 30
    single = single_culprit(rng, positions)
    pairs = interacting_culprits(rng, positions, 2)
    triples = interacting_culprits(rng, positions, 3)
    print(f"\nsingle culprit within goal: {'PASS' if single else 'FAIL'}")
    print(f"interacting culprits cheaper than ddmin: {'PASS' if pairs and triples else 'FAIL'}")
    return 0 if single and pairs and triples else 1


if __name__ == "__main__":
    sys.exit(main())
