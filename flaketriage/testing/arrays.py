"""The optional numeric stack (numpy, scipy, torch), imported where used, and arrays read from it.

Assertions take torch tensors and numpy arrays alike; they compare on numpy, so a check never
needs torch unless its inputs are tensors. A missing library raises
:class:`MissingDependencyError`, which names the extra to install: ``testing`` for numpy and scipy,
``guards`` for torch.
"""

from __future__ import annotations

import sys
from typing import Any

from flaketriage.dependencies import require


def numpy() -> Any:
    return require("numpy", "testing", "ML assertions")


def torch() -> Any:
    return require("torch", "guards", "this check")


def scipy_stats() -> Any:
    return require("scipy.stats", "testing", "distribution checks")


def is_tensor(value: object) -> bool:
    """True for a ``torch.Tensor``, without importing torch when the program has not."""
    loaded = sys.modules.get("torch")
    return loaded is not None and isinstance(value, loaded.Tensor)


def as_numpy(value: Any, *, dtype: Any = None) -> Any:
    """A numpy copy or view of a tensor (detached, dense, on the CPU), an array, a list or a number."""
    np = numpy()
    if is_tensor(value):
        t = torch()
        tensor = value.detach()
        if tensor.layout != t.strided:
            tensor = tensor.to_dense()
        tensor = tensor.cpu().resolve_conj().resolve_neg()
        if tensor.is_floating_point() and tensor.dtype not in (t.float16, t.float32, t.float64):
            tensor = tensor.double()  # bfloat16 and float8 have no numpy dtype; float64 holds them exactly
        elif tensor.dtype == t.complex32:
            tensor = tensor.to(t.complex64)  # likewise, exactly
        value = tensor.numpy()
    return np.asarray(value, dtype=dtype)


def as_flat_floats(value: Any) -> Any:
    """A 1-D float64 numpy array of every element, for statistics over examples."""
    return as_numpy(value, dtype=numpy().float64).ravel()


def non_finite_summary(values: Any) -> str:
    """``3 of 500 values are not finite (first at index 17: nan)``, or "" when all are finite."""
    np = numpy()
    bad = ~np.isfinite(values)
    count = int(bad.sum())
    if count == 0:
        return ""
    first = int(np.flatnonzero(bad)[0])
    return (
        f"{count} of {values.size} values are not finite (first at index {first}: {float(values[first])!r})"
    )
