"""Bitwise equality of tensors and arrays, with a failure message a bug report can quote.

Equal means: the same dtype and shape (and device, when both sides are torch tensors), and every
element with the same bits. Two exceptions to "the same bits", both documented on
:func:`assert_exact_equal`: NaN equals NaN at the same position whatever its sign or payload, and
``+0.0`` differs from ``-0.0`` (the bits differ, and ``1/x`` tells them apart).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from flaketriage.testing import arrays
from flaketriage.testing.failure import Context, MLAssertionError, run_description


class TensorMismatchError(MLAssertionError):
    """Two tensors or arrays that should be bitwise equal are not.

    ``index`` is the first mismatching element (row-major order), or ``None`` when the dtype, shape
    or device already differ; ``mismatches`` counts the differing elements.
    """

    def __init__(
        self,
        message: str,
        *,
        index: tuple[int, ...] | None = None,
        mismatches: int = 0,
        actual: object = None,
        expected: object = None,
    ) -> None:
        super().__init__(message)
        self.index = index
        self.mismatches = mismatches
        self.actual = actual
        self.expected = expected


def assert_exact_equal(
    actual: Any, expected: Any, *, seed: int | None = None, context: Context = None
) -> None:
    """Fail unless ``actual`` and ``expected`` are bitwise equal.

    Takes torch tensors and numpy arrays (a list or number is read with :func:`numpy.asarray`, so
    give goldens an explicit dtype). A tensor may be compared with an array: dtypes match by name
    (``torch.float32`` with ``float32``); devices are compared only when both sides are tensors.

    - NaN equals NaN at the same position, whatever its sign or payload bits: kernels do not
      promise a NaN payload, and a NaN where a NaN was expected is not a regression.
    - ``+0.0`` and ``-0.0`` differ: their bits do, and so does ``1/x``.

    The :class:`TensorMismatchError` names the first mismatching index, both values in full
    precision with their bits in hex and their distance in ULPs, the number of mismatches, the seed
    (``seed`` or ``torch.initial_seed()``) and the versions of Python, numpy, torch, CUDA and
    cuDNN.
    """
    layout = _Layout.read(actual)
    tail = run_description(seed, context)
    differences = layout.differences(_Layout.read(expected))
    if differences:
        raise TensorMismatchError(
            "not comparable element by element:\n" + "\n".join(f"  {d}" for d in differences) + "\n" + tail
        )
    got, want = _Elements.load(actual), _Elements.load(expected)
    mismatch = got.mismatches(want)
    count = int(mismatch.sum())
    if count == 0:
        return
    np = arrays.numpy()
    flat = int(np.flatnonzero(mismatch.ravel())[0])
    index = tuple(int(i) for i in np.unravel_index(flat, layout.shape)) if layout.shape else ()
    lines = [
        f"not bitwise equal: {count} of {mismatch.size} elements differ "
        f"(shape {list(layout.shape)}, dtype {layout.dtype_text}{layout.device_text})",
        f"first mismatch at index {list(index)}:",
        f"  actual:   {got.describe(index)}",
        f"  expected: {want.describe(index)}",
    ]
    distance = got.distance(want, index)
    if distance:
        lines.append(f"  distance: {distance}")
    largest = got.largest_difference(want, mismatch, index)
    if largest:
        lines.append(largest)
    raise TensorMismatchError(
        "\n".join(lines) + "\n" + tail,
        index=index,
        mismatches=count,
        actual=got.values[index].item(),
        expected=want.values[index].item(),
    )


@dataclass(frozen=True)
class _Layout:
    """What a tensor or array is, read without copying its elements (which may sit on a GPU)."""

    kind: str
    dtype: str
    shape: tuple[int, ...]
    device: str | None

    @classmethod
    def read(cls, value: Any) -> _Layout:
        if arrays.is_tensor(value):
            return cls(
                "tensor", str(value.dtype).removeprefix("torch."), tuple(value.shape), str(value.device)
            )
        array = arrays.numpy().asarray(value)
        return cls("array", array.dtype.name, array.shape, None)

    @property
    def dtype_text(self) -> str:
        return f"torch.{self.dtype}" if self.kind == "tensor" else self.dtype

    @property
    def device_text(self) -> str:
        return f", device {self.device}" if self.device else ""

    def differences(self, other: _Layout) -> list[str]:
        found = []
        if self.dtype != other.dtype:
            found.append(f"dtype: actual {self.dtype_text}, expected {other.dtype_text}")
        if self.shape != other.shape:
            found.append(f"shape: actual {list(self.shape)}, expected {list(other.shape)}")
        if self.device and other.device and self.device != other.device:
            found.append(f"device: actual {self.device}, expected {other.device}")
        return found


@dataclass(frozen=True)
class _Elements:
    """One side's elements: their values (for display) and their bits (to compare)."""

    dtype: str
    shape: tuple[int, ...]
    values: Any
    bits: Any
    """Unsigned integers holding each element's bits (a trailing axis of 2 for complex); None when
    the dtype has no fixed-width bits (strings, objects), and values are compared with ``==``."""

    @property
    def floating(self) -> bool:
        return self.values.dtype.kind in "fc"

    @classmethod
    def load(cls, value: Any) -> _Elements:
        if not arrays.is_tensor(value):
            np = arrays.numpy()
            array = np.require(np.asarray(value), requirements="C")
            return cls(array.dtype.name, array.shape, array, _numpy_bits(array))
        torch = arrays.torch()
        dense = value.detach()
        if dense.layout != torch.strided:
            dense = dense.to_dense()
        dense = dense.cpu().resolve_conj().resolve_neg().contiguous()
        dtype = str(dense.dtype).removeprefix("torch.")
        return cls(dtype, tuple(dense.shape), arrays.as_numpy(dense), _tensor_bits(dense))

    def mismatches(self, other: _Elements) -> Any:
        """A boolean array, True where the elements differ."""
        np = arrays.numpy()
        if self.bits is None or other.bits is None:
            return np.asarray(self.values != other.values, dtype=bool).reshape(self.shape)
        differ = self.bits != other.bits
        if differ.ndim > len(self.shape):
            differ = differ.any(axis=-1)
        if self.floating:
            differ &= ~(np.isnan(self.values) & np.isnan(other.values))
        return differ

    def describe(self, index: tuple[int, ...]) -> str:
        value = self.values[index].item()
        text = repr(value)  # float64's shortest round-trip repr: exact enough to tell any two floats apart
        if self.bits is not None and self.floating:
            text += f" (bits {_hex(self.bits[index], self.bit_width)})"
        return text

    @property
    def bit_width(self) -> int:
        return int(self.bits.dtype.itemsize) * 8

    def distance(self, other: _Elements, index: tuple[int, ...]) -> str:
        """How far apart two real floats are, in value and in ULPs of their dtype."""
        if self.bits is None or self.values.dtype.kind != "f":
            return ""
        a, b = float(self.values[index]), float(other.values[index])
        if not (math.isfinite(a) and math.isfinite(b)):
            return ""
        ulps = abs(
            _ordered(int(self.bits[index]), self.bit_width) - _ordered(int(other.bits[index]), self.bit_width)
        )
        if ulps == 0:
            return "+0.0 and -0.0 (equal as numbers, different bits)"
        return f"{abs(a - b):.6g} ({ulps} ULP{'s' if ulps != 1 else ''} of {self.dtype})"

    def largest_difference(self, other: _Elements, mismatch: Any, first: tuple[int, ...]) -> str:
        """The largest finite difference, when it is not at the first mismatch already shown."""
        np = arrays.numpy()
        if self.values.dtype.kind not in "fiu":
            return ""
        a = self.values.astype(np.float64)
        b = other.values.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(mismatch & np.isfinite(a) & np.isfinite(b), np.abs(a - b), -1.0)
        flat = int(np.argmax(diff))
        index = tuple(int(i) for i in np.unravel_index(flat, self.shape)) if self.shape else ()
        if diff[index] <= 0 or index == first:
            return ""
        return (
            f"largest difference: {float(diff[index]):.6g} at index {list(index)} "
            f"(actual {float(a[index])!r}, expected {float(b[index])!r})"
        )


_UNSIGNED = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def _numpy_bits(array: Any) -> Any:
    np = arrays.numpy()
    kind, size = array.dtype.kind, array.dtype.itemsize
    if kind == "c" and size // 2 in (4, 8):
        pairs = array.view(np.dtype(f"float{size * 4}")).reshape((*array.shape, 2))
        return pairs.view(np.dtype(_UNSIGNED[size // 2]))
    if kind in "fiubmM" and size in _UNSIGNED:
        return array.view(np.dtype(_UNSIGNED[size]))
    return None  # strings, objects, and float128 (whose padding bytes are not part of the value)


def _tensor_bits(tensor: Any) -> Any:
    torch = arrays.torch()
    np = arrays.numpy()
    if tensor.is_complex():
        if tensor.dtype == torch.complex32:
            tensor = tensor.to(torch.complex64)  # numpy has no complex32; the widening is exact
        tensor = torch.view_as_real(tensor)
    signed = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    size = tensor.element_size()
    if size not in signed:
        return None
    return tensor.view(signed[size]).numpy().view(np.dtype(_UNSIGNED[size]))


def _hex(bits: Any, width: int) -> str:
    if getattr(bits, "ndim", 0):  # a complex number: its real and imaginary parts
        return ", ".join(_hex(part, width) for part in bits)
    return f"0x{int(bits):0{width // 4}x}"


def _ordered(bits: int, width: int) -> int:
    """Float bits mapped to integers in the order of the floats, so ULP distance is a difference."""
    sign = 1 << (width - 1)
    return -(bits & (sign - 1)) if bits & sign else bits
