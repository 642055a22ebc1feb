"""Threshold checks on a metric with a bootstrap margin: pass only when the bound holds with confidence.

A mean accuracy of 0.81 over 200 examples against a bound of 0.80 passes or fails by the luck of
the sample; checking the lower end of the bootstrap interval instead makes the test fail only when
the data says the metric is below the bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from flaketriage.testing import arrays
from flaketriage.testing.failure import Context, MLAssertionError, versions_description

RESAMPLE_ELEMENTS = 1 << 22
"""Bootstrap resamples are drawn in chunks of about this many indices (32 MiB), whatever n is."""


@dataclass(frozen=True)
class MetricInterval:
    """A metric's mean over per-example scores, with its percentile bootstrap interval."""

    estimate: float
    low: float
    high: float
    n: int
    confidence: float
    n_boot: int
    """0 for a single value, which has no interval (``low == high == estimate``)."""

    def __str__(self) -> str:
        if self.n_boot == 0:
            return f"{self.estimate:.6g} (a single value: no margin; pass per-example scores for one)"
        return (
            f"{self.estimate:.6g}, {self.confidence:.0%} bootstrap interval "
            f"[{self.low:.6g}, {self.high:.6g}] (n={self.n} examples, {self.n_boot} resamples)"
        )


def assert_metric_at_least(
    samples_or_value: Any,
    bound: float,
    *,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    name: str = "metric",
    context: Context = None,
) -> MetricInterval:
    """Fail unless the metric is at least ``bound`` with ``confidence``.

    ``samples_or_value`` is per-example scores (1 for a correct prediction, a per-example loss, ...:
    a tensor, array or list) whose mean is the metric, or a single number. For scores, the check
    passes when the lower end of the two-sided ``confidence`` percentile bootstrap interval of the
    mean is at least ``bound`` (a one-sided test at level ``(1 - confidence) / 2``). A single number
    is compared as it is. The resampling uses ``seed``, so a verdict is repeatable. Non-finite
    scores fail. Returns the interval.
    """
    return _check(samples_or_value, bound, "at_least", n_boot, confidence, seed, name, context)


def assert_metric_at_most(
    samples_or_value: Any,
    bound: float,
    *,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    name: str = "metric",
    context: Context = None,
) -> MetricInterval:
    """Fail unless the metric is at most ``bound`` with ``confidence``: the upper end of the interval
    must be at most ``bound``. Otherwise as :func:`assert_metric_at_least`."""
    return _check(samples_or_value, bound, "at_most", n_boot, confidence, seed, name, context)


def bootstrap_mean(
    scores: Any, *, n_boot: int = 2000, confidence: float = 0.95, seed: int = 0
) -> MetricInterval:
    """The mean of ``scores`` and its two-sided percentile bootstrap interval."""
    np = arrays.numpy()
    values = arrays.as_flat_floats(scores)
    _validate(values, n_boot, confidence)
    n = int(values.size)
    estimate = float(values.mean())
    if n == 1:
        return MetricInterval(estimate, estimate, estimate, 1, confidence, 0)
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_boot, RESAMPLE_ELEMENTS // n))
    means = np.empty(n_boot)
    for start in range(0, n_boot, chunk):
        stop = min(start + chunk, n_boot)
        means[start:stop] = values[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return MetricInterval(estimate, float(low), float(high), n, confidence, n_boot)


def _check(
    samples_or_value: Any,
    bound: float,
    direction: Literal["at_least", "at_most"],
    n_boot: int,
    confidence: float,
    seed: int,
    name: str,
    context: Context,
) -> MetricInterval:
    values = arrays.as_flat_floats(samples_or_value)
    problem = arrays.non_finite_summary(values)
    if problem:
        raise MLAssertionError(f"{name}: {problem}; a metric must be finite\n{versions_description(context)}")
    interval = bootstrap_mean(values, n_boot=n_boot, confidence=confidence, seed=seed)
    if direction == "at_least" and interval.low >= bound:
        return interval
    if direction == "at_most" and interval.high <= bound:
        return interval
    relation, end = (">=", "lower") if direction == "at_least" else ("<=", "upper")
    if interval.n_boot == 0:
        verdict = f"{name} = {interval} is not {relation} {bound:.6g}"
    else:
        verdict = (
            f"{name} = {interval} is not reliably {relation} {bound:.6g}: "
            f"the {end} end of the interval is {'below' if direction == 'at_least' else 'above'} the bound "
            f"(bootstrap seed {seed})"
        )
    raise MLAssertionError(f"{verdict}\n{versions_description(context)}")


def _validate(values: Any, n_boot: int, confidence: float) -> None:
    if values.size == 0:
        raise ValueError("a metric needs at least one score; got an empty sequence")
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1, got {n_boot}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
