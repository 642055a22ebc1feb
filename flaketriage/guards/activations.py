"""Activation checks: output norms of chosen modules, on sampled steps; and the module hooks the
guard attaches (`Hook`), which copies and pickles of the model drop.

`ActivationProbe` hooks the modules only on sampled steps (a hook on every module costs a slow
path in ``Module.__call__`` even when it does nothing) and collects each module's output norm into
one small tensor, in the order the modules ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

_HALF = (torch.float16, torch.bfloat16)


class Hook:
    """A module hook that a copy or a pickle of the model turns into a no-op: ``torch.save(model)``
    and ``copy.deepcopy(model)`` keep working while a guard is attached, and a copy of the model
    never reports into the guard of the original."""

    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> None:
        self.fn(*args)

    def __reduce__(self) -> tuple[type[_NoHook], tuple[()]]:
        return (_NoHook, ())


class _NoHook:
    def __call__(self, *args: Any) -> None:
        return None


def cuda_ready() -> bool:
    """CUDA is usable and this process has already initialized it (so asking costs nothing)."""
    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def iter_tensors(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """The floating tensors in a module's output: a tensor, or tuples, lists and dicts of them."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex():
            yield value
    elif depth < 3 and isinstance(value, list | tuple):
        for v in value:
            yield from iter_tensors(v, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for v in value.values():
            yield from iter_tensors(v, depth + 1)


def norm_of(value: Any) -> torch.Tensor | None:
    """The L2 norm of all floating tensors in `value`, float32, on their device; no host sync."""
    squares: list[torch.Tensor] = []
    for t in iter_tensors(value):
        t = t.detach()
        if t.device.type == "cpu" and t.dtype not in _HALF and not t.is_complex():
            flat = t.reshape(-1)
            squares.append(torch.dot(flat, flat).float())
        else:
            squares.append(torch.linalg.vector_norm(t, dtype=torch.float32).square())
    if not squares:
        return None
    total = squares[0] if len(squares) == 1 else torch.stack(squares).sum()
    return total.sqrt()


class ActivationProbe:
    """Output norms of the chosen modules, on armed steps only."""

    def __init__(self, model: torch.nn.Module, modules: Sequence[str] | None) -> None:
        named = dict(model.named_modules())
        if modules is None:
            # Leaf modules: their outputs are every value the network computes with parameters.
            chosen = [(n, m) for n, m in named.items() if n and not any(True for _ in m.children())]
        else:
            chosen = [(n, named[n]) for n in modules]
        self.modules = chosen
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self.names: list[str] = []
        self.norms: list[torch.Tensor] = []

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self) -> None:
        if self._handles:
            return
        self.names, self.norms = [], []
        for name, module in self.modules:
            self._handles.append(module.register_forward_hook(Hook(self._hook(name))))

    def disarm(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if not torch.is_grad_enabled():
                return  # an evaluation pass between training steps
            norm = norm_of(output)
            if norm is not None:
                self.names.append(name)
                self.norms.append(norm)

        return hook

    def collect(self) -> tuple[list[str], torch.Tensor | None]:
        """The names and norms recorded since `arm`, in the order the modules ran; then disarm."""
        self.disarm()
        names, norms = self.names, self.norms
        self.names, self.norms = [], []
        if not norms:
            return names, None
        device = norms[0].device
        return names, torch.stack([n.to(device, non_blocking=True) for n in norms])
