"""Finite outputs: run a model on given inputs and fail on the first NaN or infinity it produces.

The failure names the output and element that went non-finite, the first module (in execution
order) whose output did, and the input that caused it, so a Hypothesis counterexample reads as a
bug report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from flaketriage.testing import arrays
from flaketriage.testing.failure import Context, MLAssertionError, run_description

if TYPE_CHECKING:
    import torch
    from torch import nn

SHOWN_ELEMENTS = 64
"""Inputs up to this many elements are printed in full in a failure message."""


class NonFiniteOutputError(MLAssertionError):
    """A model produced NaN or infinity; ``module`` is the first module whose output did."""

    def __init__(self, message: str, module: str | None = None) -> None:
        super().__init__(message)
        self.module = module


def assert_finite_outputs(
    model: nn.Module | Any,
    inputs: Any,
    *,
    backward: bool = False,
    seed: int | None = None,
    context: Context = None,
) -> None:
    """Run ``model(*inputs)`` (``model(inputs)`` for a single tensor) and fail if any output is NaN
    or infinite; with ``backward=True``, also backpropagate the sum of the outputs and fail if a
    parameter's gradient is.

    Outputs may be tensors or nested tuples, lists and dicts of them. The message names the first
    non-finite output element, the first module whose output was non-finite (for an
    ``nn.Module``), and describes each input (shape, dtype, range, counts of NaN, infinities and
    subnormals, and its values when it has at most :data:`SHOWN_ELEMENTS` elements).
    """
    th = arrays.torch()
    args = inputs if isinstance(inputs, tuple | list) else (inputs,)
    tracker = _FirstNonFinite()
    grad = nullcontext() if backward else th.no_grad()
    with grad, tracker.watching(model):
        output = model(*args)
    problem = _first_non_finite(output, "output")
    if problem is None and backward:
        problem = _backward(th, model, output)
    if problem is None:
        return
    lines = [f"model output is not finite: {problem}"]
    if tracker.module is not None:
        lines.append(f"first module with a non-finite output: {tracker.module}")
    lines += [_describe_input(i, value) for i, value in enumerate(args)]
    raise NonFiniteOutputError("\n".join(lines) + "\n" + run_description(seed, context), tracker.module)


@contextmanager
def module_outputs(model: nn.Module, on_output: Callable[[str, nn.Module, Any], None]) -> Iterator[None]:
    """Forward hooks on every module of `model` that pass (name, module, output) to `on_output`.

    The root module's name is ``""``. The hooks are removed when the block ends.
    """
    handles = [
        module.register_forward_hook(lambda m, _inputs, output, n=name: on_output(n, m, output))
        for name, module in model.named_modules()
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class _FirstNonFinite:
    """Forward hooks that remember the first module, in execution order, with a non-finite output."""

    def __init__(self) -> None:
        self.module: str | None = None

    @contextmanager
    def watching(self, model: Any) -> Iterator[None]:
        th = arrays.torch()
        if not isinstance(model, th.nn.Module):
            yield
            return
        with module_outputs(model, self._seen):
            yield

    def _seen(self, name: str, module: nn.Module, output: Any) -> None:
        if self.module is None and _first_non_finite(output, "") is not None:
            self.module = f"{name or '(model)'} ({type(module).__name__})"


def _first_non_finite(value: Any, path: str) -> str | None:
    """``output[1]: 3 of 8 values are not finite (first at index [0, 2]: inf)``, or None."""
    th = arrays.torch()
    if isinstance(value, th.Tensor):
        if not (value.is_floating_point() or value.is_complex()):
            return None
        bad = ~th.isfinite(value.detach())
        count = int(bad.sum())
        if count == 0:
            return None
        index = [int(i) for i in th.nonzero(bad)[0]] if value.dim() else []
        element = value.detach()[tuple(index)].item()
        where = f"first at index {index}: {element!r}"
        return f"{path}: {count} of {value.numel()} values are not finite ({where})"
    if isinstance(value, tuple | list):
        items: Any = enumerate(value)
    elif isinstance(value, dict):
        items = value.items()
    else:
        return None
    for key, item in items:
        found = _first_non_finite(item, f"{path}[{key!r}]")
        if found is not None:
            return found
    return None


def _backward(th: Any, model: Any, output: Any) -> str | None:
    leaves = [t for t in _tensors(output) if t.requires_grad and t.is_floating_point()]
    if not leaves:
        return None
    th.autograd.backward([leaf.sum() for leaf in leaves])
    if not isinstance(model, th.nn.Module):
        return None
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            found = _first_non_finite(parameter.grad, f"gradient of {name}")
            if found is not None:
                return found
    return None


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    th = arrays.torch()
    if isinstance(value, th.Tensor):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _describe_input(position: int, value: Any) -> str:
    th = arrays.torch()
    if not isinstance(value, th.Tensor):
        return f"input {position}: {value!r}"
    head = f"input {position}: shape {list(value.shape)}, dtype {value.dtype}"
    if not value.is_floating_point() or value.numel() == 0:
        return head
    data = value.detach().double()
    finite = data[th.isfinite(data)]
    magnitude = data.abs()
    tiny = th.finfo(value.dtype).tiny
    counts = (
        f"{int(th.isnan(data).sum())} NaN, {int(th.isinf(data).sum())} inf, "
        f"{int(((magnitude > 0) & (magnitude < tiny)).sum())} subnormal"
    )
    span = f"min {finite.min().item()!r}, max {finite.max().item()!r}, " if finite.numel() else ""
    text = f"{head}: {span}{counts}"
    if value.numel() <= SHOWN_ELEMENTS:
        same = bool((data == data.reshape(-1)[0]).all())
        shown = f"all {data.reshape(-1)[0].item()!r}" if same else repr(data.tolist())
        text += f"\n  values: {shown}"
    return text
