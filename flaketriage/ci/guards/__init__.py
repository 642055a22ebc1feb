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

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test without torch
    from flaketriage.errors import GuardError

    raise GuardError(
        "flaketriage.ci.guards needs PyTorch, which is not installed: pip install 'flaketriage[guards]'"
    ) from exc

from flaketriage.ci.guards.checks import CHECKS, Check, Trip
from flaketriage.ci.guards.evidence import Capture, DatasetFile
from flaketriage.ci.guards.guard import NumericGuard
from flaketriage.ci.guards.policies import (
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
from flaketriage.ci.guards.stats import Spike
from flaketriage.errors import GuardError, NumericFault

__all__ = [
    "CHECKS",
    "Action",
    "Capture",
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
