"""Running statistics: spike detection by an EMA z-score, and the per-step history a bundle keeps.

Pure Python on host floats: the guard feeds them values it has already read back.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from flaketriage.errors import GuardError


@dataclass(frozen=True)
class Spike:
    """When a value counts as a spike: ``z`` standard deviations above its running mean.

    The mean and variance are exponential moving averages with a half-life of ``halflife`` steps,
    on ``log(value)`` by default (a loss that doubles is the same surprise at 4.0 and at 0.01; use
    ``scale="linear"`` for losses that can be zero or negative). Nothing trips during the first
    ``warmup`` steps, and the standard deviation is never taken below ``min_std`` (in log units: 0.05
    is a 5% change), so a run whose loss barely moves does not trip on routine noise.
    """

    z: float = 6.0
    warmup: int = 50
    halflife: float = 50.0
    min_std: float = 0.05
    scale: Literal["log", "linear"] = "log"

    def __post_init__(self) -> None:
        if not self.z > 0 or self.warmup < 1 or not self.halflife > 0 or self.min_std < 0:
            raise GuardError(
                f"Spike(z={self.z}, warmup={self.warmup}, halflife={self.halflife}, min_std={self.min_std})"
                " cannot work: z and halflife must be positive, warmup at least 1 and min_std not negative"
            )
        if self.scale not in ("log", "linear"):
            raise GuardError(f"Spike scale {self.scale!r}: choose 'log' or 'linear'")


class SpikeDetector:
    """An EMA of a value and of its squared deviation; `zscore` says how unusual a new value is."""

    def __init__(self, config: Spike) -> None:
        self.config = config
        self.alpha = 1.0 - 0.5 ** (1.0 / config.halflife)
        self.mean = 0.0
        self.var = 0.0
        self.count = 0

    def _x(self, value: float) -> float | None:
        if not math.isfinite(value):
            return None
        if self.config.scale == "log":
            return math.log(value) if value > 0 else None
        return value

    def zscore(self, value: float) -> float | None:
        """How many standard deviations `value` lies above the mean; None during warm-up."""
        x = self._x(value)
        if x is None or self.count < self.config.warmup:
            return None
        floor = self.config.min_std * (1.0 if self.config.scale == "log" else max(abs(self.mean), 1e-12))
        return (x - self.mean) / max(math.sqrt(self.var), floor)

    def is_spike(self, z: float | None) -> bool:
        return z is not None and z > self.config.z

    def update(self, value: float) -> None:
        """Fold a value in (callers leave out values that tripped, so a fault never becomes normal)."""
        x = self._x(value)
        if x is None:
            return
        if self.count == 0:
            self.mean = x
        else:
            delta = x - self.mean
            self.mean += self.alpha * delta
            self.var = (1.0 - self.alpha) * (self.var + self.alpha * delta * delta)
        self.count += 1

    def mean_value(self) -> float:
        """The running mean in the value's own units (the geometric mean on the log scale)."""
        return math.exp(self.mean) if self.config.scale == "log" else self.mean

    def state(self) -> dict[str, float]:
        return {"mean": self.mean, "std": math.sqrt(self.var), "count": self.count}


@dataclass(slots=True)
class StepRecord:
    """What the guard saw in one step; None where a check did not run."""

    step: int
    loss: float | None = None
    loss_z: float | None = None
    grad_norm: float | None = None
    grad_z: float | None = None
    max_param_grad_norm: float | None = None
    param_norm: float | None = None
    amp_skipped: bool = False
    activations_checked: bool = False
    trips: list[str] = field(default_factory=list)


class History:
    """The last `size` steps, oldest first, for the bundle's statistics attachment."""

    def __init__(self, size: int) -> None:
        self._records: deque[StepRecord] = deque(maxlen=max(size, 1))

    def record(self, step: int) -> StepRecord:
        """The record of `step`, created when it is new (steps arrive in order)."""
        if self._records and self._records[-1].step == step:
            return self._records[-1]
        for rec in reversed(self._records):
            if rec.step == step:
                return rec
            if rec.step < step:
                break
        rec = StepRecord(step)
        self._records.append(rec)
        return rec

    def last(self) -> StepRecord | None:
        return self._records[-1] if self._records else None

    def to_json(self) -> list[dict[str, Any]]:
        return [{k: json_number(v) for k, v in asdict(r).items()} for r in self._records]


def json_number(value: Any) -> Any:
    """A float JSON can hold: NaN and infinities become the strings ``"nan"``, ``"inf"``, ``"-inf"``."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value
