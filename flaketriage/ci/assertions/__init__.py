"""Assertions for ML tests: bitwise equality, thresholds with a bootstrap margin, distribution
checks, finite outputs, and FP32-vs-AMP drift.

Each failure is an :class:`MLAssertionError` (an ``AssertionError``, so pytest reports it as a test
failure) whose message carries what a bug report needs: the values, the sample sizes, the seed and
the library versions. numpy, scipy and torch are imported when a check needs them; a missing one
raises :class:`MissingDependencyError`, which names ``pip install 'flaketriage[guards]'``.
"""

from __future__ import annotations

from flaketriage.ci.assertions.distributions import DistributionCheck, assert_same_distribution
from flaketriage.ci.assertions.drift import AmpDriftError, DriftReport, ModuleDrift, assert_amp_drift_within
from flaketriage.ci.assertions.equality import TensorMismatchError, assert_exact_equal
from flaketriage.ci.assertions.failure import MLAssertionError
from flaketriage.ci.assertions.finiteness import NonFiniteOutputError, assert_finite_outputs
from flaketriage.ci.assertions.thresholds import (
    MetricInterval,
    assert_metric_at_least,
    assert_metric_at_most,
    bootstrap_mean,
)
from flaketriage.errors import MissingDependencyError

__all__ = [
    "AmpDriftError",
    "DistributionCheck",
    "DriftReport",
    "MLAssertionError",
    "MetricInterval",
    "MissingDependencyError",
    "ModuleDrift",
    "NonFiniteOutputError",
    "TensorMismatchError",
    "assert_amp_drift_within",
    "assert_exact_equal",
    "assert_finite_outputs",
    "assert_metric_at_least",
    "assert_metric_at_most",
    "assert_same_distribution",
    "bootstrap_mean",
]
