"""Each policy does what it says, logs it, and can be reverted."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
import torch

from flaketriage.errors import GuardError
from flaketriage.guards import (
    ClipGradients,
    LowerLossScale,
    NumericFault,
    NumericGuard,
    RestoreLastGood,
    RunInFP32,
    SkipStep,
)

if TYPE_CHECKING:
    from conftest import Loop  # tests/ci/guards/conftest.py

Model = Callable[..., torch.nn.Sequential]


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_raise_is_the_default(loop: Callable[..., Loop]) -> None:
    run = loop()
    run.poison[2] = math.nan
    with pytest.raises(NumericFault):
        run.run(5)
    assert [(a.policy, a.step) for a in run.guard.actions] == [("raise", 2)]


def test_warn_logs_and_goes_on(loop: Callable[..., Loop], caplog: pytest.LogCaptureFixture) -> None:
    run = loop(policy="warn")
    run.poison[2] = math.nan
    run.run(5)
    assert [(t.step, t.check) for t in run.guard.trips][:2] == [(2, "loss_nonfinite"), (2, "grad_nonfinite")]
    assert {a.policy for a in run.guard.actions} == {"warn"}
    assert "loss_nonfinite at step 2" in caplog.text


def test_skip_leaves_parameters_and_optimizer_state_untouched(loop: Callable[..., Loop]) -> None:
    run = loop(adam=True, lr=1e-2, policy="skip")
    model, opt, guard = run.model, run.optimizer, run.guard
    run.poison[6] = math.nan
    run.run(6)
    before, moments = _params(model), [s["exp_avg"].clone() for s in opt.state.values()]
    run.one(6)
    assert _same(before, _params(model))
    assert all(torch.equal(m, s["exp_avg"]) for m, s in zip(moments, opt.state.values(), strict=True))
    run.run(12)  # and training goes on, every later step finite
    assert all(math.isfinite(v) for v in run.losses[7:])
    assert [(a.policy, a.check, a.detail) for a in guard.actions][:1] == [
        ("skip", "loss_nonfinite", "update of this step dropped")
    ]


def test_skip_cannot_undo_an_applied_step(mlp: Model) -> None:
    with pytest.raises(GuardError, match="nothing left to skip"):
        NumericGuard(mlp(), capture=False, policies={"param_nonfinite": SkipStep()})


def test_lower_loss_scale_at_the_end_of_the_step_and_revert(loop: Callable[..., Loop]) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    run = loop(
        autocast=torch.float16, scaler=scaler, policies={"loss_nonfinite": ["lower_loss_scale", "skip"]}
    )
    run.poison[5] = math.nan
    run.run(5)
    before = scaler.get_scale()
    run.one(5)
    # the scaler itself backs off once (the step overflowed), the policy halves it again
    assert scaler.get_scale() == before * 0.25
    action = run.guard.actions[0]
    assert (
        action.policy == "lower_loss_scale"
        and action.detail == f"loss scale {before / 2:g} -> {before / 4:g}"
    )
    action.revert()
    assert scaler.get_scale() == before * 0.5 and action.reverted and not action.reversible


def test_lower_loss_scale_needs_a_scaler(mlp: Model) -> None:
    with pytest.raises(GuardError, match="GradScaler"):
        NumericGuard(mlp(), capture=False, policy=LowerLossScale())


def test_clip_limits_this_and_later_updates_and_reverts(loop: Callable[..., Loop]) -> None:
    run = loop(max_grad_norm=10.0, policies={"grad_norm": ClipGradients(max_norm=0.5)}, lr=0.1)
    run.poison[8] = 1e4
    run.run(8)
    before = _params(run.model)
    run.one(8)
    moved = math.sqrt(
        sum(float((a - b).pow(2).sum()) for a, b in zip(_params(run.model), before, strict=True))
    )
    assert moved <= 0.1 * 0.5 + 1e-6  # lr x the clipped norm
    assert run.guard._clip == 0.5
    run.guard.actions[0].revert()
    assert run.guard._clip is None


def test_fp32_runs_named_modules_without_autocast_and_reverts(loop: Callable[..., Loop]) -> None:
    run = loop(autocast=torch.float16, policy="warn", policies={"loss_nonfinite": [RunInFP32(["0"]), "skip"]})
    seen: list[tuple[torch.dtype, bool]] = []
    run.model[0].register_forward_hook(lambda m, i, out: seen.append((out.dtype, bool(out.isfinite().all()))))
    run.poison[4] = 1e6  # overflows float16 in layer 0
    run.poison[7] = 1e6  # no longer overflows layer 0, which now runs in float32
    run.run(10)
    assert [d for d, _ in seen] == [torch.float16] * 5 + [torch.float32] * 5
    assert seen[4] == (torch.float16, False) and seen[7] == (torch.float32, True)
    assert run.guard.trips[0].step == 4
    run.guard.actions[0].revert()
    run.one(10)
    assert seen[-1][0] == torch.float16


def test_fp32_needs_module_names(mlp: Model) -> None:
    with pytest.raises(GuardError, match="not found"):
        NumericGuard(mlp(), capture=False, policy=RunInFP32(["decoder"]))
    with pytest.raises(GuardError, match="needs module names"):
        NumericGuard(mlp(), capture=False, policy="fp32")


def test_restore_loads_the_last_good_state_and_reverts(loop: Callable[..., Loop]) -> None:
    run = loop(param_every=1, snapshot_every=5, policies={"param_nonfinite": RestoreLastGood()})
    run.run(10)
    good = _params(run.model)  # the state after step 9, snapshotted there

    def infinite_lr(r: Loop) -> None:
        r.optimizer.param_groups[0]["lr"] = math.inf

    run.before_step[12] = infinite_lr
    run.run(13)
    assert _same(good, _params(run.model))
    assert run.optimizer.param_groups[0]["lr"] == 0.05  # the optimizer's state came back too
    action = run.guard.actions[0]
    assert action.detail == "restored the state saved after step 9" and action.reversible
    action.revert()
    assert not all(torch.isfinite(p).all() for p in run.model.parameters())


def test_policies_are_checked_when_the_guard_is_built(mlp: Model) -> None:
    with pytest.raises(GuardError, match="unknown policy 'explode'"):
        NumericGuard(mlp(), capture=False, policy="explode")
    with pytest.raises(GuardError, match="unknown checks"):
        NumericGuard(mlp(), capture=False, policies={"loss_is_sad": "warn"})


def test_a_replay_always_raises_and_never_captures(
    loop: Callable[..., Loop], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLAKETRIAGE_REPLAY", "1")
    run = loop(policy="skip", capture=True)
    assert run.guard.replay and run.guard._recorder is None
    assert run.guard._policies["param_nonfinite"][0].name == "raise"  # a default skip cannot act there
    run.poison[3] = math.nan
    with pytest.raises(NumericFault):
        run.run(5)
