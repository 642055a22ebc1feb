"""`NumericGuard`: numeric checks on every training step, at almost no cost.

Per step the guard reduces the loss, the gradients (every ``grad_every`` steps) and the
parameters (every ``param_every`` steps) to small float32 vectors of per-tensor norms, fused per
(device, dtype), and reads them back without a host sync (`readback`). `checks.Checker` runs the
checks on those host floats; only a trip takes the slow path (locating the offending module,
capturing a bundle, applying the policies).

A trip is acted on in the guard call (or optimizer hook) whose work revealed it. With lazy
read-back that is the same call one or more steps later, so the traceback of a raise, and so the
failure fingerprint, is the same as that of a replay, whose read-back is immediate.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from flaketriage.errors import GuardError, NumericFault
from flaketriage.guards.activations import ActivationProbe
from flaketriage.guards.checks import BEFORE_UPDATE, Bounds, Checker, Point, Trip
from flaketriage.guards.evidence import CaptureOptions, Recorder, TripEvidence, replaying, traceback_text
from flaketriage.guards.locate import ForwardRecorder, locate_nonfinite
from flaketriage.guards.policies import Action, PolicySpec, Raise, RestoreLastGood, resolve_policies
from flaketriage.guards.readback import LazyReadback, Stage, StageTensor, Sync, resolve_sync
from flaketriage.guards.reductions import NormPlan, clip_, total_norm
from flaketriage.guards.snapshots import Snapshots
from flaketriage.guards.stats import History, Spike

log = logging.getLogger("flaketriage.guards")

CPU_GRAD_EVERY = 8
CPU_PARAM_EVERY = 32
"""CPU defaults for ``grad_every`` and ``param_every``. On the CPU each of these checks is a full
pass over the gradients or parameters in memory, 4-6% of a small-batch MLP step if it ran every
step (bench/guards.py); on a GPU a fused kernel costs next to nothing, so there both run every step.
The loss is checked every step everywhere, and a non-finite gradient or parameter makes the next
step's loss non-finite, so on the CPU a non-finite gradient is still caught, at worst one step late;
gradient norm bounds and spikes are only seen on the sampled steps."""


@dataclass(slots=True)
class _Step:
    """The guard's view of the step in progress."""

    index: int
    grads_done: bool = False
    skip: bool = False
    grad_norms: torch.Tensor | None = None
    pending: list[StageTensor] = field(default_factory=list)
    end_callbacks: list[Callable[[], None]] = field(default_factory=list)


class NumericGuard:
    """Checks a training loop's loss, gradients, parameters and (sampled) activations.

    Use it as three calls per step (``check_loss(loss)``, ``after_backward()``,
    ``after_step()``), or as ``with guard.step(): ...`` around the step with ``check_loss`` inside.
    With an optimizer, ``after_backward`` is optional: an optimizer step pre-hook runs the
    gradient checks. With a GradScaler, gradients are checked unscaled, and steps the scaler
    skips for non-finite gradients are counted, tripping only after ``amp_skip_limit`` in a row.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scaler: Any = None,
        *,
        max_grad_norm: float | None = None,
        max_param_grad_norm: float | None = None,
        loss_spike: Spike | None = Spike(),  # noqa: B008 - frozen, so sharing the default is safe
        grad_spike: Spike | None = Spike(z=8.0),  # noqa: B008
        grad_every: int | None = None,
        param_every: int | None = None,
        activation_every: int | None = None,
        activation_modules: Sequence[str] | None = None,
        amp_skip_limit: int = 10,
        policy: PolicySpec = "raise",
        policies: Mapping[str, PolicySpec] | None = None,
        sync: Sync = "auto",
        capture: CaptureOptions | bool = True,
        snapshot_every: int = 100,
        history: int = 512,
        locate: bool = True,
        hook_optimizer: bool = True,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise GuardError("the model has no trainable parameters; there is nothing to guard")
        self._params = [p for _, p in named]
        self._plan = NormPlan(self._params)
        on_cpu = self._plan.device.type == "cpu"
        self.sync = resolve_sync(sync, self._plan.device)
        self.grad_every = grad_every or (CPU_GRAD_EVERY if on_cpu else 1)
        self.param_every = param_every or (CPU_PARAM_EVERY if on_cpu else 1)
        self.activation_every = activation_every or 0
        self.replay = replaying()
        self._policies = resolve_policies(policy, policies)
        for check, chosen in self._policies.items():
            for p in chosen:
                p.validate(self, check)
        self.history = History(history)
        self._amp = scaler is not None and bool(scaler.is_enabled())
        bounds = Bounds(max_grad_norm, max_param_grad_norm, loss_spike, grad_spike, self._amp, amp_skip_limit)
        self.checker = Checker(
            [n for n, _ in named], self._plan.order, bounds, self.history, self._queue, self._locate
        )
        self._snapshots: Snapshots | None = None
        self.snapshot_every = max(1, snapshot_every)
        if any(isinstance(p, RestoreLastGood) for ps in self._policies.values() for p in ps):
            self._snapshots = Snapshots(model, optimizer, scaler)
            self._snapshots.take(-1)
            self._snapshots.confirm(-1, clean=True)
        if capture is True:
            capture = CaptureOptions()
        self._recorder = Recorder(capture) if capture and not self.replay else None
        self.trips: list[Trip] = []
        self.actions: list[Action] = []
        self.bundle_id: str | None = None
        self._clip: float | None = None
        self._queued: list[Trip] = []
        self._readback = LazyReadback()
        self._act_names: dict[int, list[str]] = {}
        self._batches: dict[int, Any] = {}
        self._probe = ActivationProbe(model, activation_modules) if activation_every else None
        self._forward = ForwardRecorder(model) if locate else None
        self._hooks: list[Any] = []
        if optimizer is not None and hook_optimizer:
            self._hooks.append(optimizer.register_step_pre_hook(self._optimizer_pre_hook))
        self.step_index = 0
        self._step = _Step(0)
        self._closed = False
        self._begin_step()

    @property
    def amp_skipped(self) -> int:
        """Steps the GradScaler skipped for non-finite gradients (routine, not trips)."""
        return self.checker.amp_skipped

    # --- the calls a training loop makes ---------------------------------------------------------

    def check_loss(self, loss: torch.Tensor | float, *, batch_indices: Any = None) -> None:
        """Check this step's loss (call it once per forward pass). A Python float, such as the
        value of a ``loss.item()`` the loop already does, is checked at once without any sync."""
        self._poll()
        if batch_indices is not None:
            self.set_batch(batch_indices)
        if isinstance(loss, torch.Tensor):
            if self.sync == "lazy":
                value = loss.detach().float().mean().reshape(1)
                self._step.pending.append(StageTensor("loss", "check_loss", value))
            else:
                # One op: right after a forward pass every torch call is slow (cold caches).
                scalar = loss.item() if loss.numel() == 1 else loss.detach().float().mean().item()
                self.checker.loss(self.step_index, scalar, "check_loss")
        else:
            self.checker.loss(self.step_index, float(loss), "check_loss")
        self._collect_activations("check_loss")
        self._fire("check_loss")

    def after_backward(self) -> None:
        """Check the gradients (after ``scaler.unscale_`` when the loop calls it; otherwise the
        guard unscales them itself). Before the optimizer step, so a ``skip`` can still act."""
        self._poll()
        self._grad_stage("after_backward", unscale=True)
        self._fire("after_backward")

    def after_step(self) -> None:
        """Close the step: check parameters (every ``param_every`` steps) and move on."""
        self._poll()
        if not self._step.grads_done:
            # No after_backward and no hook ran (a skipped scaler step, a closure): grads are
            # still there, already unscaled by the scaler if it ran.
            self._grad_stage("after_step", unscale=False)
        self._collect_activations("after_step")
        if self.step_index % self.param_every == 0:
            with torch.no_grad():
                norms = self._plan.norms([p.detach() for p in self._params])
            self._submit("params", "after_step", norms)
        self._fire("after_step")
        self._end_step()

    @contextlib.contextmanager
    def step(self, batch_indices: Any = None) -> Iterator[NumericGuard]:
        """One training step as a block: ``after_step`` runs when it ends without an exception."""
        if batch_indices is not None:
            self.set_batch(batch_indices)
        yield self
        self.after_step()

    def set_batch(self, indices: Any) -> None:
        """The dataset indices of this step's batch (a tensor, array or list), for the data slice."""
        self._batches[self.step_index] = indices
        for old in [s for s in self._batches if s < self.step_index - 256]:
            del self._batches[old]

    def close(self) -> None:
        """Wait for outstanding read-backs, act on what they show, and remove every hook."""
        if self._closed:
            return
        self._closed = True
        try:
            self._poll(wait=True)
            for point in {t.point for t in self._queued}:
                self._fire(point)
        finally:
            self._remove_hooks()

    def __enter__(self) -> NumericGuard:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._closed = True
            self._remove_hooks()

    def stats(self) -> dict[str, Any]:
        """The guard's statistics: per-step history, trips, actions, AMP skips, spike state."""
        return {
            "step": self.step_index,
            "sync": self.sync,
            "grad_every": self.grad_every,
            "param_every": self.param_every,
            "activation_every": self.activation_every,
            **self.checker.state(),
            "trips": [t.to_json() for t in self.trips],
            "actions": [a.to_json() for a in self.actions],
            "history": self.history.to_json(),
        }

    # --- stages ------------------------------------------------------------------------------------

    def _optimizer_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        positional = args[1:] if args and args[0] is optimizer else args  # torch passes self first
        if positional or kwargs.get("closure") is not None:
            return  # the closure computes the gradients inside step(); after_step checks them
        self._poll()
        self._grad_stage("optimizer_step", unscale=True)
        self._fire("optimizer_step")

    def _grad_stage(self, point: Point, *, unscale: bool) -> None:
        step = self._step
        if step.grads_done:
            return
        step.grads_done = True
        found_inf = self._unscale() if unscale else None
        if found_inf is not None:
            self._submit("amp", point, found_inf)
        due = self.step_index % self.grad_every == 0
        # A step whose scaler flag was not readable is checked in full, to count its skip.
        if due or self._clip is not None or (self._amp and found_inf is None):
            grads = [p.grad for p in self._params]
            if any(g is not None for g in grads):
                with torch.no_grad():
                    norms = step.grad_norms = self._plan.norms(grads)
                    if self._clip is not None and point != "after_step":
                        clip_(grads, total_norm(norms), self._clip)
                if not step.skip:  # a skipped step's gradients are dropped unread
                    self._submit("grads", point, norms)
        if step.skip:
            self._drop_grads()

    def _unscale(self) -> torch.Tensor | None:
        """Unscale the gradients (once per step, as GradScaler allows) and return its inf flag."""
        scaler, optimizer = self.scaler, self.optimizer
        if not self._amp or optimizer is None:
            return None
        from torch.amp.grad_scaler import OptState

        state = scaler._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.READY:
            scaler.unscale_(optimizer)
        flags = list(state.get("found_inf_per_device", {}).values())
        if not flags:
            return None
        device = flags[0].device
        return torch.stack([f.to(device, non_blocking=True).reshape(()) for f in flags]).sum().reshape(1)

    def _collect_activations(self, point: Point) -> None:
        if self._probe is None or not self._probe.armed:  # the common case, kept cheap
            return
        names, norms = self._probe.collect()
        if norms is not None:
            self._act_names[self.step_index] = names
            self._submit("activations", point, norms)

    def _submit(self, stage: Stage, point: Point, values: torch.Tensor) -> None:
        if self.sync == "lazy":
            self._step.pending.append(StageTensor(stage, point, values))
        else:
            self._evaluate(self.step_index, stage, point, values.tolist())

    def _evaluate(self, step: int, stage: Stage, point: Point, values: list[float]) -> None:
        checker = self.checker
        if stage == "loss":
            checker.loss(step, values[0], point)
        elif stage == "activations":
            checker.activations(step, self._act_names.pop(step, []), values, point)
        elif stage == "amp":
            checker.amp(step, values[0], point)
        elif stage == "grads":
            checker.grads(step, values, point)
        else:
            checker.params(step, values, point)

    def _begin_step(self) -> None:
        self._step = _Step(self.step_index)
        if self._probe is not None and self.step_index % self.activation_every == 0:
            self._probe.arm()
        if self._forward is not None:
            self._forward.step = self.step_index

    def _end_step(self) -> None:
        step = self._step
        if self.sync == "lazy":
            self._readback.submit(step.index, step.pending)
        else:
            self.checker.fold(step.index)
        for callback in step.end_callbacks:
            callback()
        if self._forward is not None:
            self._forward.end_step()
        if self._snapshots is not None and (step.index + 1) % self.snapshot_every == 0:
            self._snapshots.take(step.index)
            if self.sync != "lazy":
                self._snapshots.confirm(step.index, clean=not self.history.record(step.index).trips)
        self.step_index += 1
        self._begin_step()

    def _poll(self, wait: bool = False) -> None:
        if self.sync != "lazy" or not len(self._readback):
            return
        for reading in self._readback.poll(wait=wait):
            for stage, point, values in reading.stages:
                self._evaluate(reading.step, stage, point, values)
            self.checker.fold(reading.step)
            if self._snapshots is not None:
                self._snapshots.confirm(reading.step, clean=not self.history.record(reading.step).trips)

    def _locate(self, step: int) -> str | None:
        recorder = self._forward
        if recorder is None or not recorder.for_step(step):
            return None
        found = locate_nonfinite(recorder, step)
        return found or "the loss computation (the model's outputs are finite)"

    # --- trips -------------------------------------------------------------------------------------

    def _queue(self, trip: Trip) -> None:
        self._queued.append(trip)

    def _fire(self, point: Point) -> None:
        if not self._queued:
            return
        due = [t for t in self._queued if t.point == point]
        if due:
            self._queued = [t for t in self._queued if t.point != point]
            for trip in due:
                self._handle(trip)

    def _handle(self, trip: Trip) -> None:
        # The raise below must stay in this function: the captured traceback is this frame's
        # stack, and a replay (which always raises) must print the very same frames.
        self.trips.append(trip)
        log.warning("flaketriage guard: %s", trip.message)
        fault = NumericFault(trip.message, check=trip.check, step=trip.step, where=trip.where)
        if self._recorder is not None and self.bundle_id is None:
            self.bundle_id = fault.bundle_id = self._capture(trip, traceback_text(fault, sys._getframe()))
        raising = self.replay
        for policy in () if raising else self._policies[trip.check]:
            if isinstance(policy, Raise):
                raising = True
                break
            action = policy.apply(self, trip)
            self.actions.append(action)
            log.warning("flaketriage guard: %s on %s: %s", policy.name, trip.check, action.detail)
        if raising:
            self.actions.append(Action(trip.step, trip.check, "raise", "raised NumericFault"))
            raise fault

    def _capture(self, trip: Trip, text: str) -> str | None:
        assert self._recorder is not None
        indices = _as_indices(self._batches.get(trip.step))
        evidence = TripEvidence(trip, text, indices, self.stats(), self._state_for_checkpoint)
        try:
            bundle = self._recorder.record(evidence)
        except Exception as exc:  # capturing must never hide the fault it was capturing
            log.warning("flaketriage guard: could not capture a bundle for %s: %s", trip.check, exc)
            return None
        log.warning("flaketriage guard: captured bundle %s (flaketriage triage %s)", bundle, bundle[:12])
        return bundle

    def _state_for_checkpoint(self) -> dict[str, Any]:
        state = Snapshots(self.model, self.optimizer, self.scaler).state()
        state["step"] = self.step_index
        return state

    # --- what policies may ask (policies.Control) --------------------------------------------------

    def request_skip(self, trip: Trip) -> bool:
        if trip.point not in BEFORE_UPDATE or trip.step != self.step_index:
            return False
        self._step.skip = True
        if self._step.grads_done:
            self._drop_grads()
        return True

    def at_step_end(self, fn: Callable[[], None]) -> None:
        self._step.end_callbacks.append(fn)

    def set_clip(self, max_norm: float | None, trip: Trip) -> float | None:
        previous, self._clip = self._clip, max_norm
        step = self._step
        if max_norm is not None and trip.point in BEFORE_UPDATE and step.grad_norms is not None:
            with torch.no_grad():
                clip_([p.grad for p in self._params], total_norm(step.grad_norms), max_norm)
        return previous

    def restore_last_good(self) -> tuple[int, Callable[[], None]] | None:
        return self._snapshots.restore() if self._snapshots is not None else None

    def _drop_grads(self) -> None:
        for p in self._params:
            p.grad = None

    def _remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self._forward is not None:
            self._forward.remove()
        if self._probe is not None:
            self._probe.disarm()


def _as_indices(value: Any) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return [int(i) for i in value.reshape(-1).tolist()]
    tolist = getattr(value, "tolist", None)
    items = tolist() if callable(tolist) else list(value)
    return [int(i) for i in items]
