"""Each check trips on the step where a planted fault starts, and never on clean training."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
import torch

from flaketriage.errors import FlaketriageError, GuardError
from flaketriage.guards import NumericFault, NumericGuard, Spike

if TYPE_CHECKING:
    from conftest import Loop  # tests/ci/guards/conftest.py


def _linear(module: torch.nn.Module) -> torch.nn.Linear:
    assert isinstance(module, torch.nn.Linear)
    return module


def _fault(loop: Loop, steps: int) -> NumericFault:
    with pytest.raises(NumericFault) as caught:
        loop.run(steps)
    return caught.value


def test_clean_training_trips_nothing(loop: Callable[..., Loop]) -> None:
    run = loop(param_every=1, activation_every=5, max_grad_norm=100.0)
    run.run(300)
    assert run.guard.trips == [] and run.guard.actions == []
    assert run.losses[-1] < run.losses[0] / 5  # it did train
    history = run.guard.stats()["history"]
    assert history[-1]["step"] == 299 and history[-1]["grad_norm"] > 0
    assert sum(r["activations_checked"] for r in history) == 60


def test_clean_adam_training_with_noisy_batches_trips_nothing(
    mlp: Callable[..., torch.nn.Sequential],
) -> None:
    model = mlp(seed=3, width=64)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    guard = NumericGuard(model, opt, capture=False, grad_every=1, param_every=1)
    for _ in range(400):
        x = torch.randn(8, 8)
        y = torch.sin(3 * x[:, :1]) + 0.3 * torch.randn(8, 1)  # small batches: a noisy loss
        loss = torch.nn.functional.mse_loss(model(x), y)
        guard.check_loss(loss)
        torch.autograd.backward(loss)
        opt.step()
        guard.after_step()
        opt.zero_grad()
    assert guard.trips == []


def test_poisoned_batch_trips_the_loss_check_on_its_step(loop: Callable[..., Loop]) -> None:
    run = loop()
    run.poison[17] = math.nan
    fault = _fault(run, 40)
    # A fault in the training, not a misconfiguration: `except GuardError` must not swallow it.
    assert isinstance(fault, FlaketriageError) and not isinstance(fault, GuardError)
    assert (fault.check, fault.step) == ("loss_nonfinite", 17)
    assert fault.where == "the model's inputs (the batch)"
    assert str(fault) == (
        "loss_nonfinite at step 17: the loss is not finite (value nan); "
        "first seen in the model's inputs (the batch)"
    )
    assert run.guard.step_index == 17  # raised inside step 17, before its update


def test_nan_gradient_names_its_parameter(loop: Callable[..., Loop]) -> None:
    run = loop()
    weight = _linear(run.model[2]).weight

    def poison_grad(_: Loop) -> None:
        weight.register_hook(lambda g: torch.where(torch.arange(g.numel()).view_as(g) == 5, math.inf, g))  # type: ignore[no-untyped-call]

    run.before_step[23] = poison_grad
    fault = _fault(run, 40)
    assert (fault.check, fault.step, fault.where) == ("grad_nonfinite", 23, "parameter 2.weight")
    assert "1 of 6 parameters" in str(fault)
    assert math.isfinite(run.losses[-1])  # the loss alone would not have shown it


def test_too_high_learning_rate_trips_the_spike_check_on_the_first_step_it_shows(
    loop: Callable[..., Loop],
) -> None:
    run = loop(lr=0.02)

    def raise_lr(r: Loop) -> None:
        for group in r.optimizer.param_groups:
            group["lr"] = 40.0

    run.before_step[80] = raise_lr
    fault = _fault(run, 120)
    # Step 80's loss and gradients come before its (too large) update; step 81 shows it.
    assert (fault.check, fault.step) == ("loss_spike", 81)
    assert "z-score" in str(fault)
    rec = run.guard.history.record(81)
    assert rec.loss_z is not None and rec.loss_z > 6


def test_gradient_spike_alone_trips_the_gradient_check(loop: Callable[..., Loop]) -> None:
    run = loop(loss_spike=None)
    run.poison[60] = 40.0  # a large but finite input: a big gradient, a finite loss
    fault = _fault(run, 80)
    assert (fault.check, fault.step) == ("grad_spike", 60)


def test_gradient_norm_bounds(loop: Callable[..., Loop]) -> None:
    run = loop(max_grad_norm=1e3, max_param_grad_norm=1e6)
    run.poison[9] = 1e4
    fault = _fault(run, 20)
    assert (fault.check, fault.step) == ("grad_norm", 9)
    run = loop(max_param_grad_norm=1e3, grad_spike=None, loss_spike=None)
    run.poison[9] = 1e4
    fault = _fault(run, 20)
    assert (fault.check, fault.step) == ("param_grad_norm", 9)
    assert fault.where is not None and fault.where.startswith("parameter ")


def test_non_finite_parameters_after_the_step(loop: Callable[..., Loop]) -> None:
    run = loop(param_every=1)

    def infinite_lr(r: Loop) -> None:
        r.optimizer.param_groups[0]["lr"] = math.inf

    run.before_step[12] = infinite_lr
    fault = _fault(run, 20)
    assert (fault.check, fault.step, fault.where) == ("param_nonfinite", 12, "parameter 0.weight")


def test_sampled_checks_run_every_k_steps(loop: Callable[..., Loop]) -> None:
    run = loop(param_every=10, grad_every=3)
    run.run(25)
    history = run.guard.stats()["history"]
    assert [r["step"] for r in history if r["param_norm"] is not None] == [0, 10, 20]
    assert [r["step"] for r in history if r["grad_norm"] is not None] == list(range(0, 25, 3))
    assert all(r["loss"] is not None for r in history)
    # the CPU defaults: each is a pass over every gradient or parameter in memory
    defaults = loop(grad_every=None).guard
    assert (defaults.grad_every, defaults.param_every) == (8, 32)


def test_a_gradient_fault_between_sampled_steps_shows_in_the_next_loss(loop: Callable[..., Loop]) -> None:
    run = loop(grad_every=8)
    weight = _linear(run.model[2]).weight

    def poison_grad(_: Loop) -> None:
        weight.register_hook(lambda g: g * math.inf)  # type: ignore[no-untyped-call]

    run.before_step[21] = poison_grad  # not a multiple of 8: its gradients are not read
    fault = _fault(run, 30)
    assert (fault.check, fault.step, fault.where) == ("loss_nonfinite", 22, "module 2 (Linear)")


def test_fp16_overflow_is_located_by_the_activation_check(loop: Callable[..., Loop]) -> None:
    run = loop(autocast=torch.float16, activation_every=1)
    run.poison[14] = 1e6  # finite in float32, past float16's 65504 after the first layer
    fault = _fault(run, 30)
    assert (fault.check, fault.step, fault.where) == ("loss_nonfinite", 14, "module 0 (Linear)")
    assert [t.check for t in run.guard.trips] == ["loss_nonfinite"]
    # the activation check saw it too, in the same call, and was queued behind the loss
    assert "activation_nonfinite" in run.guard.history.record(14).trips


def test_activation_check_names_the_module_on_sampled_steps(loop: Callable[..., Loop]) -> None:
    run = loop(activation_every=1, policy="warn", policies={"activation_nonfinite": "raise"})
    run.poison[6] = math.inf
    fault = _fault(run, 10)
    assert (fault.check, fault.step, fault.where) == ("activation_nonfinite", 6, "module 0")
    assert [t.check for t in run.guard.trips] == ["loss_nonfinite", "activation_nonfinite"]


def test_amp_skips_are_counted_not_failures(loop: Callable[..., Loop]) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
    run = loop(autocast=torch.float16, scaler=scaler, param_every=1)
    run.run(60)
    assert run.guard.trips == []
    assert run.guard.amp_skipped >= 5  # the scaler backed off from 2**24: each of those steps overflowed
    assert run.guard.stats()["history"][0]["amp_skipped"] is True


def test_repeated_amp_skips_past_the_limit_trip(loop: Callable[..., Loop]) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    run = loop(autocast=torch.float16, scaler=scaler, amp_skip_limit=4)
    weight = _linear(run.model[0]).weight

    def nan_grads_from_now_on(_: Loop) -> None:
        weight.register_hook(lambda g: g * math.nan)  # type: ignore[no-untyped-call]

    run.before_step[20] = nan_grads_from_now_on
    fault = _fault(run, 40)
    assert (fault.check, fault.step) == ("grad_nonfinite", 24)  # steps 20-23 skipped and counted
    assert "for 5 steps in a row, all skipped by the GradScaler" in str(fault)


def test_lazy_read_back_acts_one_call_later_with_the_same_traceback(loop: Callable[..., Loop]) -> None:
    run = loop(sync="lazy")
    run.poison[7] = math.nan
    fault = _fault(run, 20)
    assert (fault.check, fault.step) == ("loss_nonfinite", 7)
    assert run.guard.step_index == 8  # seen when step 8 called check_loss again
    assert fault.where is None  # the forward pass of step 7 is gone; nothing to rerun
    eager = loop()
    eager.poison[7] = math.nan
    same = _fault(eager, 20)
    assert _frames(fault) == _frames(same)


def _frames(exc: BaseException) -> list[str]:
    import traceback

    return [f"{f.filename}:{f.name}" for f in traceback.extract_tb(exc.__traceback__)]


def test_lazy_read_back_is_flushed_on_close(loop: Callable[..., Loop]) -> None:
    run = loop(sync="lazy", param_every=1)

    def infinite_lr(r: Loop) -> None:
        r.optimizer.param_groups[0]["lr"] = math.inf

    run.before_step[4] = infinite_lr
    run.run(5)  # the last step's parameters went non-finite; its read-back is still queued
    with pytest.raises(NumericFault) as caught:
        run.guard.close()
    assert (caught.value.check, caught.value.step) == ("param_nonfinite", 4)


def test_step_context_and_optimizer_hook(mlp: Callable[..., torch.nn.Sequential]) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = NumericGuard(model, opt, capture=False, loss_spike=None, grad_every=1)
    weight = _linear(model[4]).weight
    with pytest.raises(NumericFault) as caught:
        for step in range(10):
            with guard.step(batch_indices=torch.arange(4) + 4 * step):
                if step == 5:
                    weight.register_hook(lambda g: g * math.nan)  # type: ignore[no-untyped-call]
                loss = model(torch.randn(4, 8)).pow(2).mean()
                guard.check_loss(loss)
                torch.autograd.backward(loss)
                opt.step()  # the pre-hook runs the gradient checks: no after_backward needed
                opt.zero_grad()
    assert (caught.value.check, caught.value.step) == ("grad_nonfinite", 5)
    assert "_optimizer_pre_hook" in _frames(caught.value)[-3]
    assert guard._batches[5].tolist() == [20, 21, 22, 23]


def test_float_loss_piggybacks_on_an_existing_item(loop: Callable[..., Loop]) -> None:
    guard = loop().guard
    guard.check_loss(0.5)
    with pytest.raises(NumericFault):
        guard.check_loss(math.inf)


def test_spike_settings_are_validated() -> None:
    with pytest.raises(GuardError, match="cannot work"):
        Spike(z=0)
    with pytest.raises(GuardError, match="'log' or 'linear'"):
        Spike(scale="cubic")  # type: ignore[arg-type]


def test_a_model_without_trainable_parameters_is_refused() -> None:
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(GuardError, match="no trainable parameters"):
        NumericGuard(frozen, capture=False)


def test_a_guard_removes_its_hooks(loop: Callable[..., Loop]) -> None:
    run = loop(activation_every=1)
    with run.guard:
        run.run(3)
    assert not run.optimizer._optimizer_step_pre_hooks
    assert not run.model._forward_pre_hooks and not any(m._forward_hooks for m in run.model.modules())


def test_the_model_still_pickles_and_copies_with_a_guard_attached(loop: Callable[..., Loop]) -> None:
    import copy
    import io

    run = loop(activation_every=1)
    run.run(2)
    assert run.guard._probe is not None and run.guard._probe.armed  # hooks on every layer right now
    torch.save(run.model, io.BytesIO())
    twin = copy.deepcopy(run.model)
    twin(torch.randn(2, 8))  # the copy's hooks do nothing: the guard only sees its own model
    recorder = run.guard._forward
    assert recorder is not None and all(c.step == 1 for c in recorder.calls.values())
    run.run(4)


def test_stats_are_json(loop: Callable[..., Loop]) -> None:
    import json

    run = loop(policy="warn")
    run.poison[3] = math.inf
    run.run(6)
    stats: dict[str, Any] = json.loads(json.dumps(run.guard.stats(), allow_nan=False))
    assert stats["trips"][0]["check"] == "loss_nonfinite" and stats["trips"][0]["value"] in ("nan", "inf")
    assert stats["history"][3]["loss"] in ("nan", "inf")
