"""Fixtures for the guard tests: small real models, data and training loops with planted faults."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

from flaketriage.guards import NumericGuard


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Guards read FLAKETRIAGE_REPLAY; a test run inside a replay must not change them."""
    for name in [n for n in os.environ if n.startswith("FLAKETRIAGE_")]:
        monkeypatch.delenv(name)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_mlp(seed: int = 0, width: int = 32) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(8, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)
    )


@dataclass
class Loop:
    """A plain training loop on a fixed regression task, with hooks for planting faults."""

    model: nn.Sequential
    optimizer: torch.optim.Optimizer
    guard: NumericGuard
    batch: int = 16
    before_step: dict[int, Callable[[Loop], None]] = field(default_factory=dict)
    poison: dict[int, float] = field(default_factory=dict)
    """step → value written into one input element of that step's batch."""
    scaler: Any = None
    autocast: torch.dtype | None = None
    losses: list[float] = field(default_factory=list)
    next: int = 0

    def run(self, until: int) -> None:
        """Train up to (not including) step `until`, from wherever the loop stands."""
        for step in range(self.next, until):
            self.one(step)

    def data(self, step: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(self.batch, 8, generator=g)
        y = x[:, :1] * 0.5 - x[:, 1:2] * 0.25
        if step in self.poison:
            x[3, 2] = self.poison[step]
        return x, y, [step * self.batch + i for i in range(self.batch)]

    def one(self, step: int) -> None:
        self.next = step + 1
        if step in self.before_step:
            self.before_step[step](self)
        x, y, indices = self.data(step)
        with torch.autocast("cpu", dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None):
            out = self.model(x)
        loss = nn.functional.mse_loss(out.float(), y)
        self.losses.append(float(loss.detach()))
        self.guard.check_loss(loss, batch_indices=indices)
        if self.scaler is not None:
            torch.autograd.backward(self.scaler.scale(loss))
            self.guard.after_backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            torch.autograd.backward(loss)
            self.optimizer.step()
        self.guard.after_step()
        self.optimizer.zero_grad(set_to_none=True)


@pytest.fixture
def mlp() -> Callable[..., nn.Sequential]:
    return make_mlp


@pytest.fixture
def loop() -> Callable[..., Loop]:
    """``loop(**options)``: a Loop over a fresh MLP; options not named here go to NumericGuard
    (``capture`` defaults to False, ``grad_every`` to 1: these tests pin checks to exact steps)."""

    def build(
        *,
        lr: float = 0.05,
        adam: bool = False,
        scaler: Any = None,
        autocast: torch.dtype | None = None,
        **options: Any,
    ) -> Loop:
        model = make_mlp()
        optimizer: torch.optim.Optimizer = (
            torch.optim.Adam(model.parameters(), lr=lr)
            if adam
            else torch.optim.SGD(model.parameters(), lr=lr)
        )
        options.setdefault("capture", False)
        options.setdefault("grad_every", 1)
        guard = NumericGuard(model, optimizer, scaler, **options)
        return Loop(model, optimizer, guard, scaler=scaler, autocast=autocast)

    return build
