"""A Hugging Face ``TrainerCallback``: the same `NumericGuard`, driven by the Trainer's events.

The Trainer hands callbacks no loss, so the callback reads ``outputs.loss`` from a forward hook on
the model (training passes only). ``on_pre_optimizer_step`` checks the gradients (the Trainer has
clipped them by then when ``max_grad_norm`` is set: NaN and inf still show, norm bounds see the
clipped norm), ``on_step_end`` closes the step. Under fp16 the accelerate GradScaler is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from flaketriage.dependencies import require
from flaketriage.guards.activations import Hook
from flaketriage.guards.guard import NumericGuard

if TYPE_CHECKING:
    _Base = object
else:
    _Base = require("transformers", "huggingface", "flaketriage.guards.huggingface").TrainerCallback


class NumericGuardCallback(_Base):
    """``Trainer(..., callbacks=[NumericGuardCallback(max_grad_norm=1e3)])``; options go to `NumericGuard`."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.guard: NumericGuard | None = None
        self._hook: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model: torch.nn.Module = kwargs["model"]
        optimizer = kwargs.get("optimizer")
        # accelerate wraps the optimizer; the wrapper carries the fp16 GradScaler.
        scaler = getattr(optimizer, "scaler", None)
        inner = getattr(optimizer, "optimizer", optimizer)
        self.guard = NumericGuard(model, inner, scaler, hook_optimizer=False, **self.options)
        self._hook = model.register_forward_hook(Hook(self._check_loss))

    def _check_loss(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self.guard is None or not module.training or not torch.is_grad_enabled():
            return
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor):
            self.guard.check_loss(loss)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard is not None:
            self.guard.after_backward()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard is not None:
            self.guard.after_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.guard is not None:
            self.guard.close()
