"""Fault location: rerun the failing step's forward pass, hooked everywhere, and say where
non-finite values first appear.

`ForwardRecorder` keeps references (no copies) to the inputs, RNG state and autocast state of the
step's first training call of the model, or, once a step has passed without one (a
LightningModule's ``training_step`` calls its submodules), of each direct child. A hooked module
takes a slower path through ``Module.__call__``, so children are only hooked when needed. After a trip,
`locate_nonfinite` reruns those calls without gradients, with the program's own hooks silenced
and buffers restored afterwards, and names the first module whose output went non-finite from
finite inputs. It syncs; it only runs on the slow path.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from flaketriage.guards.activations import Hook, cuda_ready, norm_of

BATCH = "the model's inputs (the batch)"


@dataclass
class _Call:
    step: int
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    rng_cpu: torch.Tensor
    rng_cuda: torch.Tensor | None
    autocast: tuple[bool, torch.dtype] | None


class ForwardRecorder:
    """The first training call, per step, of the model (or of its direct children)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.step = 0
        """The guard's step number; calls of an earlier step are forgotten."""
        self.calls: dict[str, _Call] = {}
        self._device_type = next((p.device.type for p in model.parameters()), "cpu")
        self._handles = [model.register_forward_pre_hook(Hook(self._hook("")), with_kwargs=True)]
        self._children_hooked = False

    def end_step(self) -> None:
        """After a step: if the model itself was not called, hook its children from now on."""
        if (
            self._children_hooked
            or not self._handles
            or any(c.step == self.step for c in self.calls.values())
        ):
            return
        self._children_hooked = True
        for name, child in self.model.named_children():
            self._handles.append(child.register_forward_pre_hook(Hook(self._hook(name)), with_kwargs=True))

    def _hook(self, name: str) -> Any:
        def record(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not torch.is_grad_enabled():
                return  # an evaluation pass
            calls = self.calls
            if calls and next(iter(calls.values())).step != self.step:
                calls.clear()
            if name in calls or "" in calls:
                return  # inside the model's own call, or a child called again
            dev = self._device_type
            cuda = torch.cuda.get_rng_state() if dev == "cuda" and cuda_ready() else None
            autocast = None
            if dev in ("cpu", "cuda"):
                autocast = (torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
            calls[name] = _Call(self.step, args, dict(kwargs), torch.get_rng_state(), cuda, autocast)

        return record

    def for_step(self, step: int) -> list[tuple[str, _Call]]:
        """The calls to rerun for `step`, in the order they ran (none if that step is gone)."""
        calls = [(n, c) for n, c in self.calls.items() if c.step == step]
        root = [(n, c) for n, c in calls if n == ""]
        return root or calls

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.calls = {}


_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
)


@contextlib.contextmanager
def _only_own_hooks(model: torch.nn.Module) -> Iterator[None]:
    """The rerun must not call the program's own forward hooks (logging, feature taps, this
    guard's recorder): each module gets empty hook tables for its duration, then its own back."""
    saved = [(m, {k: getattr(m, k) for k in _HOOK_DICTS if hasattr(m, k)}) for m in model.modules()]
    for module, tables in saved:
        for key, table in tables.items():
            setattr(module, key, type(table)())
    try:
        yield
    finally:
        for module, tables in saved:
            for key, table in tables.items():
                setattr(module, key, table)


def _finite(value: Any) -> bool:
    norm = norm_of(value)
    return norm is None or math.isfinite(float(norm))


def locate_nonfinite(recorder: ForwardRecorder, step: int) -> str | None:
    """Where non-finite values first appear in `step`'s forward pass; None when its outputs are
    finite (the loss function made them) or nothing of that step was recorded."""
    model = recorder.model
    modules = dict(model.named_modules())
    buffers = {k: b.detach().clone() for k, b in model.named_buffers()}
    try:
        for i, (name, call) in enumerate(recorder.for_step(step)):
            if not _finite(call.args) or not _finite(call.kwargs):
                return BATCH if i == 0 else f"input of {name}"
            found = _rerun(model, modules[name], name, call)
            if found:
                return found
    except Exception:  # the rerun is best effort: a trip must not turn into another error
        return None
    finally:
        with torch.no_grad():
            for k, b in model.named_buffers():
                b.copy_(buffers[k])
    return None


def _rerun(model: torch.nn.Module, target: torch.nn.Module, prefix: str, call: _Call) -> str | None:
    found: list[str] = []

    def hook(name: str) -> Any:
        def check(m: torch.nn.Module, args: Any, output: Any) -> None:
            if not found and not _finite(output):
                found.append(f"module {name} ({type(m).__name__})" if _finite(args) else f"input of {name}")

        return check

    devices = [torch.cuda.current_device()] if call.rng_cuda is not None else []
    device_type = "cuda" if call.rng_cuda is not None else "cpu"
    with _only_own_hooks(model), torch.random.fork_rng(devices=devices), torch.no_grad():
        for name, module in target.named_modules(prefix=prefix):
            module.register_forward_hook(hook(name))
        torch.set_rng_state(call.rng_cpu)
        if call.rng_cuda is not None:
            torch.cuda.set_rng_state(call.rng_cuda)
        enabled, dtype = call.autocast or (False, torch.float32)
        with torch.autocast(device_type, dtype=dtype, enabled=enabled):
            target(*call.args, **call.kwargs)
    return found[0] if found else None
