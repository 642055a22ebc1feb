"""Hypothesis strategies for extreme inputs, and the finiteness checks built on them, on real torch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from torch import nn

from flaketriage.testing import NonFiniteOutputError, assert_finite_outputs
from flaketriage.testing.strategies import (
    adversarial_gradients,
    check_model_is_finite,
    extreme_floats,
    tensors,
)

DTYPES = ["float16", "bfloat16", "float32", "float64"]

deterministic = settings(max_examples=150, database=None, derandomize=True, deadline=None)


def representable(value: float, dtype: str) -> bool:
    if math.isnan(value):
        return True
    stored = torch.tensor([value], dtype=torch.float64).to(getattr(torch, dtype)).double().item()
    return stored == value or (stored == 0.0 and value == 0.0)


# --- extreme_floats -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_extreme_floats_are_exact_in_their_dtype_and_reach_both_ends(dtype: str) -> None:
    info = torch.finfo(getattr(torch, dtype))
    seen: list[float] = []

    @deterministic
    @given(extreme_floats(dtype))
    def collect(value: float) -> None:
        assert math.isfinite(value)
        assert representable(value, dtype)
        seen.append(value)

    collect()
    magnitudes = [abs(v) for v in seen]
    assert any(m >= math.sqrt(info.max) for m in magnitudes)  # squaring overflows
    assert any(0 < m < info.smallest_normal for m in magnitudes)  # subnormals
    assert any(v == 0 and math.copysign(1, v) < 0 for v in seen)  # -0.0
    assert max(magnitudes) == info.max


def test_nan_and_infinity_only_when_allowed() -> None:
    seen: list[float] = []

    @deterministic
    @given(extreme_floats("float32", allow_nan=True, allow_infinity=True))
    def collect(value: float) -> None:
        seen.append(value)

    collect()
    assert any(math.isnan(v) for v in seen) and math.inf in seen and -math.inf in seen


@pytest.mark.parametrize("dtype", DTYPES)
def test_max_magnitude_and_no_subnormals(dtype: str) -> None:
    smallest_normal = torch.finfo(getattr(torch, dtype)).smallest_normal

    @deterministic
    @given(extreme_floats(dtype, allow_subnormal=False, max_magnitude=1e4))
    def check(value: float) -> None:
        assert abs(value) <= 1e4 and representable(value, dtype)
        assert value == 0 or abs(value) >= smallest_normal

    check()


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="dtype must be one of"):
        extreme_floats("int8")


# --- tensors --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensors_have_the_requested_shape_and_dtype(dtype: str) -> None:
    @settings(max_examples=20, database=None, derandomize=True, deadline=None)
    @given(tensors((3, 4), dtype=dtype))
    def check(tensor: torch.Tensor) -> None:
        assert tensor.shape == (3, 4) and tensor.dtype == getattr(torch, dtype)
        assert torch.isfinite(tensor).all()

    check()


@settings(max_examples=30, database=None, derandomize=True, deadline=None)
@given(tensors(st.tuples(st.integers(1, 3), st.integers(1, 5)), dtype="bfloat16", inject_nonfinite=True))
def test_injected_tensors_always_hold_a_non_finite_value(tensor: torch.Tensor) -> None:
    assert tensor.dtype == torch.bfloat16
    assert not torch.isfinite(tensor).all()


# --- adversarial gradients ------------------------------------------------------------------------


@settings(max_examples=40, database=None, derandomize=True, deadline=None)
@given(adversarial_gradients((6, 5), kinds=["huge"]))
def test_huge_gradients_are_finite_but_their_squared_norm_overflows(gradient: torch.Tensor) -> None:
    assert gradient.shape == (6, 5) and torch.isfinite(gradient).all()
    assert torch.isinf((gradient * gradient).sum())


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_kind_of_gradient_has_the_shape_and_dtype(dtype: str) -> None:
    kinds: list[str] = []

    @settings(max_examples=60, database=None, derandomize=True, deadline=None)
    @given(adversarial_gradients(7, dtype=dtype, kinds=["huge", "alternating", "spike", "tiny", "nonfinite"]))
    def check(gradient: torch.Tensor) -> None:
        assert gradient.shape == (7,) and gradient.dtype == getattr(torch, dtype)
        if not torch.isfinite(gradient).all():
            kinds.append("nonfinite")

    check()
    assert "nonfinite" in kinds


def normalized_sgd_step(parameter: nn.Parameter, lr: float, eps: float) -> None:
    """Normalized gradient descent (LARS-style): step along g / ‖g‖."""
    assert parameter.grad is not None
    with torch.no_grad():
        parameter.sub_(lr * parameter.grad / (parameter.grad.norm() + eps))


def test_normalizing_a_gradient_without_eps_breaks_on_underflow() -> None:
    # ‖g‖ of subnormal entries squares to zero in float32, so g / ‖g‖ divides by zero. Finding the
    # failure is the point here, not shrinking it.
    @settings(max_examples=100, database=None, derandomize=True, deadline=None, phases=[Phase.generate])
    @given(adversarial_gradients((4, 4)))
    def step_stays_finite(gradient: torch.Tensor) -> None:
        parameter = nn.Parameter(torch.zeros(4, 4))
        parameter.grad = gradient.clone()
        normalized_sgd_step(parameter, lr=0.1, eps=0.0)
        assert torch.isfinite(parameter).all()

    with pytest.raises(AssertionError):
        step_stays_finite()


@settings(max_examples=50, database=None, derandomize=True, deadline=None)
@given(adversarial_gradients((4, 4)))
def test_clipping_then_sgd_keeps_parameters_finite(gradient: torch.Tensor) -> None:
    parameter = nn.Parameter(torch.zeros(4, 4))
    parameter.grad = gradient.clone()
    nn.utils.clip_grad_norm_([parameter], max_norm=1.0)
    torch.optim.SGD([parameter], lr=0.1).step()
    assert torch.isfinite(parameter).all()


# --- finite outputs -------------------------------------------------------------------------------


class Softmax(nn.Module):
    """softmax written from its definition, without subtracting the maximum first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)


def test_finite_outputs_pass_and_a_non_finite_one_names_module_and_input() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), Softmax())
    assert_finite_outputs(model, torch.randn(2, 3))
    inputs = torch.tensor([[100.0, 0.0, 0.0], [0.0, 1.0, 2.0]])
    with pytest.raises(NonFiniteOutputError) as caught:
        assert_finite_outputs(nn.Sequential(nn.Identity(), Softmax()), inputs, seed=5)
    err = caught.value
    assert isinstance(err, AssertionError)
    assert err.module == "1 (Softmax)"
    message = str(err)
    assert "output: 1 of 6 values are not finite (first at index [0, 0]: nan)" in message
    assert (
        "input 0: shape [2, 3], dtype torch.float32: min 0.0, max 100.0, 0 NaN, 0 inf, 0 subnormal" in message
    )
    assert "values: [[100.0, 0.0, 0.0], [0.0, 1.0, 2.0]]" in message
    assert "seed: 5" in message


def test_nested_outputs_are_searched() -> None:
    def model(x: torch.Tensor) -> dict[str, object]:
        return {"logits": x, "aux": (x, x.log())}

    with pytest.raises(NonFiniteOutputError, match=r"output\['aux'\]\[1\]: 1 of 2 values"):
        assert_finite_outputs(model, torch.tensor([1.0, -1.0]))


def test_check_model_is_finite_finds_layer_norm_overflow_and_shows_the_input() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 2))
    with pytest.raises(NonFiniteOutputError) as caught:
        check_model_is_finite(model, (4, 8), max_examples=30)
    message = str(caught.value)
    assert "first module with a non-finite output: 1 (LayerNorm)" in message  # its variance overflows
    assert "input 0: shape [4, 8], dtype torch.float32" in message
    assert any("model_output_is_finite" in note for note in getattr(caught.value, "__notes__", []))


def test_check_model_is_finite_passes_within_the_stated_range() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 2))
    check_model_is_finite(model, (4, 8), max_magnitude=1e4, max_examples=30)
    check_model_is_finite(
        nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2)), (4, 8), max_examples=30
    )


class Distance(nn.Module):
    """Euclidean length of a projection, as sqrt of a sum of squares: its gradient at 0 is 0/0."""

    def __init__(self) -> None:
        super().__init__()
        self.project = nn.Linear(4, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt((self.project(x) ** 2).sum(-1))


def test_backward_catches_a_non_finite_parameter_gradient() -> None:
    torch.manual_seed(0)
    with pytest.raises(NonFiniteOutputError, match=r"gradient of project\.weight"):
        check_model_is_finite(Distance(), (2, 4), backward=True, max_magnitude=1e3, max_examples=30)


@settings(max_examples=5, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors(3, dtype=np.float32))
def test_numpy_dtypes_are_accepted(tensor: torch.Tensor) -> None:
    assert tensor.dtype == torch.float32
