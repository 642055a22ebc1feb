"""PyTorch numeric guards: catch a training failure at the step where it starts, cheaply, and
capture a bundle that replays to it. The only part of flaketriage that imports torch.

::

    guard = NumericGuard(model, optimizer)
    for indices, x, y in loader:
        loss = loss_fn(model(x), y)
        guard.check_loss(loss, batch_indices=indices)
        loss.backward()
        optimizer.step()        # the guard's optimizer hook checks the gradients first
        guard.after_step()
        optimizer.zero_grad()
"""

# ruff: noqa: E402 - the imports below need torch, so they follow the check that names the extra

from __future__ import annotations

from flaketriage.dependencies import require

require("torch", "guards", "flaketriage.guards")

from flaketriage.errors import GuardError, NumericFault
from flaketriage.guards.checks import CHECKS, Check, Trip
from flaketriage.guards.evidence import CaptureOptions, DatasetFile
from flaketriage.guards.guard import NumericGuard
from flaketriage.guards.policies import (
    Action,
    ClipGradients,
    LowerLossScale,
    Policy,
    Raise,
    RestoreLastGood,
    RunInFP32,
    SkipStep,
    Warn,
)
from flaketriage.guards.stats import Spike

__all__ = [
    "CHECKS",
    "Action",
    "CaptureOptions",
    "Check",
    "ClipGradients",
    "DatasetFile",
    "GuardError",
    "LowerLossScale",
    "NumericFault",
    "NumericGuard",
    "Policy",
    "Raise",
    "RestoreLastGood",
    "RunInFP32",
    "SkipStep",
    "Spike",
    "Trip",
    "Warn",
]
