"""The last good training state, for the ``restore`` policy: model, optimizer and scaler state
copied to host memory every few steps, kept once the guard has seen that step pass."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Snapshot:
    step: int
    state: dict[str, Any]


def to_cpu(value: Any) -> Any:
    """A copy of `value` (nested dicts, lists, tuples of tensors) with every tensor in host memory."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_cpu(v) for v in value)
    return copy.deepcopy(value)


class Snapshots:
    """Candidates wait until their step is known to be clean (at once on the CPU, when the lazy
    read-back arrives on a GPU); the newest clean one is `good`."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scaler: Any) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.good: Snapshot | None = None
        self._candidates: dict[int, Snapshot] = {}

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"model": to_cpu(self.model.state_dict())}
        if self.optimizer is not None:
            state["optimizer"] = to_cpu(self.optimizer.state_dict())
        if self.scaler is not None and self.scaler.is_enabled():
            state["scaler"] = copy.deepcopy(self.scaler.state_dict())
        return state

    def take(self, step: int) -> None:
        self._candidates[step] = Snapshot(step, self.state())

    def confirm(self, step: int, clean: bool) -> None:
        candidate = self._candidates.pop(step, None)
        if candidate is not None and clean:
            self.good = candidate
        for old in [s for s in self._candidates if s < step]:
            del self._candidates[old]

    def load(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and "optimizer" in state:
            # load_state_dict keeps tensors that need no cast, so hand it a copy: the optimizer
            # updates its state in place and must not write into the snapshot.
            self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])

    def restore(self) -> tuple[int, Callable[[], None]] | None:
        """Load the good state; returns its step and an undo that reloads what was replaced."""
        if self.good is None:
            return None
        replaced = self.state()
        self.load(self.good.state)
        return self.good.step, lambda: self.load(replaced)
