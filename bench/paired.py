"""Interleaved timing: runs compared in rounds (A B A' ..., a fresh order each round), per-pair ratios
with their median and spread, and the A/A noise floor that says which overheads are real.

A ratio is only taken between runs of the same round, so drifts in machine load hit both sides;
the A/A variant (the baseline run a second time in each round) shows how far two identical
commands differ here. An overhead whose median lies within that noise is reported as "within
noise (< X%)", never as a number, and never divided by.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

M = TypeVar("M")


def interleave(
    variants: Mapping[str, Callable[[], M]], rounds: int, *, warmup: int = 1, seed: int = 0
) -> dict[str, list[M]]:
    """What each variant measured, per round, in round order. Each round runs every variant once,
    in a fresh random order, so no variant always runs first or after the same neighbour.
    `warmup` rounds run first and are dropped."""
    order = random.Random(seed)
    names = list(variants)
    times: dict[str, list[M]] = {name: [] for name in names}
    for round_ in range(warmup + rounds):
        for name in order.sample(names, len(names)):
            measured = variants[name]()
            if round_ >= warmup:
                times[name].append(measured)
    return times


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-quantile of `values` (0.95 for the 95th percentile): the nearest rank, no interpolation."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass(frozen=True)
class Spread:
    """Per-pair values (ratios, or differences) and their median, quartiles and range."""

    values: tuple[float, ...]

    @classmethod
    def ratios(cls, times: list[float], base: list[float]) -> Spread:
        """Each run over the baseline run of the same round."""
        return cls(tuple(t / b for t, b in zip(times, base, strict=True)))

    @classmethod
    def differences(cls, times: list[float], base: list[float]) -> Spread:
        """Each run minus the baseline run of the same round."""
        return cls(tuple(t - b for t, b in zip(times, base, strict=True)))

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def quartiles(self) -> tuple[float, float]:
        if len(self.values) < 2:
            return self.values[0], self.values[0]
        q1, _, q3 = statistics.quantiles(self.values, n=4, method="inclusive")
        return q1, q3

    def median_interval(self, confidence: float = 0.95) -> tuple[float, float]:
        """Where the true median lies, with `confidence`: distribution-free, from order statistics
        (the k-th smallest and k-th largest value, k from the binomial(n, 1/2) tail), so it holds
        whatever the shape of the noise. Narrows as rounds are added, unlike the quartiles. With too
        few values for that confidence: the whole range."""
        xs = sorted(self.values)
        n = len(xs)
        alpha = 1.0 - confidence
        k, tail = 0, 0.0  # tail: P(Binomial(n, 1/2) <= k - 1)
        while True:
            below = tail + math.comb(n, k) / 2**n
            if below > alpha / 2 or k + 1 > n // 2:
                break
            k, tail = k + 1, below
        if k == 0:
            return xs[0], xs[-1]
        return xs[k - 1], xs[n - k]

    def ratio_text(self) -> str:
        """``1.012x (IQR 1.003–1.020, range 0.990–1.041)``."""
        q1, q3 = self.quartiles
        return (
            f"{self.median:.3f}x (IQR {q1:.3f}–{q3:.3f}, range {min(self.values):.3f}–{max(self.values):.3f})"
        )


def noise_floor(aa: Spread) -> float:
    """How far the same command against itself strays from 1.0: the larger distance of its per-pair
    ratios' quartiles (or median) from 1. Half the A/A pairs fall inside ±this."""
    q1, q3 = aa.quartiles
    return max(abs(q1 - 1.0), abs(q3 - 1.0), abs(aa.median - 1.0))


def within_noise(ratios: Spread, noise: float) -> bool:
    """True when the median ratio is no further from 1.0 than the A/A noise floor."""
    return abs(ratios.median - 1.0) <= noise


def overhead_text(ratios: Spread, noise: float) -> str:
    """The median overhead as ``+3.4%``, or ``within noise (< 1.2%)`` when it is inside the noise."""
    if within_noise(ratios, noise):
        return f"within noise (< {noise:.1%})"
    return f"{ratios.median - 1.0:+.1%}"
