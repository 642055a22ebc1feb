"""Benchmark: how often the sequential test's verdict is wrong, and how many replays it costs against
a fixed-N policy with the same guarantees.

Run from the repository root: ``python bench/verdict.py`` (``--quick``: 100,000 simulated failures
per row instead of 1,000,000). Needs numpy.

Every state the real `SequentialTest` (default `VerdictPolicy`) can reach is enumerated once by
feeding outcomes to copies of it, so the rules measured are the product's own. Two things are
computed from that chain for each scenario (a failure that reproduces, passes or fails differently
with fixed probabilities on each replay):

* **exact**: the probability of each verdict and the expected replays, by dynamic programming over
  the states (the probability mass flows replay by replay until every path has stopped);
* **simulated**: that many failures replayed at random through the same chain (numpy, vectorized).

The simulated figure is printed with the exact one beside it, and a goal counts as met when the
exact value meets it and the simulation agrees (within 5 standard errors). Goals: a deterministic
failure called anything but deterministic at most 1%, also when 1% of its replays fail in an
unrelated way; a flaky failure at any rate in [5%, 50%] called deterministic or not reproduced at
most 5% (the exact maximum over that whole range is printed too); a flaky failure at 90% that is
called deterministic reports its rate with the Clopper–Pearson interval (checked against the
binomial tails directly, for every final state); and at least 50% fewer replays than
``fixed_n_replays(policy)`` at every failure rate, row by row. Exits 1 on any miss.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Run as a script from a checkout, without installing the package first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import check

from flaketriage.workers.verdict import (
    Outcome,
    SequentialTest,
    Verdict,
    VerdictPolicy,
    fixed_n_replays,
)

OUTCOMES = (Outcome.REPRODUCED, Outcome.PASSED, Outcome.DIFFERENT)
VERDICTS = tuple(Verdict)
FLAKY_RATES = (0.05, 0.1, 0.2, 0.3, 0.5)
REPLAY_RATES = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)
DETERMINISTIC_GOAL = 0.01
SAVING_GOAL = 0.5
AGREE_SE = 5.0


@dataclass
class Chain:
    """The reachable states of a `SequentialTest` under the outcomes with nonzero probability.

    States are keyed by their counts (reproductions, passes, different): the rules decide from the
    counts alone, which `build` checks on every state reached twice."""

    tests: list[SequentialTest]
    next: np.ndarray  # (states, outcomes): the state after each outcome; -1 where none
    done: np.ndarray
    decided: np.ndarray
    verdict: np.ndarray  # index into VERDICTS of `result().verdict`
    replays: np.ndarray

    @classmethod
    def for_outcomes(cls, policy: VerdictPolicy, probs: tuple[float, float, float]) -> Chain:
        """The chain for the outcomes `probs` makes possible (built once per set of outcomes)."""
        support = tuple(p > 0.0 for p in probs)
        key = (policy, support)
        if key not in _CHAINS:
            _CHAINS[key] = cls.build(policy, support)
        return _CHAINS[key]

    @classmethod
    def build(cls, policy: VerdictPolicy, support: tuple[bool, ...]) -> Chain:
        start = SequentialTest(policy)
        tests = [start]
        index = {(0, 0, 0): 0}
        edges: list[list[int]] = []
        i = 0
        while i < len(tests):
            test = tests[i]
            row = [-1, -1, -1]
            if not test.done:
                for j, (outcome, possible) in enumerate(zip(OUTCOMES, support, strict=True)):
                    if not possible:
                        continue
                    child = copy.copy(test)
                    child.add(outcome)
                    key = (child.reproductions, child.passes, child.different)
                    if key not in index:
                        index[key] = len(tests)
                        tests.append(child)
                    elif tests[index[key]].decided != child.decided:
                        raise SystemExit(f"the verdict at {key} depends on the order of the outcomes")
                    row[j] = index[key]
            edges.append(row)
            i += 1
        return cls(
            tests=tests,
            next=np.array(edges, dtype=np.int64),
            done=np.array([t.done for t in tests]),
            decided=np.array([t.decided is not None for t in tests]),
            verdict=np.array([VERDICTS.index(_verdict(t)) for t in tests]),
            replays=np.array([t.replays for t in tests]),
        )

    def exact(self, probs: tuple[float, float, float]) -> tuple[np.ndarray, float]:
        """The probability of stopping in each state, and the expected replays until the decision."""
        mass = np.zeros(len(self.tests))
        mass[0] = 1.0
        to_decide = 0.0
        for step in range(int(self.replays.max()) + 1):
            active = np.flatnonzero((self.replays == step) & ~self.done & (mass > 0))
            for j, p in enumerate(probs):
                if p <= 0.0 or not len(active):
                    continue
                targets = self.next[active, j]
                flow = mass[active] * p
                np.add.at(mass, targets, flow)
                first = self.decided[targets] & ~self.decided[active]
                to_decide += float((flow[first] * self.replays[targets[first]]).sum())
            mass[active] = 0.0
        # A path that stops undecided (at max_replays) decides there, as its best guess.
        undecided_end = self.done & ~self.decided
        to_decide += float((mass[undecided_end] * self.replays[undecided_end]).sum())
        return mass, to_decide

    def simulate(
        self, probs: tuple[float, float, float], trials: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """The final state of each of `trials` random failures, and the replays until its decision."""
        cumulative = np.cumsum(probs)
        state = np.zeros(trials, dtype=np.int64)
        decided_at = np.zeros(trials, dtype=np.int64)
        while True:
            active = np.flatnonzero(~self.done[state])
            if not len(active):
                break
            outcome = np.minimum(np.searchsorted(cumulative, rng.random(len(active)), side="right"), 2)
            state[active] = self.next[state[active], outcome]
            newly = active[self.decided[state[active]] & (decided_at[active] == 0)]
            decided_at[newly] = self.replays[state[newly]]
        undecided = decided_at == 0
        decided_at[undecided] = self.replays[state[undecided]]
        return state, decided_at


_CHAINS: dict[tuple[VerdictPolicy, tuple[bool, ...]], Chain] = {}


def _verdict(test: SequentialTest) -> Verdict:
    """`result().verdict`, without computing the rate interval where the decision already says it."""
    return test.decided if test.decided is not None else test.result().verdict


def agrees(simulated: float, exact: float, trials: int) -> bool:
    """Within `AGREE_SE` standard errors (and one trial's worth, for probabilities near 0)."""
    return abs(simulated - exact) <= AGREE_SE * math.sqrt(exact * (1 - exact) / trials) + 1 / trials


def binomial_tail(k: int, n: int, p: float, *, upper: bool) -> float:
    """P(X >= k) (upper) or P(X <= k), X ~ Binomial(n, p), summed term by term."""
    terms = range(k, n + 1) if upper else range(0, k + 1)
    return math.fsum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in terms)


def interval_problems(test: SequentialTest) -> list[str]:
    """Where `result().rate` is not the Clopper–Pearson interval: each end must put exactly
    (1 - confidence)/2 in its tail (or sit at 0 / 1 when there is no tail)."""
    result = test.result()
    k, n = result.reproductions, result.reproductions + result.passes
    tail = (1 - test.policy.confidence) / 2
    low, high = result.rate.low, result.rate.high
    wrong = []
    if (k == 0 and low != 0.0) or (k > 0 and abs(binomial_tail(k, n, low, upper=True) - tail) > 1e-9):
        wrong.append(f"{k}/{n}: low {low}")
    if (k == n and high != 1.0) or (k < n and abs(binomial_tail(k, n, high, upper=False) - tail) > 1e-9):
        wrong.append(f"{k}/{n}: high {high}")
    return wrong


def percent(p: float) -> str:
    """A probability as a percentage, or in scientific notation when it is too small to show so."""
    return f"{p:.2e}" if 0 < p < 5e-5 else f"{p:.4%}"


def flaky(rate: float, different: float = 0.0) -> tuple[float, float, float]:
    return (rate * (1 - different), (1 - rate) * (1 - different), different)


def errors(policy: VerdictPolicy, trials: int, rng: np.random.Generator) -> bool:
    deterministic = Verdict.DETERMINISTIC
    missed = (Verdict.DETERMINISTIC, Verdict.NOT_REPRODUCED)
    scenarios = [
        ("deterministic", (1.0, 0.0, 0.0), lambda v: v is not deterministic, DETERMINISTIC_GOAL),
        (
            "deterministic, 1% different",
            (0.99, 0.0, 0.01),
            lambda v: v is not deterministic,
            DETERMINISTIC_GOAL,
        ),
        *[(f"flaky {r:.0%}", flaky(r), lambda v: v in missed, policy.alpha) for r in FLAKY_RATES],
        ("flaky 5%, 1% different", flaky(0.05, 0.01), lambda v: v in missed, policy.alpha),
    ]
    print(f"\nWrong verdicts: {trials:,} simulated failures per row, exact value beside\n")
    header = (
        f"{'failure':<28} {'wrong means':<31} | {'simulated':>9} {'exact':>9} | {'goal':>6} | "
        f"{'called flaky':>12} | ok"
    )
    print(header)
    print("-" * len(header))
    goals = []
    for name, probs, wrong, goal in scenarios:
        chain = Chain.for_outcomes(policy, probs)
        mass, _ = chain.exact(probs)
        state, _ = chain.simulate(probs, trials, rng)
        bad = np.array([wrong(v) for v in VERDICTS])
        exact = float(mass[bad[chain.verdict]].sum())
        simulated = float(bad[chain.verdict[state]].mean())
        flaky_index = VERDICTS.index(Verdict.FLAKY)
        called_flaky = float((chain.verdict[state] == flaky_index).mean())
        meaning = "not deterministic" if goal == DETERMINISTIC_GOAL else "deterministic or not reproduced"
        ok = exact <= goal and agrees(simulated, exact, trials)
        print(
            f"{name:<28} {meaning:<31} | {percent(simulated):>9} {percent(exact):>9} | {goal:>6.0%} | "
            f"{called_flaky:>12.2%} | {'ok' if ok else 'MISSED'}"
        )
        goals.append((name, meaning, simulated, exact, goal, ok))

    # The worst flaky rate: exact, over the whole promised range in steps of 0.1%, and the dynamic
    # programming checked against the closed form p^5 + (1 - p)^59 (no different failures) at each.
    worst_rate, worst, off = 0.0, 0.0, 0.0
    bad = np.array([v in missed for v in VERDICTS])
    for rate in np.round(np.arange(policy.min_rate, policy.max_rate + 1e-9, 0.001), 6):
        probs = flaky(float(rate))
        chain = Chain.for_outcomes(policy, probs)
        mass, _ = chain.exact(probs)
        p = float(mass[bad[chain.verdict]].sum())
        closed = rate**policy.deterministic_after + (1 - rate) ** policy.not_reproduced_after
        off = max(off, abs(p - closed))
        if p > worst:
            worst_rate, worst = float(rate), p
    print(
        f"\nexact worst case over every flaky rate in [{policy.min_rate:.0%}, {policy.max_rate:.0%}] "
        f"(steps of 0.1%): {worst:.4%} at {worst_rate:.1%}; the dynamic programming is within {off:.0e} of"
        f"\nthe closed form p^{policy.deterministic_after} + (1 - p)^{policy.not_reproduced_after} "
        "at every one of those rates.\n"
    )
    results = [
        check(f"{name}: called {meaning}", f"{percent(sim)} (exact {percent(ex)})", "<=", f"{goal:.0%}", ok)
        for name, meaning, sim, ex, goal, ok in goals
    ]
    results.append(
        check(
            "flaky, worst rate in [5%, 50%]: called deterministic or not reproduced (exact)",
            f"{worst:.3%} at {worst_rate:.1%}",
            "<=",
            f"{policy.alpha:.0%}",
            worst <= policy.alpha,
        )
    )
    results.append(
        check(
            "dynamic programming against the closed form: largest difference",
            f"{off:.0e}",
            "<=",
            "1e-12",
            off <= 1e-12,
        )
    )
    return all(results)


def rate_intervals(chain: Chain) -> tuple[np.ndarray, np.ndarray, dict[tuple[int, int], SequentialTest]]:
    """The low and high end of the rate interval `result()` reports in each final state (NaN
    elsewhere), and one final state per (reproductions, replays counted): the interval depends on
    nothing else, so that is what the Clopper–Pearson check needs."""
    lows = np.full(len(chain.tests), np.nan)
    highs = np.full(len(chain.tests), np.nan)
    seen: dict[tuple[int, int], SequentialTest] = {}
    rates: dict[tuple[int, int], tuple[float, float]] = {}
    for i in np.flatnonzero(chain.done):
        test = chain.tests[i]
        key = (test.reproductions, test.informative)
        if key not in rates:
            rate = test.result().rate
            rates[key], seen[key] = (rate.low, rate.high), test
        lows[i], highs[i] = rates[key]
    return lows, highs, seen


def intervals(policy: VerdictPolicy, trials: int, rng: np.random.Generator) -> bool:
    """A 90% flake called deterministic: how often, and what rate interval its verdict reports."""
    rate = 0.9
    probs = flaky(rate)
    chain = Chain.for_outcomes(policy, probs)
    mass, _ = chain.exact(probs)
    state, _ = chain.simulate(probs, trials, rng)
    det = VERDICTS.index(Verdict.DETERMINISTIC)
    called = chain.verdict[state] == det
    share = float(called.mean())
    exact = float(mass[chain.verdict == det].sum())
    lows, highs, _ = rate_intervals(chain)
    widths = (highs - lows)[state[called]]
    holds = float(((lows <= rate) & (rate <= highs))[state[called]].mean())
    all_widths = (highs - lows)[state]
    # Every final count any chain here reaches: with different failures set aside too.
    checked: dict[tuple[int, int], SequentialTest] = {}
    for support in (flaky(0.5), flaky(0.5, 0.01), (0.99, 0.0, 0.01)):
        checked.update(rate_intervals(Chain.for_outcomes(policy, support))[2])
    problems = [p for t in checked.values() for p in interval_problems(t)]
    sample = chain.tests[int(state[called][0])].result().rate
    print(
        f"Flaky at {rate:.0%}: called deterministic in {share:.2%} of {trials:,} (exact {exact:.2%}, "
        f"= {rate}^{policy.deterministic_after}).\n"
        f"  Each such verdict reports {sample.estimate:.2f} with the 95% interval "
        f"{sample.low:.2f}–{sample.high:.2f} (median width {np.median(widths):.2f}), which holds the true "
        f"rate in {holds:.0%} of them;\n  over all verdicts at {rate:.0%} the median width is "
        f"{np.median(all_widths):.2f} (a flaky verdict samples {policy.flaky_rate_replays} replays).\n"
        f"  Clopper–Pearson check (each end puts exactly 2.5% in its binomial tail) on all "
        f"{len(checked)} final (reproductions, replays) counts: {len(problems)} mismatches.\n"
    )
    for text in problems[:5]:
        print(f"  problem: {text}")
    return all(
        [
            check(
                f"flaky {rate:.0%} called deterministic ({share:.1%}, exact {exact:.1%}): "
                "its interval holds the true rate",
                f"{holds:.1%} (median width {np.median(widths):.2f})",
                "==",
                "100%",
                holds == 1.0 and agrees(share, exact, trials),
            ),
            check("rate intervals that are not Clopper–Pearson", f"{len(problems)}", "==", "0", not problems),
        ]
    )


def replays(policy: VerdictPolicy, trials: int, rng: np.random.Generator) -> bool:
    fixed = fixed_n_replays(policy)
    print(
        f"Replays per verdict against a fixed-N policy with the same guarantees (N = {fixed}: "
        f"fixed_n_replays), {trials:,} simulated failures per rate.\n"
        f"'to decide' stops at the verdict; 'replays' adds the rate sampling of a flaky verdict (to "
        f"{policy.flaky_rate_replays} in all), which triage runs and the saving is computed on.\n"
    )
    header = (
        f"{'rate':>5} | {'most common verdict':<22} | {'to decide':>9} | {'replays':>7} {'exact':>7} | "
        f"{'fixed N':>7} | {'saving':>6} {'goal':>6} | ok"
    )
    print(header)
    print("-" * len(header))
    goals = []
    for rate in (*REPLAY_RATES, 0.0):
        probs = flaky(rate)
        chain = Chain.for_outcomes(policy, probs)
        mass, to_decide = chain.exact(probs)
        exact = float((mass * chain.replays).sum())
        state, _ = chain.simulate(probs, trials, rng)
        simulated = chain.replays[state]
        mean = float(simulated.mean())
        counts = np.bincount(chain.verdict[state], minlength=len(VERDICTS))
        top = int(counts.argmax())
        verdict = f"{VERDICTS[top]} {counts[top] / trials:.0%}"
        saving = 1 - mean / fixed
        # The standard error of the mean, for the agreement check.
        se = float(simulated.std()) / math.sqrt(trials)
        agree = abs(mean - exact) <= AGREE_SE * se + 1e-9
        counted = rate > 0
        ok = (1 - exact / fixed) >= SAVING_GOAL and agree if counted else True
        goal = f"{SAVING_GOAL:.0%}" if counted else "—"
        print(
            f"{rate:>5.2f} | {verdict:<22} | {to_decide:>9.1f} | {mean:>7.2f} {exact:>7.2f} | {fixed:>7} | "
            f"{saving:>6.0%} {goal:>6} | {('ok' if ok else 'MISSED') if counted else 'n/a'}"
        )
        if counted:
            goals.append((rate, mean, exact, saving, ok))
    print(
        "\n(rate 0.00, a failure that never reproduces, is shown for the record: the not-reproduced "
        f"verdict needs all {policy.not_reproduced_after} replays, as fixed N does.)\n"
    )
    return all(
        [
            check(
                f"rate {rate:.2f}: fewer replays than fixed N = {fixed} ({mean:.1f}, exact {exact:.1f})",
                f"{saving:.0%}",
                ">=",
                f"{SAVING_GOAL:.0%}",
                ok,
            )
            for rate, mean, exact, saving, ok in goals
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="100,000 failures per row instead of 1,000,000")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--seed", type=int, default=20240501)
    args = parser.parse_args()
    trials = args.trials or (100_000 if args.quick else 1_000_000)
    rng = np.random.default_rng(args.seed)
    policy = VerdictPolicy()
    started = time.perf_counter()
    print(
        f"Policy (defaults): flaky rates {policy.min_rate:.0%}–{policy.max_rate:.0%}, "
        f"alpha {policy.alpha:.0%}: "
        f"deterministic after {policy.deterministic_after} reproductions, not reproduced after "
        f"{policy.not_reproduced_after} passes, flaky rate sampled to {policy.flaky_rate_replays} replays; "
        "a different failure is set aside."
    )
    ok = [errors(policy, trials, rng), intervals(policy, trials, rng), replays(policy, trials, rng)]
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
