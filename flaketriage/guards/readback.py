"""Reading a step's statistics back to the host without stalling the device.

``sync="step"`` reads each stage's small tensor as soon as it is computed: free on the CPU, one
host sync per stage on a GPU. ``sync="lazy"`` concatenates a step's tensors into one, copies it
into pinned memory with ``non_blocking=True`` and records a CUDA event; later calls poll the event
(``Event.query`` never blocks) and hand over the steps whose copy has landed, oldest first.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import torch

from flaketriage.guards.checks import Point

Sync = Literal["auto", "step", "lazy"]
Stage = Literal["loss", "activations", "amp", "grads", "params"]


@dataclass
class StageTensor:
    """One stage's statistics for one step, and the guard call that produced it."""

    stage: Stage
    point: Point
    values: torch.Tensor


@dataclass
class Reading:
    """A step's statistics on the host: each stage's values as Python floats."""

    step: int
    stages: list[tuple[Stage, Point, list[float]]] = field(default_factory=list)


@dataclass
class _InFlight:
    step: int
    layout: list[tuple[Stage, Point, int]]
    host: torch.Tensor
    event: torch.cuda.Event | None


class LazyReadback:
    """Asynchronous copies of whole steps; `poll` returns the ones that have arrived."""

    def __init__(self, max_in_flight: int = 64) -> None:
        self.max_in_flight = max_in_flight
        self._in_flight: deque[_InFlight] = deque()

    def submit(self, step: int, tensors: list[StageTensor]) -> None:
        if not tensors:
            return
        device = tensors[0].values.device
        flat = torch.cat([t.values.reshape(-1).to(device, torch.float32) for t in tensors])
        layout = [(t.stage, t.point, t.values.numel()) for t in tensors]
        if device.type == "cuda":
            host = torch.empty(flat.shape, dtype=torch.float32, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
        else:
            host, event = flat, None
        self._in_flight.append(_InFlight(step, layout, host, event))

    def poll(self, *, wait: bool = False) -> list[Reading]:
        """Readings whose copies have completed, oldest first; `wait` (or a full queue) blocks."""
        out: list[Reading] = []
        while self._in_flight:
            head = self._in_flight[0]
            if head.event is not None and not head.event.query():  # type: ignore[no-untyped-call]
                if not wait and len(self._in_flight) <= self.max_in_flight:
                    break
                head.event.synchronize()
            self._in_flight.popleft()
            values = head.host.tolist()
            reading = Reading(head.step)
            at = 0
            for stage, point, n in head.layout:
                reading.stages.append((stage, point, values[at : at + n]))
                at += n
            out.append(reading)
        return out

    def __len__(self) -> int:
        return len(self._in_flight)


def resolve_sync(sync: Sync, device: torch.device) -> Literal["step", "lazy"]:
    """``auto``: read at once on the CPU (it costs nothing there), lazily on an accelerator."""
    if sync == "auto":
        return "step" if device.type == "cpu" else "lazy"
    return sync
