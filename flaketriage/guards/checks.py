"""The checks a guard runs, on host floats, and the record of one that tripped.

`Checker` turns a step's read-back values (the loss, per-tensor norms, activation norms, the
GradScaler's inf flag) into trips and history; it knows nothing of tensors or devices. A trip's
message is what a replay must reproduce: it names the check, the step and the offending parameter
or module, and its numbers are masked by the fingerprint, so it carries no bundle id, path or
address.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from flaketriage.guards.stats import History, Spike, SpikeDetector

Check = Literal[
    "loss_nonfinite",
    "loss_spike",
    "grad_nonfinite",
    "grad_norm",
    "param_grad_norm",
    "grad_spike",
    "param_nonfinite",
    "activation_nonfinite",
]
CHECKS: tuple[Check, ...] = get_args(Check)

Point = Literal["check_loss", "after_backward", "optimizer_step", "after_step"]
"""Where in the step a check's verdict is acted on: the guard call (or optimizer hook) that ran it."""

BEFORE_UPDATE: frozenset[Point] = frozenset({"check_loss", "after_backward", "optimizer_step"})
"""Points at which this step's optimizer update has not happened yet (a skip can still stop it)."""

DESCRIPTIONS: dict[Check, str] = {
    "loss_nonfinite": "the loss is not finite",
    "loss_spike": "the loss jumped far above its running mean",
    "grad_nonfinite": "a gradient is not finite",
    "grad_norm": "the total gradient norm is above its bound",
    "param_grad_norm": "a parameter's gradient norm is above its bound",
    "grad_spike": "the total gradient norm jumped far above its running mean",
    "param_nonfinite": "a parameter is not finite after the optimizer step",
    "activation_nonfinite": "a module's output is not finite",
}


@dataclass
class Trip:
    """One check that tripped: what, when, where, by how much."""

    check: Check
    step: int
    point: Point
    value: float | None = None
    limit: float | None = None
    where: str | None = None
    detail: str | None = None

    @property
    def message(self) -> str:
        """One line, stable across replays of the same fault (numbers are masked when fingerprinted)."""
        parts = [f"{self.check} at step {self.step}: {DESCRIPTIONS[self.check]}"]
        if self.value is not None:
            limit = f", limit {_fmt(self.limit)}" if self.limit is not None else ""
            parts.append(f"({_LABELS.get(self.check, 'value')} {_fmt(self.value)}{limit})")
        if self.where:
            nonfinite = self.check.endswith("_nonfinite")
            parts[-1] += ";" if nonfinite else ""
            parts.append(f"first seen in {self.where}" if nonfinite else f"in {self.where}")
        if self.detail:
            parts.append(f"- {self.detail}")
        return " ".join(parts)

    def to_json(self) -> dict[str, object]:
        return {
            "check": self.check,
            "step": self.step,
            "point": self.point,
            "value": _fmt(self.value) if self.value is not None else None,
            "limit": self.limit,
            "where": self.where,
            "detail": self.detail,
            "message": self.message,
        }


_LABELS: dict[Check, str] = {
    "loss_spike": "z-score",
    "grad_spike": "z-score",
    "grad_norm": "norm",
    "param_grad_norm": "norm",
    "activation_nonfinite": "norm",
}


def _fmt(value: float | None) -> str:
    if value is None:
        return "none"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.6g}"


@dataclass(frozen=True)
class Bounds:
    """What the checks compare against."""

    max_grad_norm: float | None = None
    max_param_grad_norm: float | None = None
    loss_spike: Spike | None = None
    grad_spike: Spike | None = None
    amp: bool = False
    """A GradScaler is in use: non-finite gradients are its routine skips, up to `amp_skip_limit`
    in a row."""
    amp_skip_limit: int = 10


class Checker:
    """Runs the checks on values read back from one step, in any order of stages.

    `emit` receives each trip; `locate` names where a non-finite loss came from (or None).
    """

    def __init__(
        self,
        names: Sequence[str],
        order: Sequence[int],
        bounds: Bounds,
        history: History,
        emit: Callable[[Trip], None],
        locate: Callable[[int], str | None],
    ) -> None:
        self.names = list(names)
        self.order = list(order)
        self.bounds = bounds
        self.history = history
        self.emit = emit
        self.locate = locate
        self.loss_spike = SpikeDetector(bounds.loss_spike) if bounds.loss_spike else None
        self.grad_spike = SpikeDetector(bounds.grad_spike) if bounds.grad_spike else None
        self.amp_skipped = 0
        self.amp_in_a_row = 0
        self._amp_seen: set[int] = set()
        self._loss: dict[int, tuple[float, int]] = {}

    def _trip(self, trip: Trip) -> None:
        self.history.record(trip.step).trips.append(trip.check)
        self.emit(trip)

    def loss(self, step: int, value: float, point: Point) -> None:
        rec = self.history.record(step)
        if step in self._loss:  # several forward passes in one step (gradient accumulation)
            total, count = self._loss[step]
            self._loss[step] = (total + value, count + 1)
            rec.loss = (total + value) / (count + 1)
        else:
            self._loss[step] = (value, 1)
            rec.loss = value
        if not math.isfinite(value):
            self._trip(Trip("loss_nonfinite", step, point, value, where=self.locate(step)))
            return
        if self.loss_spike is not None:
            z = self.loss_spike.zscore(value)
            rec.loss_z = z
            if self.loss_spike.is_spike(z):
                assert z is not None
                detail = f"loss {value:.4g} against a running mean of {self.loss_spike.mean_value():.4g}"
                self._trip(Trip("loss_spike", step, point, z, self.loss_spike.config.z, detail=detail))

    def activations(self, step: int, names: Sequence[str], values: Sequence[float], point: Point) -> None:
        self.history.record(step).activations_checked = True
        bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
        if bad is not None:
            where = f"module {names[bad]}" if bad < len(names) else None
            self._trip(Trip("activation_nonfinite", step, point, values[bad], where=where))

    def amp(self, step: int, found_inf: float, point: Point, where: str | None = None) -> None:
        """The GradScaler's verdict on this step's gradients: a skip is routine until it repeats."""
        self._amp_seen.add(step)
        if found_inf == 0:
            self.amp_in_a_row = 0
            return
        self.amp_skipped += 1
        self.amp_in_a_row += 1
        self.history.record(step).amp_skipped = True
        if self.amp_in_a_row > self.bounds.amp_skip_limit:
            detail = f"for {self.amp_in_a_row} steps in a row, all skipped by the GradScaler"
            self._trip(Trip("grad_nonfinite", step, point, where=where, detail=detail))

    def grads(self, step: int, norms: Sequence[float], point: Point) -> None:
        rec = self.history.record(step)
        bad = self._first_nonfinite(norms)
        if bad is not None:
            if self.bounds.amp:
                if step not in self._amp_seen:  # the scaler's own flag was not readable
                    self.amp(step, 1.0, point, where=bad)
                return
            count = sum(not math.isfinite(v) for v in norms)
            self._trip(
                Trip("grad_nonfinite", step, point, where=bad, detail=f"{count} of {len(norms)} parameters")
            )
            return
        total = math.sqrt(math.fsum(v * v for v in norms))
        biggest = max(range(len(norms)), key=norms.__getitem__)
        rec.grad_norm, rec.max_param_grad_norm = total, norms[biggest]
        if self.bounds.max_grad_norm is not None and total > self.bounds.max_grad_norm:
            self._trip(Trip("grad_norm", step, point, total, self.bounds.max_grad_norm))
        limit = self.bounds.max_param_grad_norm
        if limit is not None and norms[biggest] > limit:
            first = min(self.order[k] for k, v in enumerate(norms) if v > limit)
            where = f"parameter {self.names[first]}"
            self._trip(Trip("param_grad_norm", step, point, norms[biggest], limit, where))
        if self.grad_spike is not None:
            z = self.grad_spike.zscore(total)
            rec.grad_z = z
            if self.grad_spike.is_spike(z):
                assert z is not None
                detail = f"norm {total:.4g} against a running mean of {self.grad_spike.mean_value():.4g}"
                self._trip(Trip("grad_spike", step, point, z, self.grad_spike.config.z, detail=detail))

    def params(self, step: int, norms: Sequence[float], point: Point) -> None:
        where = self._first_nonfinite(norms)
        if where is not None:
            count = sum(not math.isfinite(v) for v in norms)
            detail = f"{count} of {len(norms)} parameters"
            self._trip(Trip("param_nonfinite", step, point, where=where, detail=detail))
        else:
            self.history.record(step).param_norm = math.sqrt(math.fsum(v * v for v in norms))

    def _first_nonfinite(self, norms: Sequence[float]) -> str | None:
        """The first parameter (in ``named_parameters`` order) whose norm is not finite."""
        bad = [self.order[k] for k, v in enumerate(norms) if not math.isfinite(v)]
        return f"parameter {self.names[min(bad)]}" if bad else None

    def fold(self, step: int) -> None:
        """Feed a finished step into the running statistics, unless it tripped them."""
        rec = self.history.record(step)
        if self._loss:
            self._loss.pop(step, None)
        if self._amp_seen:
            self._amp_seen.discard(step)
        tripped = rec.trips
        if self.loss_spike is not None and rec.loss is not None and "loss_spike" not in tripped:
            self.loss_spike.update(rec.loss)
        if self.grad_spike is not None and rec.grad_norm is not None and "grad_spike" not in tripped:
            self.grad_spike.update(rec.grad_norm)

    def state(self) -> dict[str, object]:
        return {
            "amp_skipped": self.amp_skipped,
            "spike": {
                "loss": self.loss_spike.state() if self.loss_spike else None,
                "grad_norm": self.grad_spike.state() if self.grad_spike else None,
            },
        }
