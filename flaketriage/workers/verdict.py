"""The sequential test that turns replay outcomes into a verdict, and the reproduction-rate interval.

A captured failure is replayed one run at a time; after each run the test either decides or asks for
another. With the default ``VerdictPolicy`` it means, in plain words:

* **Deterministic** after 5 reproductions and no pass. A flaky failure that fails half the time does
  that only 1 time in 32 (0.5^5 ≈ 3%); rarer flakes, less often still.
* **Flaky** as soon as one replay reproduces the failure and another passes: a deterministic failure
  reproduces every time, so this needs no statistics.
* **Not reproduced** after 59 passing replays without one reproduction. A flaky failure that fails 1
  time in 20 stays hidden that long fewer than 5 times in 100 (0.95^59 ≈ 4.9%).
* **Different failure** when the first 5 replays all fail with another fingerprint and none passes
  or reproduces.

A replay that fails with another fingerprint is set aside: it is a finding (reported, listed with
its count), never a reproduction, and never a pass. So an unrelated hiccup (an infrastructure error
in 1% of replays) cannot make a deterministic failure look flaky, and the rates below are over the
replays that either reproduced or passed.

So a flaky failure whose failure rate lies between 5% and 50% is called deterministic or not
reproduced at most 5% of the time (``alpha``); flakier or steadier ones are told apart even more
reliably. A policy that always runs a fixed number of replays needs 59 every time for the same
promise; the sequential test stops after 5 for a deterministic failure and after a few for a flaky
one. With the defaults every sequence decides by replay 59; ``max_replays`` (100) only caps
policies configured to need more, and a test that hits it reports its best guess as undecided.

A flaky verdict is certain at its first mixed outcome, but a rate from two replays says little, so
replays go on to ``flaky_rate_replays`` (20) in all to narrow the interval (0 stops at once).

Every verdict carries the reproduction rate (reproductions / (reproductions + passes)) with an
exact 95% Clopper–Pearson interval: a deterministic verdict after 5 of 5 says 0.48–1.00, so a report
says how sure it is. A `VerdictResult` crosses process boundaries as JSON (``to_json`` /
``from_json``, exact inverses), in the shape ``flaketriage triage --json`` prints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from flaketriage.errors import ConfigError
from flaketriage.work.sequential import clean_replays, smallest_power_at_most

__all__ = [
    "Outcome",
    "RateInterval",
    "SequentialTest",
    "Verdict",
    "VerdictPolicy",
    "VerdictResult",
    "clean_runs_needed",
    "clopper_pearson",
    "fixed_n_replays",
]

# clean_runs_needed never asks for more than this: a failure rarer than ~1.5% cannot be told from a
# pass in affordable time, and the caller is better served by a bounded answer than a huge one.
MAX_CLEAN_RUNS = 200


class Outcome(StrEnum):
    """What one replay did, compared with the captured failure."""

    REPRODUCED = "reproduced"
    PASSED = "passed"
    DIFFERENT = "different_failure"
    SANDBOX = "sandbox"
    """The replay broke a limit of its sandbox (time, memory, processes, network) without failing
    the way it was captured: evidence about the sandbox, not about the failure."""
    ENVIRONMENT = "environment"
    """The replay could not run in the bundle's environment (a package that cannot be installed, a
    Python version this runner lacks): nothing was learned about the failure."""


class Verdict(StrEnum):
    """What the replays say about the captured failure."""

    DETERMINISTIC = "deterministic"
    FLAKY = "flaky"
    NOT_REPRODUCED = "not_reproduced"
    DIFFERENT_FAILURE = "different_failure"
    ORDER_DEPENDENT = "order_dependent"
    """Passes alone, fails after certain earlier tests (its polluters). The sequential test never
    gives it: triage does, after searching the tests that ran before (`workers.polluters`)."""
    ENVIRONMENT = "environment"
    """No replay could run in the bundle's environment; the reason is in the findings."""
    ENVIRONMENT_SPECIFIC = "environment_specific"
    """Reproduces on the runner (or hardware) it was captured on and not on others, or the reverse.
    The sequential test never gives it: hardware attribution across runners does."""


def _check_probability(name: str, value: float, meaning: str) -> None:
    # `not (0 < v < 1)` also rejects NaN, which every comparison answers False.
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0.0 < value < 1.0:
        raise ConfigError(f"{name} must be a number strictly between 0 and 1 ({meaning}); got {value!r}")


@dataclass(frozen=True)
class VerdictPolicy:
    """How sure a verdict must be, and how many replays it may cost.

    For a flaky failure whose rate lies in ``min_rate``..``max_rate``, the chance of calling it
    deterministic is at most ``alpha``, and so is the chance of calling it not reproduced. The two
    cannot both happen; their sum stays under ``alpha`` for the defaults (at most 4.9%) but can exceed
    it when the range is narrow. ``confidence`` is the coverage of the reported rate interval.
    """

    min_rate: float = 0.05
    max_rate: float = 0.5
    alpha: float = 0.05
    max_replays: int = 100
    confidence: float = 0.95
    flaky_rate_replays: int = 20
    """After a flaky verdict, replays go on until this many in all, only to narrow the rate interval
    (the verdict itself is already certain); 0 stops at the decision."""

    def __post_init__(self) -> None:
        _check_probability("min_rate", self.min_rate, "the rarest flaky failure rate to detect")
        _check_probability("max_rate", self.max_rate, "the most frequent flaky failure rate to detect")
        if self.min_rate > self.max_rate:
            raise ConfigError(
                f"min_rate ({self.min_rate}) must not exceed max_rate ({self.max_rate}); "
                "they bound the flaky failure rates to classify, lowest first"
            )
        _check_probability("alpha", self.alpha, "the accepted chance of a wrong verdict, e.g. 0.05")
        _check_probability("confidence", self.confidence, "the rate interval's coverage, e.g. 0.95")
        if (
            not isinstance(self.max_replays, int)
            or isinstance(self.max_replays, bool)
            or self.max_replays < 1
        ):
            raise ConfigError(
                f"max_replays must be a whole number of replays, at least 1; got {self.max_replays!r}. "
                f"With these rates a verdict can need up to {self.not_reproduced_after} replays"
            )

    @property
    def deterministic_after(self) -> int:
        """Reproductions in a row, with nothing else, that make a failure deterministic."""
        return smallest_power_at_most(self.max_rate, self.alpha)

    @property
    def not_reproduced_after(self) -> int:
        """Replays without a reproduction that make a failure not reproduced (or a different one)."""
        return clean_replays(self.min_rate, self.alpha)


@dataclass(frozen=True)
class RateInterval:
    """The observed reproduction rate and its confidence interval."""

    estimate: float
    low: float
    high: float

    def to_json(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RateInterval:
        return cls(estimate=data["estimate"], low=data["low"], high=data["high"])


@dataclass(frozen=True)
class VerdictResult:
    """A verdict with the counts behind it; ``decided`` is False when replays ran out first."""

    verdict: Verdict
    decided: bool
    replays: int
    reproductions: int
    passes: int
    different: int
    rate: RateInterval
    sandbox: int = 0
    """Replays that broke a sandbox limit without failing as captured."""
    environment: int = 0
    """Replays that could not run in the bundle's environment."""

    def to_json(self) -> dict[str, Any]:
        """The verdict's part of ``flaketriage triage --json``; `from_json` reads it back."""
        return {
            "verdict": str(self.verdict),
            "decided": self.decided,
            "replays": self.replays,
            "failures": self.reproductions,
            "passes": self.passes,
            "different_failures": self.different,
            "sandbox_limits": self.sandbox,
            "environment_failures": self.environment,
            "failure_rate": self.rate.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VerdictResult:
        """The result `to_json` wrote (other keys, such as the rest of a triage result, are ignored)."""
        return cls(
            verdict=Verdict(data["verdict"]),
            decided=data["decided"],
            replays=data["replays"],
            reproductions=data["failures"],
            passes=data["passes"],
            different=data["different_failures"],
            rate=RateInterval.from_json(data["failure_rate"]),
            sandbox=data.get("sandbox_limits", 0),
            environment=data.get("environment_failures", 0),
        )


class SequentialTest:
    """Feed replay outcomes one at a time with ``add``; it returns the verdict once decided.

    Outcomes that arrive after the decision (replays already in flight) are still counted and can
    still change it, but only towards what the evidence proves: a deterministic or not-reproduced
    verdict becomes flaky when a later replay both passes and reproduces.
    """

    def __init__(self, policy: VerdictPolicy | None = None) -> None:
        self.policy = policy if policy is not None else VerdictPolicy()
        self._deterministic_after = self.policy.deterministic_after
        self._not_reproduced_after = self.policy.not_reproduced_after
        self.reproductions = 0
        self.passes = 0
        self.different = 0
        self.sandbox = 0
        self.environment = 0
        self.decided: Verdict | None = None

    @property
    def replays(self) -> int:
        """Outcomes added so far."""
        return self.reproductions + self.passes + self.different + self.sandbox + self.environment

    @property
    def informative(self) -> int:
        """Replays that reproduced or passed: the ones the rate is estimated from."""
        return self.reproductions + self.passes

    @property
    def done(self) -> bool:
        """True once decided (and, for flaky, the rate sampled) or ``max_replays`` were added."""
        if self.replays >= self.policy.max_replays:
            return True
        if self.decided is Verdict.FLAKY:
            return self.informative >= self.policy.flaky_rate_replays
        return self.decided is not None

    def add(self, outcome: Outcome) -> Verdict | None:
        """Count one replay's outcome; return the verdict if there is one now, else None."""
        # == rather than `is`, so the plain strings of a deserialized message count too.
        if outcome == Outcome.REPRODUCED:
            self.reproductions += 1
        elif outcome == Outcome.PASSED:
            self.passes += 1
        elif outcome == Outcome.DIFFERENT:
            self.different += 1
        elif outcome == Outcome.SANDBOX:
            self.sandbox += 1
        elif outcome == Outcome.ENVIRONMENT:
            self.environment += 1
        else:
            raise ConfigError(f"expected a replay outcome, one of {', '.join(Outcome)}; got {outcome!r}")
        verdict = self._rule()
        if verdict is not None:
            self.decided = verdict
        return self.decided

    def _rule(self) -> Verdict | None:
        """The verdict the counts support, or None while they support none yet.

        Different failures, sandbox limits and environment failures are set aside: they decide
        nothing, except that a run of nothing else from the start decides that this is what replays
        give (a different failure, or an environment that cannot be had here).
        """
        if self.environment and self.environment == self.replays:
            return Verdict.ENVIRONMENT  # the environment cannot be had here: more replays won't help
        if self.reproductions and self.passes:
            return Verdict.FLAKY
        if self.reproductions >= self._deterministic_after:
            return Verdict.DETERMINISTIC
        if self.reproductions:
            return None
        if self.different == self.replays and self.different >= self._deterministic_after:
            return Verdict.DIFFERENT_FAILURE
        if self.passes >= self._not_reproduced_after:
            return Verdict.NOT_REPRODUCED
        return None

    def _best_guess(self) -> Verdict:
        """The verdict the counts lean to when the replays ran out before a decision."""
        if self.reproductions:
            return Verdict.DETERMINISTIC  # any pass would already have made it flaky
        return Verdict.DIFFERENT_FAILURE if self.different > self.passes else Verdict.NOT_REPRODUCED

    def result(self) -> VerdictResult:
        """The verdict so far (decided or best guess), counts, and reproduction-rate interval."""
        n, k = self.informative, self.reproductions
        low, high = clopper_pearson(k, n, self.policy.confidence)
        return VerdictResult(
            verdict=self.decided if self.decided is not None else self._best_guess(),
            decided=self.decided is not None,
            replays=self.replays,
            reproductions=k,
            passes=self.passes,
            different=self.different,
            sandbox=self.sandbox,
            environment=self.environment,
            rate=RateInterval(estimate=k / n if n else 0.0, low=low, high=high),
        )


def _log_sum_exp(values: list[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return -math.inf
    return top + math.log(math.fsum(math.exp(v - top) for v in values))


def _binomial_log_terms(n: int, p: float, first: int, last: int, log_comb: list[float]) -> list[float]:
    """log P(X = i) for i in first..last, X ~ Binomial(n, p), 0 < p < 1."""
    log_p, log_q = math.log(p), math.log1p(-p)
    return [log_comb[i] + i * log_p + (n - i) * log_q for i in range(first, last + 1)]


def _solve(log_f: Callable[[float], float], log_target: float, *, increasing: bool) -> float:
    """The p in (0, 1) where the monotone ``log_f(p)`` crosses ``log_target``, by bisection."""
    lo, hi = 0.0, 1.0
    # 60 halvings leave an interval below 1e-18, finer than any float rate in (0, 1) needs.
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if (log_f(mid) < log_target) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper–Pearson) interval for a binomial rate after ``k`` successes in ``n`` trials.

    ``low`` is the rate at which seeing ``k`` or more successes has probability (1 - confidence) / 2,
    ``high`` the rate at which seeing ``k`` or fewer has that probability; each is found by bisection
    on the binomial tail, summed in log space so that ``n`` in the thousands neither overflows nor
    underflows. ``n = 0`` gives (0, 1): no replays say nothing.
    """
    if not 0 <= k <= n:
        raise ConfigError(f"need 0 <= successes <= trials for a rate interval; got k={k}, n={n}")
    _check_probability("confidence", confidence, "the interval's coverage, e.g. 0.95")
    if n == 0:
        return 0.0, 1.0
    tail = (1.0 - confidence) / 2.0
    log_tail = math.log(tail)
    log_comb = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(n + 1)]

    def log_at_least(p: float) -> float:  # log P(X >= k), increasing in p
        return _log_sum_exp(_binomial_log_terms(n, p, k, n, log_comb))

    def log_at_most(p: float) -> float:  # log P(X <= k), decreasing in p
        return _log_sum_exp(_binomial_log_terms(n, p, 0, k, log_comb))

    low = 0.0 if k == 0 else _solve(log_at_least, log_tail, increasing=True)
    high = 1.0 if k == n else _solve(log_at_most, log_tail, increasing=False)
    return low, high


def fixed_n_replays(policy: VerdictPolicy) -> int:
    """Replays a policy that always runs the same number needs to keep ``policy``'s error targets.

    It cannot stop early, so N must be long enough both to let a flaky failure at ``min_rate``
    show itself (``not_reproduced_after``) and to catch a pass from one at ``max_rate``
    (``deterministic_after``). This is the baseline the sequential test is measured against.
    """
    return max(policy.deterministic_after, policy.not_reproduced_after)


def clean_runs_needed(rate: float, beta: float = 0.05) -> int:
    """Passing runs in a row before a candidate counts as passing, for a failure seen at ``rate``.

    A failure that shows up with probability ``rate`` per run hides for n runs with probability
    ``(1 - rate)**n``; this is the smallest n that brings that to ``beta`` or below, capped at
    ``MAX_CLEAN_RUNS``. A deterministic failure (``rate >= 1``) needs one run.
    """
    _check_probability("beta", beta, "the accepted chance of a hidden failure, e.g. 0.05")
    if not isinstance(rate, int | float) or isinstance(rate, bool) or math.isnan(rate) or rate <= 0:
        raise ConfigError(
            f"a failure rate above 0 is needed to plan clean runs; got {rate!r}. "
            "A failure that never reproduced cannot be minimized: replay it first"
        )
    if rate >= 1:
        return 1
    return min(smallest_power_at_most(1.0 - rate, beta), MAX_CLEAN_RUNS)
