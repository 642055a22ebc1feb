"""Distributional checks: does a sample still look like its baseline (KS, chi-square, KL)?

For outputs that are random by design (sampled tokens, augmented batches, dropout masks), equality
is the wrong test and a statistical one is the right one: it fails with a known probability
(``alpha``) when nothing changed, and with high probability when the distribution moved.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from flaketriage.testing import arrays
from flaketriage.testing.failure import Context, MLAssertionError, versions_description

Test = Literal["ks", "chi2", "kl"]

CATEGORIES_SHOWN = 8
"""A failure message lists the shares of at most this many of the most common values."""

SMOOTHING = 0.5
"""Pseudo-count added to every histogram bin before the KL estimate (Jeffreys' prior), so a bin
the baseline never saw costs a finite amount instead of infinity."""


@dataclass(frozen=True)
class DistributionCheck:
    """The outcome of one comparison of a sample with its baseline."""

    test: Test
    statistic: float
    """KS: the largest CDF gap D; chi2: the chi-square statistic; kl: KL(sample ‖ baseline) in nats."""
    p_value: float | None
    """None for ``kl``, which compares the statistic with ``threshold`` instead."""
    threshold: float
    """``alpha`` for ``ks`` and ``chi2``, ``max_kl`` for ``kl``."""
    n_sample: int
    n_baseline: int
    bins: int | None
    """Histogram bins (or categories) for ``chi2`` and ``kl``; None for ``ks``."""

    @property
    def passed(self) -> bool:
        if self.p_value is None:
            return self.statistic <= self.threshold
        return self.p_value >= self.threshold


def assert_same_distribution(
    sample: Any,
    baseline: Any,
    *,
    test: Test = "ks",
    alpha: float = 0.01,
    max_kl: float = 0.05,
    bins: int | Sequence[float] | None = None,
    context: Context = None,
) -> DistributionCheck:
    """Fail when ``sample`` does not look drawn from the distribution ``baseline`` was drawn from.

    - ``"ks"``: the two-sample Kolmogorov–Smirnov test (:func:`scipy.stats.ks_2samp`), for
      continuous values; fails when ``p < alpha``.
    - ``"chi2"``: the chi-square test of homogeneity (:func:`scipy.stats.chi2_contingency`) on the
      counts of the two samples; fails when ``p < alpha``.
    - ``"kl"``: the KL divergence KL(sample ‖ baseline) in nats between the two histograms, each
      smoothed by :data:`SMOOTHING` per bin; fails when it exceeds ``max_kl``. Even identical
      distributions give about ``(bins - 1) / 2 · (1/n_sample + 1/n_baseline)`` (the message shows
      this floor), so choose ``max_kl`` above it.

    Integers, booleans and strings are counted per value for ``chi2`` and ``kl`` unless ``bins``
    is given. Floats are binned: ``bins`` as an int gives that many bins at the baseline's
    quantiles (each holds about the same share of the baseline), as a sequence gives the bin edges;
    values beyond the outer edges count in the outermost bins. By default the bin count keeps about
    20 (``chi2``) or 50 (``kl``) expected values per bin. A NaN in ``sample`` fails; one in
    ``baseline`` is a ``ValueError``.
    """
    if test not in ("ks", "chi2", "kl"):
        raise ValueError(f"test must be 'ks', 'chi2' or 'kl', got {test!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha}")
    new, old = _values(sample, "sample", context), _values(baseline, "baseline", None)
    if test == "ks":
        check = _ks(new, old, alpha)
    else:
        counts = _counts(new, old, bins, per_bin=20 if test == "chi2" else 50)
        check = _chi2(counts, alpha, new.size, old.size) if test == "chi2" else _kl(counts, max_kl)
    if not check.passed:
        raise MLAssertionError(_message(check, new, old, context))
    return check


def _values(data: Any, role: str, context: Context) -> Any:
    np = arrays.numpy()
    values = arrays.as_numpy(data).ravel()
    if values.size == 0:
        raise ValueError(f"the {role} is empty; a distribution check needs values on both sides")
    if values.dtype.kind in "fc":
        nan = np.isnan(values)
        if nan.any():
            first = int(np.argmax(nan))
            where = f"{int(nan.sum())} of {values.size} {role} values are NaN (first at index {first})"
            if role == "baseline":
                raise ValueError(f"{where}; fix the baseline, a distribution check cannot use it")
            raise MLAssertionError(f"{where}; the baseline has none\n{versions_description(context)}")
    return values


def _ks(new: Any, old: Any, alpha: float) -> DistributionCheck:
    stats = arrays.scipy_stats()
    with warnings.catch_warnings():
        # For some sample sizes the exact p-value does not converge and scipy warns that it used
        # the asymptotic one instead; that is the documented fallback, not a problem.
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.ks_2samp(new.astype(float), old.astype(float))
    return DistributionCheck(
        "ks", float(result.statistic), float(result.pvalue), alpha, new.size, old.size, None
    )


def _chi2(counts: Any, alpha: float, n_new: int, n_old: int) -> DistributionCheck:
    stats = arrays.scipy_stats()
    seen = counts[:, counts.sum(axis=0) > 0]  # a category neither sample has tells nothing
    if seen.shape[1] < 2:  # both samples hold one and the same value
        return DistributionCheck("chi2", 0.0, 1.0, alpha, n_new, n_old, int(seen.shape[1]))
    result = stats.chi2_contingency(seen)
    return DistributionCheck(
        "chi2", float(result.statistic), float(result.pvalue), alpha, n_new, n_old, int(seen.shape[1])
    )


def _kl(counts: Any, max_kl: float) -> DistributionCheck:
    np = arrays.numpy()
    smoothed = counts + SMOOTHING
    p, q = (row / row.sum() for row in smoothed)
    divergence = float(np.sum(p * np.log(p / q)))
    n_new, n_old = (int(row.sum()) for row in counts)
    return DistributionCheck("kl", divergence, None, max_kl, n_new, n_old, int(counts.shape[1]))


def _counts(new: Any, old: Any, bins: int | Sequence[float] | None, per_bin: int) -> Any:
    """A 2×k table: the sample's counts per bin or category, then the baseline's."""
    np = arrays.numpy()
    categorical = bins is None and new.dtype.kind not in "fc" and old.dtype.kind not in "fc"
    if categorical:
        categories, codes = np.unique(np.concatenate([new, old]), return_inverse=True)
        k = len(categories)
        new_codes, old_codes = codes[: new.size], codes[new.size :]
    else:
        inner = _inner_edges(old.astype(float), bins, per_bin, min(new.size, old.size))
        k = len(inner) + 1
        new_codes = np.searchsorted(inner, new.astype(float), side="right")
        old_codes = np.searchsorted(inner, old.astype(float), side="right")
    return np.stack([np.bincount(new_codes, minlength=k), np.bincount(old_codes, minlength=k)]).astype(float)


def _inner_edges(old: Any, bins: int | Sequence[float] | None, per_bin: int, n: int) -> Any:
    np = arrays.numpy()
    if bins is not None and not isinstance(bins, int):
        edges = np.asarray(bins, dtype=float)
        if edges.ndim != 1 or edges.size < 2 or np.any(np.diff(edges) <= 0):
            raise ValueError(f"bins as edges must be at least two increasing numbers, got {list(bins)}")
        return edges[1:-1]
    count = bins if bins is not None else max(2, min(50, n // per_bin))
    if count < 1:
        raise ValueError(f"bins must be at least 1, got {count}")
    finite = old[np.isfinite(old)]
    if finite.size == 0:
        return np.empty(0)
    return np.unique(np.quantile(finite, np.arange(1, count) / count))


def _message(check: DistributionCheck, new: Any, old: Any, context: Context) -> str:
    sizes = f"n_sample={check.n_sample}, n_baseline={check.n_baseline}"
    if check.test == "ks":
        head = (
            f"sample differs from baseline (two-sample Kolmogorov-Smirnov): D = {check.statistic:.4g}, "
            f"p = {check.p_value:.3g} < alpha = {check.threshold:g} ({sizes})"
        )
    elif check.test == "chi2":
        head = (
            f"sample differs from baseline (chi-square test of homogeneity over {check.bins} bins): "
            f"chi2 = {check.statistic:.4g}, p = {check.p_value:.3g} < alpha = {check.threshold:g} ({sizes})"
        )
    else:
        floor = (check.bins or 1) - 1
        floor_kl = floor / 2 * (1 / check.n_sample + 1 / check.n_baseline)
        head = (
            f"sample differs from baseline: KL(sample || baseline) = {check.statistic:.4g} nats "
            f"> max_kl = {check.threshold:g} over {check.bins} bins ({sizes}; identical distributions "
            f"give about {floor_kl:.3g} at these sizes)"
        )
    lines = [head, f"  sample:   {_summary(new)}", f"  baseline: {_summary(old)}"]
    return "\n".join(lines) + "\n" + versions_description(context)


def _summary(values: Any) -> str:
    np = arrays.numpy()
    if values.dtype.kind not in "fc":
        top, counts = np.unique(values, return_counts=True)
        if values.dtype.kind not in "iu" or top.size <= CATEGORIES_SHOWN:
            order = np.argsort(-counts, kind="stable")[:CATEGORIES_SHOWN]
            shares = ", ".join(f"{top[i]!s}: {counts[i] / values.size:.1%}" for i in order)
            return f"{top.size} distinct values, most common {shares}"
    floats = values.astype(float)
    finite = floats[np.isfinite(floats)]
    if finite.size == 0:
        return "no finite values"
    q = np.quantile(finite, [0.05, 0.5, 0.95])
    std = float(finite.std()) if finite.size > 1 else math.nan
    return (
        f"mean {float(finite.mean()):.4g}, std {std:.4g}, "
        f"5%/50%/95% quantiles {q[0]:.4g} / {q[1]:.4g} / {q[2]:.4g}"
    )
