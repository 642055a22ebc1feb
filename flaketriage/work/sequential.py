"""How many replays a sequential decision takes: the arithmetic the workers' verdicts
(`flaketriage.workers.verdict`) decide by and the dashboard states a quarantine's lift condition with."""

from __future__ import annotations

import math


def smallest_power_at_most(base: float, target: float) -> int:
    """The smallest k >= 1 with ``base**k <= target``, for 0 < base < 1 and 0 < target < 1."""
    k = max(1, math.ceil(math.log(target) / math.log(base)))
    # The logarithms can land one off either way; settle it on the exact comparison.
    while k > 1 and base ** (k - 1) <= target:
        k -= 1
    while base**k > target:
        k += 1
    return k


def clean_replays(min_rate: float, alpha: float) -> int:
    """Replays in a row without a reproduction after which a failure rate of `min_rate` or more
    is ruled out, wrong at most `alpha` of the time."""
    return smallest_power_at_most(1.0 - min_rate, alpha)
