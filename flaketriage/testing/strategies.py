"""Hypothesis strategies for the inputs that break numeric code, and a finiteness check built on them.

``extreme_floats`` draws what ordinary random data never does: values at the overflow edge, deep
subnormals, signed zeros, and (on request) NaN and infinities; ``tensors`` fills torch tensors with
them; ``adversarial_gradients`` draws gradients that break optimizers and clipping (huge norms,
alternating signs, lone spikes, underflowing magnitudes). ``check_model_is_finite`` runs a model on
such inputs and reports the first non-finite output with the input that caused it.

Imported by tests only; nothing runs at import time.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from flaketriage.dependencies import require
from flaketriage.testing import arrays
from flaketriage.testing.finiteness import assert_finite_outputs

require("hypothesis", "testing", "flaketriage.testing.strategies")  # names the extra when missing
import hypothesis  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "GradientKind",
    "adversarial_gradients",
    "assert_finite_outputs",
    "check_model_is_finite",
    "extreme_floats",
    "tensors",
]

GradientKind = Literal["huge", "alternating", "spike", "tiny", "nonfinite"]

Shape = int | Sequence[int] | st.SearchStrategy[tuple[int, ...]]


@dataclass(frozen=True)
class _Format:
    """The limits of one floating-point format, as Python floats exactly representable in it."""

    name: str
    width: Literal[16, 32, 64]
    """Hypothesis draws at this width; bfloat16 draws float32 values and rounds them."""
    max: float
    tiny: float
    """The smallest positive normal number."""
    subnormal: float
    """The smallest positive subnormal number."""
    eps: float


def _bits_format(name: str, width: Literal[16, 32, 64], exponent_bits: int, mantissa_bits: int) -> _Format:
    bias = 2 ** (exponent_bits - 1) - 1
    return _Format(
        name=name,
        width=width,
        max=(2.0 - 2.0**-mantissa_bits) * 2.0**bias,
        tiny=2.0 ** (1 - bias),
        subnormal=2.0 ** (1 - bias - mantissa_bits),
        eps=2.0**-mantissa_bits,
    )


_FORMATS = {
    "float16": _bits_format("float16", 16, 5, 10),
    "bfloat16": _bits_format("bfloat16", 32, 8, 7),
    "float32": _bits_format("float32", 32, 8, 23),
    "float64": _bits_format("float64", 64, 11, 52),
}


def _format(dtype: object) -> _Format:
    name = str(dtype).removeprefix("torch.")
    if name not in _FORMATS:
        name = str(getattr(dtype, "__name__", name))  # numpy scalar types: numpy.float32
    if name not in _FORMATS:
        raise ValueError(
            f"dtype must be one of {', '.join(_FORMATS)} (a name, numpy or torch dtype), got {dtype!r}"
        )
    return _FORMATS[name]


def extreme_floats(
    dtype: object = "float32",
    *,
    allow_nan: bool = False,
    allow_infinity: bool = False,
    allow_subnormal: bool = True,
    max_magnitude: float | None = None,
) -> st.SearchStrategy[float]:
    """Floats representable in ``dtype`` that stress numeric code.

    Drawn from: signed zeros, ±1 and its neighbours, the smallest and largest normal and
    subnormal numbers and the largest finite one; magnitudes from ``sqrt(max)`` up to the largest
    (a product of two overflows); magnitudes below ``sqrt(tiny)`` (a product of two underflows),
    subnormals included unless ``allow_subnormal=False``; any value in range; and NaN and ±inf when
    allowed. ``max_magnitude`` caps every finite value (a model that is only meant to survive
    inputs up to 1e4, say). ``dtype`` is ``"float16"``, ``"bfloat16"``, ``"float32"`` or
    ``"float64"``, or the numpy or torch dtype of that name.
    """
    fmt = _format(dtype)
    if max_magnitude is not None and not max_magnitude > 0:
        raise ValueError(f"max_magnitude must be positive, got {max_magnitude}")
    top = fmt.max if max_magnitude is None else min(fmt.max, _narrow(max_magnitude, fmt, down=True))
    smallest = fmt.subnormal if allow_subnormal else fmt.tiny

    def between(low: float, high: float) -> st.SearchStrategy[float]:
        return st.floats(
            min_value=low,
            max_value=high,
            width=fmt.width,
            allow_nan=False,
            allow_infinity=False,
            allow_subnormal=None if allow_subnormal else False,  # None: whatever the range holds
        )

    specials = [0.0, -0.0, 1.0, -1.0, 1.0 + fmt.eps, 1.0 - fmt.eps / 2, fmt.tiny, fmt.tiny - fmt.subnormal]
    specials += [fmt.subnormal, top]
    kept = [v for v in specials if abs(v) <= top and (allow_subnormal or v == 0 or abs(v) >= fmt.tiny)]
    parts = [st.sampled_from(kept + [-v for v in kept if v]), between(-top, top)]
    large_from = min(_narrow(math.sqrt(top), fmt, down=False), top)
    parts += [between(large_from, top), between(-top, -large_from)]
    small_to = min(_narrow(math.sqrt(fmt.tiny), fmt, down=True), top)
    if smallest <= small_to:
        parts += [between(smallest, small_to), between(-small_to, -smallest)]
    non_finite = [math.nan] * allow_nan + [math.inf, -math.inf] * allow_infinity
    if non_finite:
        parts.append(st.sampled_from(non_finite))
    drawn = st.one_of(parts)
    return drawn.map(_to_bfloat16) if fmt.name == "bfloat16" else drawn


def tensors(
    shape: Shape,
    *,
    dtype: object = "float32",
    elements: st.SearchStrategy[float] | None = None,
    inject_nonfinite: bool = False,
) -> st.SearchStrategy[torch.Tensor]:
    """torch tensors of ``shape`` (an int, a tuple, or a strategy of tuples) and ``dtype``.

    Elements come from ``elements`` (default :func:`extreme_floats` of ``dtype``, finite);
    ``inject_nonfinite=True`` then overwrites one to four positions with NaN, inf or -inf, so every
    drawn tensor has at least one (when it has any element).
    """
    fmt = _format(dtype)
    np = arrays.numpy()
    hnp = _hypothesis_numpy()
    storage = np.float32 if fmt.name == "bfloat16" else np.dtype(fmt.name)
    drawn_shape = shape if isinstance(shape, st.SearchStrategy) else _as_shape(shape)
    values: st.SearchStrategy[Any] = hnp.arrays(
        storage, drawn_shape, elements=elements if elements is not None else extreme_floats(fmt.name)
    )
    if inject_nonfinite:
        values = _with_nonfinite(values)
    return values.map(lambda array: _to_tensor(array, fmt.name))


def adversarial_gradients(
    shape: int | Sequence[int],
    *,
    dtype: object = "float32",
    kinds: Sequence[GradientKind] = ("huge", "alternating", "spike", "tiny"),
) -> st.SearchStrategy[torch.Tensor]:
    """Gradient tensors of ``shape`` that break naive optimizers and gradient clipping.

    - ``huge``: entries of random sign with magnitudes between ``sqrt(max) / 2`` and ``max``: each
      is finite, but the squared norm of four of them overflows.
    - ``alternating``: one large magnitude with the sign flipping element by element, the gradient
      of an oscillating loss; momentum and sums of it cancel catastrophically.
    - ``spike``: zeros except one to three entries at the largest finite magnitude.
    - ``tiny``: subnormal magnitudes, which underflow to zero when squared or scaled down.
    - ``nonfinite``: an ordinary gradient with NaN or inf at a few positions (not drawn unless asked).
    """
    fmt = _format(dtype)
    dims = _as_shape(shape)
    size = math.prod(dims)
    builders = {
        "huge": _huge(fmt, size),
        "alternating": _alternating(fmt, size),
        "spike": _spike(fmt, size),
        "tiny": _tiny(fmt, size),
        "nonfinite": _nonfinite(size),
    }
    unknown = [kind for kind in kinds if kind not in builders]
    if unknown or not kinds:
        raise ValueError(f"kinds must be a non-empty selection of {', '.join(builders)}, got {list(kinds)}")
    flat = st.one_of([builders[kind] for kind in kinds])
    return flat.map(lambda values: _to_tensor(values.reshape(dims), fmt.name))


def check_model_is_finite(
    model: nn.Module | Any,
    input_shape: Shape,
    *,
    dtype: object = "float32",
    elements: st.SearchStrategy[float] | None = None,
    max_magnitude: float | None = None,
    allow_subnormal: bool = True,
    inject_nonfinite: bool = False,
    backward: bool = False,
    max_examples: int = 50,
    seed: int | None = 0,
) -> None:
    """Run ``model`` on up to ``max_examples`` extreme inputs of ``input_shape``; fail on the first
    non-finite output (or parameter gradient, with ``backward=True``).

    Inputs come from :func:`tensors` with ``elements`` (default :func:`extreme_floats` with
    ``max_magnitude`` and ``allow_subnormal``). Hypothesis shrinks a failing input to a simple one
    before reporting it; the :class:`~flaketriage.testing.NonFiniteOutputError` names the
    output, the first module that went non-finite, and the input. ``seed`` fixes the examples
    drawn, so a passing check passes on every run (``None`` draws new ones each run); no example
    database is written.
    """
    values = (
        elements
        if elements is not None
        else extreme_floats(dtype, allow_subnormal=allow_subnormal, max_magnitude=max_magnitude)
    )
    strategy = tensors(input_shape, dtype=dtype, elements=values, inject_nonfinite=inject_nonfinite)

    @hypothesis.settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        phases=[p for p in hypothesis.Phase if p is not hypothesis.Phase.explain],  # its notes are noise here
        suppress_health_check=[hypothesis.HealthCheck.too_slow, hypothesis.HealthCheck.data_too_large],
    )
    @hypothesis.given(strategy)
    def model_output_is_finite(inputs: torch.Tensor) -> None:
        assert_finite_outputs(model, inputs, backward=backward)

    run = hypothesis.seed(seed)(model_output_is_finite) if seed is not None else model_output_is_finite
    run()


def _hypothesis_numpy() -> Any:
    arrays.numpy()  # named first: hypothesis.extra.numpy fails on a missing numpy too
    return require("hypothesis.extra.numpy", "testing", "tensor strategies")


def _as_shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)


def _narrow(value: float, fmt: _Format, *, down: bool) -> float:
    """A positive ``value`` as a number of ``fmt``: the nearest one toward zero (``down``) or away."""
    code = {16: "e", 32: "f", 64: "d"}[fmt.width]
    try:
        narrowed: float = struct.unpack(code, struct.pack(code, value))[0]
    except OverflowError:  # beyond float16's range: the caller caps at the format's max anyway
        return math.inf
    if narrowed != value and math.isfinite(narrowed) and (narrowed > value) == down:
        narrowed = _next_toward(narrowed, 0.0 if down else math.inf, code)
    if fmt.name != "bfloat16" or not math.isfinite(narrowed):
        return narrowed
    (bits,) = struct.unpack("<I", struct.pack("<f", narrowed))
    truncated = bits & 0xFFFF0000  # toward zero, for a positive number
    if not down and truncated != bits:
        truncated += 0x10000
    bfloat: float = struct.unpack("<f", struct.pack("<I", truncated))[0]
    return bfloat


def _next_toward(value: float, target: float, code: str) -> float:
    np = arrays.numpy()
    kind = {"e": np.float16, "f": np.float32, "d": np.float64}[code]
    return float(np.nextafter(kind(value), kind(target)))


def _to_bfloat16(value: float) -> float:
    """``value`` (a float32) rounded to the nearest bfloat16, ties to even, as torch rounds."""
    if math.isnan(value):
        return value
    (bits,) = struct.unpack("<I", struct.pack("<f", value))
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    rounded: float = struct.unpack("<f", struct.pack("<I", bits))[0]
    return rounded


def _to_tensor(array: Any, dtype: str) -> torch.Tensor:
    th = arrays.torch()
    tensor = th.from_numpy(
        arrays.numpy().array(array, dtype=arrays.numpy().float32 if dtype == "bfloat16" else dtype)
    )
    return tensor.to(th.bfloat16) if dtype == "bfloat16" else tensor  # type: ignore[no-any-return]


def _with_nonfinite(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    @st.composite
    def inject(draw: st.DrawFn) -> Any:
        array = draw(values).copy()
        if array.size:
            flat = array.reshape(-1)
            for position in draw(_positions(array.size, 4)):
                flat[position] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        return array

    return inject()


def _huge(fmt: _Format, size: int) -> st.SearchStrategy[Any]:
    scale = st.floats(min_value=math.sqrt(fmt.max), max_value=fmt.max)
    magnitudes = _float64s(size, st.floats(min_value=0.5, max_value=1.0))
    return st.builds(lambda s, m, signs: s * m * signs, scale, magnitudes, _signs(size))


def _alternating(fmt: _Format, size: int) -> st.SearchStrategy[Any]:
    np = arrays.numpy()
    pattern = np.where(np.arange(size) % 2 == 0, 1.0, -1.0)
    return st.floats(min_value=1.0, max_value=fmt.max).map(lambda m: m * pattern)


def _spike(fmt: _Format, size: int) -> st.SearchStrategy[Any]:
    @st.composite
    def spike(draw: st.DrawFn) -> Any:
        values = arrays.numpy().zeros(size)
        for position in draw(_positions(size, 3)):
            values[position] = fmt.max if draw(st.booleans()) else -fmt.max
        return values

    return spike()


def _tiny(fmt: _Format, size: int) -> st.SearchStrategy[Any]:
    magnitudes = _float64s(size, st.floats(min_value=fmt.subnormal, max_value=fmt.tiny))
    return st.builds(lambda m, signs: m * signs, magnitudes, _signs(size))


def _nonfinite(size: int) -> st.SearchStrategy[Any]:
    return _with_nonfinite(_float64s(size, st.floats(min_value=-1.0, max_value=1.0)))


def _float64s(size: int, elements: st.SearchStrategy[float]) -> st.SearchStrategy[Any]:
    return _hypothesis_numpy().arrays(arrays.numpy().float64, size, elements=elements)  # type: ignore[no-any-return]


def _signs(size: int) -> st.SearchStrategy[Any]:
    return _float64s(size, st.sampled_from([1.0, -1.0]))


def _positions(size: int, most: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, size - 1), min_size=1, max_size=min(most, size), unique=True)
