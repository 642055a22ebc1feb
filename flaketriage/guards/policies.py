"""What a guard does when a check trips: raise, skip the step, lower the loss scale, clip
gradients, run modules in FP32, or restore the last good state. Every action is logged and can
be reverted.

A policy asks the guard (through `Control`) for what it needs; the guard decides when it is safe
to act: a skip empties the gradients before the optimizer step, a state restore waits for the end
of the step so that backward never sees parameters change under it.
"""

from __future__ import annotations

import functools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from flaketriage.errors import GuardError
from flaketriage.guards.checks import CHECKS, Check, Trip

log = logging.getLogger("flaketriage.guards")


@dataclass
class Action:
    """One thing a policy did, and how to undo it."""

    step: int
    check: Check
    policy: str
    detail: str
    undo: Callable[[], None] | None = field(default=None, repr=False)
    reverted: bool = False

    @property
    def reversible(self) -> bool:
        return self.undo is not None and not self.reverted

    def revert(self) -> None:
        """Undo the action (a skipped step, which changed nothing lasting, has nothing to undo)."""
        if self.reverted:
            return
        if self.undo is not None:
            self.undo()
        self.reverted = True
        log.warning("flaketriage guard: reverted %s (%s at step %d)", self.policy, self.check, self.step)

    def to_json(self) -> dict[str, object]:
        return {
            "step": self.step,
            "check": self.check,
            "policy": self.policy,
            "detail": self.detail,
            "reverted": self.reverted,
        }


class Control(Protocol):
    """What policies may ask of the guard."""

    step_index: int
    model: torch.nn.Module
    scaler: Any

    def request_skip(self, trip: Trip) -> bool: ...
    def at_step_end(self, fn: Callable[[], None]) -> None: ...
    def set_clip(self, max_norm: float | None, trip: Trip) -> float | None: ...
    def restore_last_good(self) -> tuple[int, Callable[[], None]] | None: ...


class Policy(ABC):
    """Base of the policies; `name` is what logs and bundles show."""

    name = "policy"

    def validate(self, control: Control, check: Check) -> None:
        """Refuse a set-up that cannot work, when the guard is built (not at the first trip)."""
        return  # most policies work with any check and guard

    @abstractmethod
    def apply(self, control: Control, trip: Trip) -> Action:
        """Act on a trip and return the record of what was done (with its revert)."""


class Raise(Policy):
    """Stop training with `NumericFault` (the guard raises it, after recording the trip)."""

    name = "raise"

    def apply(self, control: Control, trip: Trip) -> Action:
        return Action(trip.step, trip.check, self.name, "raised NumericFault")


class Warn(Policy):
    """Log the trip and go on."""

    name = "warn"

    def apply(self, control: Control, trip: Trip) -> Action:
        return Action(trip.step, trip.check, self.name, "logged only")


class SkipStep(Policy):
    """Drop this step's update: the gradients are emptied before the optimizer step, which then
    leaves every parameter (and the optimizer's moments) as it was."""

    name = "skip"

    def validate(self, control: Control, check: Check) -> None:
        if check == "param_nonfinite":
            raise GuardError(
                "policy 'skip' cannot handle param_nonfinite: that check runs after the optimizer "
                "step, when there is nothing left to skip; use 'restore' or 'raise'"
            )

    def apply(self, control: Control, trip: Trip) -> Action:
        done = control.request_skip(trip)
        detail = "update of this step dropped" if done else "the step was already applied; nothing skipped"
        return Action(trip.step, trip.check, self.name, detail)


@dataclass
class LowerLossScale(Policy):
    """Multiply the GradScaler's scale by `factor`, at the end of the step (after ``update()``)."""

    factor: float = 0.5
    name = "lower_loss_scale"

    def validate(self, control: Control, check: Check) -> None:
        if control.scaler is None or not control.scaler.is_enabled():
            raise GuardError(
                "policy 'lower_loss_scale' needs an enabled GradScaler: pass scaler= to NumericGuard"
            )
        if not 0 < self.factor < 1:
            raise GuardError(f"LowerLossScale(factor={self.factor}): the factor must lie in (0, 1)")

    def apply(self, control: Control, trip: Trip) -> Action:
        scaler = control.scaler
        action = Action(trip.step, trip.check, self.name, f"loss scale x{self.factor} at the end of the step")

        def lower() -> None:
            before = float(scaler.get_scale())
            scaler.update(new_scale=before * self.factor)
            action.detail = f"loss scale {before:g} -> {before * self.factor:g}"

        def undo() -> None:
            scaler.update(new_scale=float(scaler.get_scale()) / self.factor)

        control.at_step_end(lower)
        action.undo = undo
        return action


@dataclass
class ClipGradients(Policy):
    """From this step on, scale gradients to a global norm of at most `max_norm` (on the device,
    as ``clip_grad_norm_`` does, reusing the norms the guard already computed)."""

    max_norm: float = 1.0
    name = "clip"

    def validate(self, control: Control, check: Check) -> None:
        if not self.max_norm > 0:
            raise GuardError(f"ClipGradients(max_norm={self.max_norm}): the bound must be positive")

    def apply(self, control: Control, trip: Trip) -> Action:
        previous = control.set_clip(self.max_norm, trip)

        def undo() -> None:
            control.set_clip(previous, trip)

        detail = f"gradients clipped to norm {self.max_norm:g} from now on"
        return Action(trip.step, trip.check, self.name, detail, undo)


@dataclass
class RunInFP32(Policy):
    """Run the named modules with autocast disabled, their floating inputs cast to their
    parameters' dtype (float32 under mixed precision), from the next forward pass on."""

    modules: Sequence[str] = ()
    name = "fp32"

    def validate(self, control: Control, check: Check) -> None:
        names = dict(control.model.named_modules())
        missing = [m for m in self.modules if m not in names]
        if not self.modules or missing:
            raise GuardError(
                f"RunInFP32 needs module names of the model; not found: {missing or '(none given)'}. "
                "Names are those of model.named_modules(), e.g. 'encoder.layers.0'"
            )

    def apply(self, control: Control, trip: Trip) -> Action:
        modules = dict(control.model.named_modules())
        undos = [_force_fp32(modules[name]) for name in self.modules]

        def undo() -> None:
            for fn in undos:
                fn()

        return Action(trip.step, trip.check, self.name, f"modules in FP32: {', '.join(self.modules)}", undo)


def _force_fp32(module: torch.nn.Module) -> Callable[[], None]:
    had_own = "forward" in module.__dict__
    original = module.forward
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    device_type = next((p.device.type for p in module.parameters()), "cpu")

    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(dtype)
        return value

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device_type, enabled=False):
            return original(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})

    module.forward = forward

    def undo() -> None:
        if had_own:
            module.forward = original
        else:
            del module.forward

    return undo


class RestoreLastGood(Policy):
    """Load the model and optimizer state of the last step that passed every check (the guard
    snapshots one every ``snapshot_every`` steps), at the end of the step, and skip this step's
    update. Reverting loads the state that was replaced."""

    name = "restore"

    def apply(self, control: Control, trip: Trip) -> Action:
        action = Action(trip.step, trip.check, self.name, "restore pending at the end of the step")
        control.request_skip(trip)

        def restore() -> None:
            restored = control.restore_last_good()
            if restored is None:
                action.detail = "no good state saved yet; nothing restored"
                return
            good_step, undo = restored
            action.detail = f"restored the state saved after step {good_step}"
            action.undo = undo

        control.at_step_end(restore)
        return action


_NAMED: dict[str, Callable[[], Policy]] = {
    "raise": Raise,
    "warn": Warn,
    "skip": SkipStep,
    "lower_loss_scale": LowerLossScale,
    "clip": ClipGradients,
    "restore": RestoreLastGood,
}

PolicySpec = str | Policy | Sequence[str | Policy]


def resolve_policies(
    default: PolicySpec, per_check: Mapping[str, PolicySpec] | None
) -> dict[Check, tuple[Policy, ...]]:
    """Each check's policies, in the order they act; names stand for the policies with defaults.

    `default` applies to every check not in `per_check`, except that a default ``skip`` leaves
    out ``param_nonfinite`` (which runs after the update, when nothing is left to skip)."""
    unknown = sorted(set(per_check or {}) - set(CHECKS))
    if unknown:
        raise GuardError(f"policies for unknown checks {unknown}; the checks are: {', '.join(CHECKS)}")
    out: dict[Check, tuple[Policy, ...]] = {}
    for check in CHECKS:
        explicit = check in (per_check or {})
        chosen = tuple(_policy(p) for p in _as_list((per_check or {})[check] if explicit else default))
        if check == "param_nonfinite" and not explicit:
            # The parameter check runs after the update: a default "skip" cannot act there.
            chosen = tuple(p for p in chosen if not isinstance(p, SkipStep)) or (Raise(),)
        out[check] = chosen
    return out


def _as_list(spec: PolicySpec) -> Iterable[str | Policy]:
    return [spec] if isinstance(spec, str | Policy) else list(spec)


def _policy(spec: str | Policy) -> Policy:
    if isinstance(spec, Policy):
        return spec
    if spec == "fp32":
        raise GuardError("policy 'fp32' needs module names: use RunInFP32(['encoder.layers.0', ...])")
    try:
        return _NAMED[spec]()
    except KeyError:
        raise GuardError(
            f"unknown policy {spec!r}; choose one of {', '.join(sorted(_NAMED))} or a Policy object "
            "(RunInFP32(modules) for fp32)"
        ) from None
