"""For the user's test code: ML assertions and Hypothesis strategies for extreme inputs.

Assertions (imported here): bitwise equality, thresholds with a bootstrap margin, distribution
checks, finite outputs, and FP32-vs-AMP drift. Strategies live in ``flaketriage.testing.strategies``
(they need ``hypothesis``).

Each failure is an :class:`MLAssertionError` (an ``AssertionError``, so pytest reports it as a test
failure) whose message carries what a bug report needs: the values, the sample sizes, the seed and
the library versions. numpy, scipy and torch are imported when a check needs them; a missing one
raises :class:`MissingDependencyError`, which names ``pip install 'flaketriage[testing]'`` (numpy,
scipy, hypothesis) or ``pip install 'flaketriage[guards]'`` (torch). Importing this package loads
neither pydantic nor the bundle manifest.
"""

from __future__ import annotations

from flaketriage.errors import MissingDependencyError
from flaketriage.testing.distributions import DistributionCheck, assert_same_distribution
from flaketriage.testing.drift import AmpDriftError, DriftReport, ModuleDrift, assert_amp_drift_within
from flaketriage.testing.equality import TensorMismatchError, assert_exact_equal
from flaketriage.testing.failure import MLAssertionError
from flaketriage.testing.finiteness import NonFiniteOutputError, assert_finite_outputs
from flaketriage.testing.thresholds import (
    MetricInterval,
    assert_metric_at_least,
    assert_metric_at_most,
    bootstrap_mean,
)

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
