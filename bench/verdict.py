"""Benchmark: replays per verdict for the sequential test, against a fixed-N policy with the same errors.

Run from the repository root: ``python bench/verdict.py`` (``--quick`` for fewer simulated failures).
Each simulated failure reproduces on a replay with a fixed probability and passes otherwise.
"To decide" counts replays until the verdict is certain; "seq replays" adds the replays a flaky
verdict spends narrowing its rate interval (``flaky_rate_replays``, 20 in all), which is what
triage runs by default and what the ratio is computed on. The fixed-N policy replays
N = ``fixed_n_replays(policy)`` times and then calls all-reproduced deterministic,
none-reproduced not reproduced, and anything mixed flaky.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

# Run as a script from a checkout, without installing the package first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flaketriage.workers.verdict import (
    Outcome,
    SequentialTest,
    Verdict,
    VerdictPolicy,
    fixed_n_replays,
)

RATES = (1.0, 0.5, 0.2, 0.05, 0.0)


def expected(rate: float) -> str:
    if rate >= 1.0:
        return "deterministic"
    return "not_reproduced" if rate <= 0.0 else "flaky"


def is_wrong(rate: float, verdict: Verdict) -> bool:
    """A wrong verdict in the sense the policy promises to bound."""
    if rate >= 1.0:
        return verdict is not Verdict.DETERMINISTIC
    if rate <= 0.0:
        return verdict is not Verdict.NOT_REPRODUCED
    return verdict in (Verdict.DETERMINISTIC, Verdict.NOT_REPRODUCED)


def sequential(rate: float, rng: random.Random, policy: VerdictPolicy) -> tuple[int, Verdict, int]:
    """Replays in all (with the flaky rate sampling), the verdict, and replays until the decision."""
    test = SequentialTest(policy)
    decided_at = 0
    while not test.done:
        test.add(Outcome.REPRODUCED if rng.random() < rate else Outcome.PASSED)
        if test.decided is not None and not decided_at:
            decided_at = test.replays
    return test.replays, test.result().verdict, decided_at or test.replays


def fixed(rate: float, rng: random.Random, n: int) -> Verdict:
    reproductions = sum(rng.random() < rate for _ in range(n))
    if reproductions == n:
        return Verdict.DETERMINISTIC
    return Verdict.NOT_REPRODUCED if reproductions == 0 else Verdict.FLAKY


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="500 failures per rate instead of 5,000")
    parser.add_argument("--seed", type=int, default=20240501)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    trials = 500 if args.quick else 5000
    policy = VerdictPolicy()
    n_fixed = fixed_n_replays(policy)

    print(
        f"\nPolicy: flaky rates {policy.min_rate}..{policy.max_rate}, alpha {policy.alpha}: deterministic "
        f"after {policy.deterministic_after} reproductions, not reproduced after "
        f"{policy.not_reproduced_after} replays; fixed N = {n_fixed}. {trials} simulated failures per rate.\n"
    )
    print(
        f"{'rate':>5} {'truth':>14} | {'to decide':>9} {'seq replays':>11} {'fixed N':>7} | {'seq wrong':>9} "
        f"{'fixed wrong':>11} | {'target':>6}"
    )
    print("-" * 88)
    seq_total = fixed_total = 0
    errors_ok = True
    for rate in RATES:
        runs = [sequential(rate, rng, policy) for _ in range(trials)]
        seq_replays = sum(replays for replays, _, _ in runs)
        to_decide = sum(at for _, _, at in runs) / trials
        seq_wrong = sum(is_wrong(rate, verdict) for _, verdict, _ in runs) / trials
        fixed_wrong = sum(is_wrong(rate, fixed(rate, rng, n_fixed)) for _ in range(trials)) / trials
        in_range = policy.min_rate <= rate <= policy.max_rate
        target = policy.alpha if in_range else 0.0
        # Three standard errors of slack, so sampling noise alone does not fail the run.
        errors_ok &= seq_wrong <= target + 3 * (target * (1 - target) / trials) ** 0.5
        seq_total += seq_replays
        fixed_total += trials * n_fixed
        print(
            f"{rate:>5.2f} {expected(rate):>14} | {to_decide:>9.1f} "
            f"{seq_replays / trials:>11.1f} {n_fixed:>7} | "
            f"{seq_wrong:>9.2%} {fixed_wrong:>11.2%} | {target:>6.0%}"
        )
    ratio = seq_total / fixed_total
    saved = 1 - ratio
    print("-" * 88)
    print(
        f"{'all':>5} {'(equal weight)':>14} | {'':>9} "
        f"{seq_total / (trials * len(RATES)):>11.1f} {n_fixed:>7} |"
        f"\n\nsequential / fixed replays: {ratio:.2f} ({saved:.0%} fewer; goal at least 50% fewer): "
        f"{'PASS' if saved >= 0.5 else 'FAIL'}"
    )
    print(f"error rates within target: {'PASS' if errors_ok else 'FAIL'}")
    return 0 if saved >= 0.5 and errors_ok else 1


if __name__ == "__main__":
    sys.exit(main())
