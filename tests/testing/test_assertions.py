"""ML assertions on real torch and numpy: each passes on good data and fails, with the documented
message, on planted bad data."""

from __future__ import annotations

import math
import re
import sys

import numpy as np
import pytest
import torch
from torch import nn

from flaketriage.errors import FlaketriageError
from flaketriage.testing import (
    AmpDriftError,
    DriftReport,
    MissingDependencyError,
    MLAssertionError,
    TensorMismatchError,
    assert_amp_drift_within,
    assert_exact_equal,
    assert_metric_at_least,
    assert_metric_at_most,
    assert_same_distribution,
    bootstrap_mean,
)

# --- exact equality -------------------------------------------------------------------------------


def one_ulp_up(value: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(value, torch.tensor(math.inf, dtype=value.dtype))


def test_equal_tensors_pass_with_nans_in_the_same_places() -> None:
    generator = torch.Generator().manual_seed(0)
    actual = torch.randn(3, 4, 5, generator=generator)
    actual[1, 2, 3] = math.nan
    expected = actual.clone()
    expected[1, 2, 3] = -math.nan  # another NaN bit pattern: still "a NaN where a NaN was expected"
    assert_exact_equal(actual, expected)
    assert_exact_equal(actual.bfloat16(), expected.bfloat16())
    assert_exact_equal(actual, actual.numpy())  # a tensor against a numpy golden of the same dtype


def test_one_ulp_difference_is_caught_at_the_right_index() -> None:
    torch.manual_seed(1234)
    expected = torch.randn(2, 3, 4)
    actual = expected.clone()
    actual[1, 2, 3] = one_ulp_up(expected[1, 2, 3])
    with pytest.raises(TensorMismatchError) as caught:
        assert_exact_equal(actual, expected)
    err = caught.value
    assert isinstance(err, AssertionError)
    assert err.index == (1, 2, 3)
    assert err.mismatches == 1
    message = str(err)
    assert "1 of 24 elements differ" in message
    assert "first mismatch at index [1, 2, 3]" in message
    assert "1 ULP of float32" in message
    want_bits = np.float32(expected[1, 2, 3].item()).view(np.uint32)
    assert f"bits 0x{int(want_bits):08x}" in message
    assert f"bits 0x{int(want_bits) + 1:08x}" in message
    assert repr(expected[1, 2, 3].item()) in message  # the full-precision value
    assert "seed: 1234 (torch.initial_seed())" in message
    assert f"torch {torch.__version__}" in message
    assert f"numpy {np.__version__}" in message
    assert f"python {sys.version_info.major}.{sys.version_info.minor}" in message


def test_mismatch_reports_count_first_and_largest_difference() -> None:
    expected = np.arange(12, dtype=np.int64).reshape(3, 4)
    actual = expected.copy()
    actual[0, 3] += 1
    actual[2, 1] -= 100
    with pytest.raises(TensorMismatchError) as caught:
        assert_exact_equal(actual, expected, seed=7, context={"checkpoint": "step-1000"})
    message = str(caught.value)
    assert "2 of 12 elements differ" in message
    assert "first mismatch at index [0, 3]" in message
    assert "actual:   4" in message and "expected: 3" in message
    assert "largest difference: 100 at index [2, 1]" in message
    assert "checkpoint: step-1000" in message
    assert "seed: 7\n" in message


def test_nan_against_a_number_and_signed_zeros_differ() -> None:
    expected = torch.tensor([1.0, 0.0, 2.0])
    with pytest.raises(TensorMismatchError, match=r"index \[1\]") as caught:
        assert_exact_equal(torch.tensor([1.0, -0.0, 2.0]), expected)
    assert "+0.0 and -0.0" in str(caught.value)
    with pytest.raises(TensorMismatchError, match=r"index \[2\]"):
        assert_exact_equal(torch.tensor([1.0, 0.0, math.nan]), expected)


def test_bfloat16_differences_show_16_bit_patterns() -> None:
    expected = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16)
    actual = expected.clone()
    actual[1, 0] = one_ulp_up(expected[1, 0])
    with pytest.raises(TensorMismatchError) as caught:
        assert_exact_equal(actual, expected)
    message = str(caught.value)
    assert "dtype torch.bfloat16" in message
    assert "bits 0x4040" in message and "bits 0x4041" in message  # 3.0 and the next bfloat16
    assert "1 ULP of bfloat16" in message


@pytest.mark.parametrize(
    ("actual", "expected", "difference"),
    [
        (
            torch.zeros(3),
            torch.zeros(3, dtype=torch.float64),
            "dtype: actual torch.float32, expected torch.float64",
        ),
        (torch.zeros(3), np.zeros(3, dtype=np.float64), "dtype: actual torch.float32, expected float64"),
        (torch.zeros(2, 3), torch.zeros(3, 2), "shape: actual [2, 3], expected [3, 2]"),
        (torch.zeros(3, device="meta"), torch.zeros(3), "device: actual meta, expected cpu"),
    ],
)
def test_dtype_shape_and_device_must_match(actual: object, expected: object, difference: str) -> None:
    with pytest.raises(TensorMismatchError, match="not comparable") as caught:
        assert_exact_equal(actual, expected)
    assert difference in str(caught.value)
    assert caught.value.index is None


def test_complex_and_string_elements_are_compared() -> None:
    with pytest.raises(TensorMismatchError, match=r"index \[1\]"):
        assert_exact_equal(torch.tensor([1 + 2j, 3 + 4j]), torch.tensor([1 + 2j, 3 + 5j]))
    with pytest.raises(TensorMismatchError, match=r"'b'"):
        assert_exact_equal(np.array(["a", "b"]), np.array(["a", "c"]))
    assert_exact_equal(np.array(["a", "b"]), np.array(["a", "b"]))


def test_a_real_reduction_order_difference_is_caught() -> None:
    # The same sum in two association orders: float addition is not associative, so a change in
    # reduction order (threads, kernels, batch size) changes low bits. Pinned numbers, not luck.
    values = torch.tensor([1e8, 1.0, -1e8, 1.0], dtype=torch.float32)
    left_to_right = ((values[0] + values[1]) + values[2]) + values[3]
    pairwise = (values[0] + values[2]) + (values[1] + values[3])
    with pytest.raises(TensorMismatchError, match=r"actual:   1\.0 .*\n.*expected: 2\.0"):
        assert_exact_equal(left_to_right, pairwise)


# --- thresholds with a bootstrap margin -----------------------------------------------------------


def test_metric_well_above_the_bound_passes_and_reports_its_interval() -> None:
    scores = np.r_[np.ones(950), np.zeros(50)]
    interval = assert_metric_at_least(scores, 0.9)
    assert interval.estimate == pytest.approx(0.95)
    assert 0.9 < interval.low < 0.95 < interval.high < 1.0
    assert interval.n == 1000 and interval.n_boot == 2000


def test_a_mean_barely_above_the_bound_with_high_variance_fails() -> None:
    # 81 of 100 correct: the plain mean clears 0.80, but 100 coin flips cannot tell 0.81 from 0.75.
    scores = torch.tensor([1.0] * 81 + [0.0] * 19)
    assert scores.mean().item() >= 0.8
    with pytest.raises(MLAssertionError) as caught:
        assert_metric_at_least(scores, 0.8, name="accuracy")
    message = str(caught.value)
    assert re.search(
        r"accuracy = 0\.81, 95% bootstrap interval \[0\.7\d*, 0\.8\d*\] \(n=100 examples", message
    )
    assert "is not reliably >= 0.8" in message
    assert "lower end" in message


def test_the_same_mean_over_many_examples_passes() -> None:
    scores = np.r_[np.ones(8100), np.zeros(1900)]  # 0.81 again, over 10,000 examples
    interval = assert_metric_at_least(scores, 0.8)
    assert interval.low > 0.8


def test_metric_at_most_checks_the_upper_end() -> None:
    losses = np.random.default_rng(3).exponential(0.2, size=400)
    assert_metric_at_most(losses, 0.3)
    with pytest.raises(MLAssertionError, match=r"is not reliably <= 0\.21: the upper end"):
        assert_metric_at_most(losses, 0.21, name="loss")


def test_a_single_value_is_compared_without_a_margin() -> None:
    assert assert_metric_at_least(0.93, 0.9).n_boot == 0
    with pytest.raises(MLAssertionError, match=r"a single value: no margin"):
        assert_metric_at_least(0.85, 0.9)


def test_non_finite_scores_fail() -> None:
    with pytest.raises(MLAssertionError, match=r"1 of 3 values are not finite \(first at index 1: nan\)"):
        assert_metric_at_least([1.0, math.nan, 1.0], 0.5)


def test_bootstrap_interval_is_repeatable_and_covers_the_true_mean() -> None:
    rng = np.random.default_rng(11)
    assert bootstrap_mean([0.2, 0.9, 0.4], seed=5) == bootstrap_mean([0.2, 0.9, 0.4], seed=5)
    covered = 0
    trials = 200
    for trial in range(trials):
        sample = rng.normal(1.0, 1.0, size=60)
        interval = bootstrap_mean(sample, n_boot=500, confidence=0.9, seed=trial)
        covered += interval.low <= 1.0 <= interval.high
    assert 0.82 <= covered / trials <= 0.96  # 90% nominal; the percentile bootstrap runs a bit short


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [({"n_boot": 0}, "n_boot"), ({"confidence": 1.0}, "confidence")],
)
def test_bad_bootstrap_settings_are_rejected(kwargs: dict[str, float], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        assert_metric_at_least([1.0, 0.0], 0.1, **kwargs)  # type: ignore[arg-type]


# --- distributions --------------------------------------------------------------------------------


@pytest.mark.parametrize("test", ["ks", "chi2", "kl"])
def test_samples_of_the_same_distribution_pass(test: str) -> None:
    rng = np.random.default_rng(20)
    check = assert_same_distribution(rng.normal(size=2000), rng.normal(size=2000), test=test)  # type: ignore[arg-type]
    assert check.passed and check.n_sample == 2000


@pytest.mark.parametrize("test", ["ks", "chi2"])
def test_false_alarm_rate_is_at_most_alpha(test: str) -> None:
    rng = np.random.default_rng(21)
    trials, alpha = 200, 0.05
    alarms = 0
    for _ in range(trials):
        try:
            assert_same_distribution(rng.normal(size=300), rng.normal(size=300), test=test, alpha=alpha)  # type: ignore[arg-type]
        except MLAssertionError:
            alarms += 1
    assert alarms / trials <= 2 * alpha  # binomial(200, 0.05): above 20 alarms is a 1-in-5000 event


@pytest.mark.parametrize("test", ["ks", "chi2", "kl"])
def test_a_shifted_distribution_is_caught(test: str) -> None:
    rng = np.random.default_rng(22)
    caught = 0
    for _ in range(20):
        try:
            assert_same_distribution(rng.normal(0.4, size=2000), rng.normal(size=2000), test=test)  # type: ignore[arg-type]
        except MLAssertionError:
            caught += 1
    assert caught >= 19


def test_ks_message_names_sizes_statistic_and_p_value() -> None:
    rng = np.random.default_rng(23)
    sample = torch.from_numpy(rng.normal(1.0, size=500))
    with pytest.raises(MLAssertionError) as caught:
        assert_same_distribution(sample, rng.normal(size=800), alpha=0.01, context="sampler v2")
    message = str(caught.value)
    assert re.search(r"Kolmogorov-Smirnov\): D = 0\.\d+, p = [\d.e-]+ < alpha = 0\.01", message)
    assert "n_sample=500, n_baseline=800" in message
    assert "context: sampler v2" in message
    assert re.search(r"  sample: +mean (0\.9|1\.0)\d*, std", message)
    assert re.search(r"  baseline: +mean -?0\.0\d*, std", message)


def test_chi2_counts_categories_and_catches_a_loaded_die() -> None:
    rng = np.random.default_rng(24)
    fair = rng.integers(1, 7, size=3000)
    assert_same_distribution(rng.integers(1, 7, size=3000), fair, test="chi2")
    loaded = rng.choice(np.arange(1, 7), size=3000, p=[0.15, 0.15, 0.15, 0.15, 0.15, 0.25])
    with pytest.raises(MLAssertionError) as caught:
        assert_same_distribution(loaded, fair, test="chi2")
    message = str(caught.value)
    assert re.search(
        r"chi-square test of homogeneity over 6 bins\): chi2 = [\d.]+, p = [\d.e-]+ < alpha", message
    )
    assert re.search(r"sample: +6 distinct values, most common 6: 2\d\.\d%", message)


def test_kl_message_shows_threshold_and_the_floor_of_identical_samples() -> None:
    rng = np.random.default_rng(25)
    with pytest.raises(MLAssertionError) as caught:
        assert_same_distribution(rng.normal(0.5, size=1000), rng.normal(size=1000), test="kl", max_kl=0.05)
    message = str(caught.value)
    assert re.search(r"KL\(sample \|\| baseline\) = 0\.\d+ nats > max_kl = 0\.05 over 20 bins", message)
    assert "identical distributions give about 0.019" in message


def test_values_outside_explicit_bins_count_in_the_outer_bins() -> None:
    sample = np.array([-5.0, 0.5, 0.5, 9.0])
    check = assert_same_distribution(sample, sample.copy(), test="chi2", bins=[0.0, 1.0, 2.0, 3.0])
    assert check.bins == 2  # the middle bin is empty on both sides and tells nothing


def test_nan_fails_in_a_sample_and_is_refused_in_a_baseline() -> None:
    with pytest.raises(MLAssertionError, match=r"1 of 3 sample values are NaN \(first at index 2\)"):
        assert_same_distribution([0.1, 0.2, math.nan], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="baseline"):
        assert_same_distribution([0.1, 0.2, 0.3], [0.1, math.nan, 0.3])


# --- FP32 vs AMP drift ----------------------------------------------------------------------------


class OnePassNorm(nn.Module):
    """Batch normalization with the one-pass variance E[x²] - E[x]²: a common hand-written layer.

    Exact in real arithmetic; in low precision it subtracts two large, nearly equal numbers.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(0, keepdim=True)
        var = (x * x).mean(0, keepdim=True) - mean * mean
        return (x - mean) / torch.sqrt(var + 1e-5)


def sensor_batches(offset: float, scale: float, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Readings around ``offset`` (unstandardized sensor data: pressures, temperatures in K)."""
    generator = torch.Generator().manual_seed(seed)
    return [
        (offset + scale * torch.randn(64, 8, generator=generator), torch.randn(64, 1, generator=generator))
        for _ in range(3)
    ]


def normalizing_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), OnePassNorm(), nn.ReLU(), nn.Linear(32, 1))


def test_well_conditioned_mlp_stays_within_tolerance() -> None:
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, 16, generator=generator), torch.randint(0, 4, (64,), generator=generator))]

    def mlp() -> nn.Module:  # dropout: both runs must draw the same masks for this to pass
        return nn.Sequential(
            nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4)
        )

    report = assert_amp_drift_within(mlp, batches, steps=3)
    assert isinstance(report, DriftReport)
    assert report.dtype == "torch.bfloat16" and report.device == "cpu"
    assert len(report.fp32_losses) == len(report.amp_losses) == 3
    assert report.loss_drift < 0.01 and report.activation_drift < 0.05
    assert {m.module for m in report.modules} >= {"0", "2", "5", "(model)"}
    assert "FP32 vs AMP (torch.bfloat16 autocast on cpu) over 3 steps" in str(report)


def test_catastrophic_cancellation_in_bfloat16_fails_and_names_the_layer() -> None:
    with pytest.raises(AmpDriftError) as caught:
        assert_amp_drift_within(normalizing_model, sensor_batches(offset=1000.0, scale=10.0))
    report = caught.value.report
    assert report is not None and not report.within
    assert all(math.isfinite(loss) for loss in report.fp32_losses)  # FP32 is fine
    worst = report.modules[0]
    assert (worst.module, worst.kind, worst.step) == ("1", "OnePassNorm", 0)
    assert math.isinf(worst.drift) and math.isnan(worst.amp)
    message = str(caught.value)
    assert "AMP drifts from FP32 beyond tolerance" in message
    assert re.search(r"\n  1 +OnePassNorm +\w+ +0 .*nan +inf  > tolerance", message)
    assert "torch 2." in message


def test_the_same_layer_on_standardized_data_passes() -> None:
    report = assert_amp_drift_within(normalizing_model, sensor_batches(offset=0.0, scale=1.0))
    assert report.within


def test_drift_check_restores_the_rng_and_leaves_a_given_module_alone() -> None:
    model = normalizing_model()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    torch.manual_seed(99)
    state = torch.get_rng_state()
    assert_amp_drift_within(model, sensor_batches(offset=0.0, scale=1.0), steps=2)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.get_float32_matmul_precision() == "highest"  # the FP32 run's setting, put back
    assert torch.backends.cudnn.allow_tf32  # torch's default, put back after the FP32 run
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])


def test_drift_check_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="steps"):
        assert_amp_drift_within(normalizing_model, sensor_batches(0.0, 1.0), steps=0)
    with pytest.raises(ValueError, match="batches is empty"):
        assert_amp_drift_within(normalizing_model, [])


# --- dependencies ---------------------------------------------------------------------------------


def test_a_missing_library_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "scipy.stats", None)  # what `import` does for an absent module
    with pytest.raises(MissingDependencyError, match=r"pip install 'flaketriage\[testing\]'") as caught:
        assert_same_distribution([0.1, 0.2], [0.1, 0.2])
    assert isinstance(caught.value, FlaketriageError) and isinstance(caught.value, ImportError)
    assert (caught.value.module, caught.value.extra) == ("scipy", "testing")
