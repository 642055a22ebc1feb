"""The sequential verdict test: its rules, its error rates in simulation, and the rate interval."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flaketriage.errors import ConfigError
from flaketriage.workers.verdict import (
    MAX_CLEAN_RUNS,
    Outcome,
    SequentialTest,
    Verdict,
    VerdictPolicy,
    clean_runs_needed,
    clopper_pearson,
    fixed_n_replays,
)

R, P, D = Outcome.REPRODUCED, Outcome.PASSED, Outcome.DIFFERENT


def feed(outcomes: list[Outcome], policy: VerdictPolicy | None = None) -> tuple[SequentialTest, list[Any]]:
    test = SequentialTest(policy)
    return test, [test.add(outcome) for outcome in outcomes]


def simulate(rate: float, rng: random.Random, policy: VerdictPolicy) -> Verdict:
    test = SequentialTest(policy)
    while not test.done:
        test.add(R if rng.random() < rate else P)
    return test.result().verdict


# --- the policy ---------------------------------------------------------------------------------


def test_default_policy_thresholds() -> None:
    policy = VerdictPolicy()
    assert policy.deterministic_after == 5
    assert policy.not_reproduced_after == 59
    assert fixed_n_replays(policy) == 59


@given(
    rate=st.floats(0.01, 0.99),
    alpha=st.floats(0.001, 0.5),
)
def test_thresholds_are_the_smallest_that_meet_alpha(rate: float, alpha: float) -> None:
    policy = VerdictPolicy(min_rate=min(rate, 1 - rate), max_rate=max(rate, 1 - rate), alpha=alpha)
    k = policy.deterministic_after
    assert policy.max_rate**k <= alpha
    assert k == 1 or policy.max_rate ** (k - 1) > alpha
    n = policy.not_reproduced_after
    assert (1 - policy.min_rate) ** n <= alpha
    assert n == 1 or (1 - policy.min_rate) ** (n - 1) > alpha


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_rate": 0.0}, "min_rate"),
        ({"max_rate": 1.0}, "max_rate"),
        ({"min_rate": 0.6, "max_rate": 0.5}, "must not exceed"),
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": float("nan")}, "alpha"),
        ({"confidence": 1.5}, "confidence"),
        ({"max_replays": 0}, "max_replays"),
        ({"max_replays": 10.5}, "max_replays"),
    ],
)
def test_policy_rejects_values_that_cannot_work(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        VerdictPolicy(**kwargs)


# --- the rules ----------------------------------------------------------------------------------


def test_five_reproductions_in_a_row_are_deterministic() -> None:
    test, verdicts = feed([R] * 5)
    assert verdicts == [None] * 4 + [Verdict.DETERMINISTIC]
    result = test.result()
    assert (result.verdict, result.decided, result.replays, result.reproductions) == (
        Verdict.DETERMINISTIC,
        True,
        5,
        5,
    )
    assert result.rate.estimate == 1.0
    assert result.rate.high == 1.0


@pytest.mark.parametrize("outcomes", [[R, P], [P, R], [D, R, P], [R, R, R, D, P], [P] * 40 + [R]])
def test_a_reproduction_beside_a_pass_is_flaky_at_once(outcomes: list[Outcome]) -> None:
    _, verdicts = feed(outcomes)
    assert verdicts[-1] == Verdict.FLAKY
    assert verdicts[:-1] == [None] * (len(outcomes) - 1)


def test_59_passes_are_not_reproduced() -> None:
    test, verdicts = feed([P] * 59)
    assert verdicts[57] is None
    assert verdicts[58] == Verdict.NOT_REPRODUCED
    assert test.result().rate.low == 0.0


def test_a_different_failure_is_set_aside_neither_reproduction_nor_pass() -> None:
    # Beside reproductions it breaks nothing: still deterministic, never flaky.
    test, verdicts = feed([R, D, R, R, D, R, R])
    assert verdicts[-1] == Verdict.DETERMINISTIC and verdicts[-2] is None
    assert (test.result().rate.estimate, test.result().different) == (1.0, 2)
    # Beside passes it does not count towards the 59 that say "not reproduced".
    _, verdicts = feed([D] + [P] * 58)
    assert verdicts[-1] is None
    test, verdicts = feed([D] + [P] * 59)
    assert verdicts[-1] == Verdict.NOT_REPRODUCED and test.result().different == 1


def test_different_failures_first_decide_early() -> None:
    _, verdicts = feed([D] * 5)
    assert verdicts == [None] * 4 + [Verdict.DIFFERENT_FAILURE]
    _, verdicts = feed([D] * 4 + [P])
    assert verdicts[-1] is None


def test_running_out_of_replays_gives_an_undecided_best_guess() -> None:
    policy = VerdictPolicy(max_replays=10)
    test, verdicts = feed([P] * 9 + [D], policy)
    assert verdicts == [None] * 10
    assert test.done
    result = test.result()
    assert (result.verdict, result.decided) == (Verdict.NOT_REPRODUCED, False)
    test, _ = feed([D] * 4 + [P] * 3 + [D] * 3, policy)
    assert (test.result().verdict, test.result().decided) == (Verdict.DIFFERENT_FAILURE, False)
    test, _ = feed([R] * 3, VerdictPolicy(max_replays=3))
    assert test.done
    assert (test.result().verdict, test.result().decided) == (Verdict.DETERMINISTIC, False)


def test_an_empty_test_has_no_verdict_and_the_whole_interval() -> None:
    result = SequentialTest().result()
    assert (result.verdict, result.decided, result.replays) == (Verdict.NOT_REPRODUCED, False, 0)
    assert (result.rate.estimate, result.rate.low, result.rate.high) == (0.0, 0.0, 1.0)


def test_late_outcomes_only_move_towards_what_they_prove() -> None:
    test, _ = feed([R] * 5)
    assert test.add(R) == Verdict.DETERMINISTIC
    assert test.add(P) == Verdict.FLAKY
    assert test.add(R) == Verdict.FLAKY


def test_plain_strings_count_and_unknown_ones_are_refused() -> None:
    test = SequentialTest()
    test.add("passed")  # type: ignore[arg-type]  # as read back from a message
    assert test.passes == 1
    with pytest.raises(ConfigError, match="outcome"):
        test.add("timeout")  # type: ignore[arg-type]


# --- error rates in simulation ------------------------------------------------------------------


@pytest.mark.parametrize("rate", [0.05, 0.2, 0.5])
def test_flaky_failures_in_the_promised_range_are_rarely_misjudged(rate: float) -> None:
    policy = VerdictPolicy()
    rng = random.Random(f"flaky-{rate}")
    trials = 2000
    verdicts = [simulate(rate, rng, policy) for _ in range(trials)]
    wrong = sum(v in (Verdict.DETERMINISTIC, Verdict.NOT_REPRODUCED) for v in verdicts) / trials
    # alpha plus three standard errors of a 2,000-trial proportion, so a fixed seed cannot flake.
    assert wrong <= policy.alpha + 3 * math.sqrt(policy.alpha * (1 - policy.alpha) / trials)
    assert set(verdicts) <= {Verdict.FLAKY, Verdict.DETERMINISTIC, Verdict.NOT_REPRODUCED}


def test_deterministic_and_absent_failures_are_never_called_flaky() -> None:
    policy = VerdictPolicy()
    rng = random.Random("steady")
    assert {simulate(1.0, rng, policy) for _ in range(200)} == {Verdict.DETERMINISTIC}
    assert {simulate(0.0, rng, policy) for _ in range(200)} == {Verdict.NOT_REPRODUCED}


def test_the_sequential_test_needs_far_fewer_replays_than_a_fixed_n() -> None:
    policy = VerdictPolicy()
    rng = random.Random("cost")
    spent = 0
    for rate in (1.0, 0.5, 0.2, 0.05, 0.0):
        for _ in range(200):
            test = SequentialTest(policy)
            while not test.done:
                test.add(R if rng.random() < rate else P)
            spent += test.replays
    assert spent <= 0.5 * 5 * 200 * fixed_n_replays(policy)


# --- the rate interval --------------------------------------------------------------------------


def test_clopper_pearson_matches_closed_forms_and_published_values() -> None:
    n = 10
    low, high = clopper_pearson(0, n)
    assert low == 0.0
    assert high == pytest.approx(1 - 0.025 ** (1 / n), abs=1e-12)
    low, high = clopper_pearson(n, n)
    assert low == pytest.approx(0.025 ** (1 / n), abs=1e-12)
    assert high == 1.0
    # R: binom.test(5, 10)$conf.int and binom.test(1, 100)$conf.int
    assert clopper_pearson(5, 10) == pytest.approx((0.1870860, 0.8129140), abs=1e-7)
    assert clopper_pearson(1, 100) == pytest.approx((0.0002531460, 0.0544593854), abs=1e-9)
    assert clopper_pearson(0, 0) == (0.0, 1.0)


def test_clopper_pearson_refuses_impossible_counts() -> None:
    with pytest.raises(ConfigError, match="successes"):
        clopper_pearson(3, 2)
    with pytest.raises(ConfigError, match="confidence"):
        clopper_pearson(1, 2, confidence=1.0)


@given(n=st.integers(1, 400), data=st.data(), confidence=st.sampled_from([0.8, 0.95, 0.99]))
def test_clopper_pearson_brackets_the_estimate(n: int, data: st.DataObject, confidence: float) -> None:
    k = data.draw(st.integers(0, n))
    low, high = clopper_pearson(k, n, confidence)
    assert 0.0 <= low <= k / n <= high <= 1.0
    if 0 < k < n:
        assert low < k / n < high


@pytest.mark.parametrize("n", [20, 59])
@pytest.mark.parametrize("rate", [0.05, 0.3, 0.5, 0.9])
def test_clopper_pearson_covers_the_true_rate_at_least_95_percent(n: int, rate: float) -> None:
    # The exact coverage: the probability of every k times whether its interval holds the rate.
    intervals = [clopper_pearson(k, n) for k in range(n + 1)]
    coverage = sum(
        math.comb(n, k) * rate**k * (1 - rate) ** (n - k)
        for k, (low, high) in enumerate(intervals)
        if low <= rate <= high
    )
    assert 0.95 <= coverage <= 0.995


def test_clopper_pearson_is_exact_at_thousands_of_trials() -> None:
    low, high = clopper_pearson(1000, 4000)
    half_width = 1.96 * math.sqrt(0.25 * 0.75 / 4000)  # the normal approximation, close at this n
    assert low == pytest.approx(0.25 - half_width, abs=1e-3)
    assert high == pytest.approx(0.25 + half_width, abs=1e-3)


# --- clean runs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "runs"), [(1.0, 1), (1.5, 1), (0.5, 5), (0.2, 14), (0.05, 59), (1e-6, MAX_CLEAN_RUNS)]
)
def test_clean_runs_needed(rate: float, runs: int) -> None:
    assert clean_runs_needed(rate) == runs


@pytest.mark.parametrize("rate", [0.0, -0.1, float("nan")])
def test_clean_runs_needed_refuses_a_failure_that_never_shows(rate: float) -> None:
    with pytest.raises(ConfigError, match="failure rate"):
        clean_runs_needed(rate)


def test_clean_runs_needed_refuses_a_bad_beta() -> None:
    with pytest.raises(ConfigError, match="beta"):
        clean_runs_needed(0.5, beta=0.0)
