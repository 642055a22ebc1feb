"""A PyTorch Lightning callback: the same `NumericGuard`, driven by the Trainer's hooks.

``on_before_backward`` checks the loss, ``on_before_optimizer_step`` the gradients (Lightning has
unscaled them by then under mixed precision), ``on_train_batch_end`` closes the step after an
optimizer step. Works with ``lightning`` (``lightning.pytorch``) or ``pytorch_lightning``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from flaketriage.dependencies import require
from flaketriage.guards.guard import NumericGuard

if TYPE_CHECKING:
    _Base = object
else:
    try:
        from lightning.pytorch import Callback as _Base
    except ModuleNotFoundError:
        # The standalone pytorch_lightning works too; with neither, the error names the extra.
        standalone = importlib.util.find_spec("pytorch_lightning") is not None
        module = "pytorch_lightning" if standalone else "lightning.pytorch"
        _Base = require(module, "lightning", "flaketriage.guards.lightning").Callback


class NumericGuardCallback(_Base):
    """``Trainer(callbacks=[NumericGuardCallback(max_grad_norm=1e3)])``; options go to `NumericGuard`.

    ``batch_indices`` maps a training batch to its dataset indices (for the bundle's data slice),
    e.g. ``lambda batch: batch[2]`` for a dataset that yields ``(x, y, index)``.
    """

    def __init__(self, *, batch_indices: Callable[[Any], Any] | None = None, **options: Any) -> None:
        super().__init__()
        self.options = options
        self.batch_indices = batch_indices
        self.guard: NumericGuard | None = None
        self._stepped = False

    def on_train_start(self, trainer: Any, pl_module: torch.nn.Module) -> None:
        optimizers = list(trainer.optimizers)
        plugin = getattr(trainer, "precision_plugin", None)
        scaler = getattr(plugin, "scaler", None)
        self.guard = NumericGuard(
            pl_module, optimizers[0] if optimizers else None, scaler, hook_optimizer=False, **self.options
        )

    def on_train_batch_start(
        self, trainer: Any, pl_module: torch.nn.Module, batch: Any, batch_idx: int
    ) -> None:
        if self.guard is not None and self.batch_indices is not None:
            self.guard.set_batch(self.batch_indices(batch))

    def on_before_backward(self, trainer: Any, pl_module: torch.nn.Module, loss: torch.Tensor) -> None:
        if self.guard is not None:
            self.guard.check_loss(loss)

    def on_before_optimizer_step(self, trainer: Any, pl_module: torch.nn.Module, optimizer: Any) -> None:
        if self.guard is not None:
            self.guard.after_backward()
            self._stepped = True

    def on_train_batch_end(
        self, trainer: Any, pl_module: torch.nn.Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # With gradient accumulation, only the batch that ends in an optimizer step ends a step.
        if self.guard is not None and self._stepped:
            self._stepped = False
            self.guard.after_step()

    def on_train_end(self, trainer: Any, pl_module: torch.nn.Module) -> None:
        if self.guard is not None:
            self.guard.close()

    def on_exception(self, trainer: Any, pl_module: torch.nn.Module, exception: BaseException) -> None:
        if self.guard is not None:
            self.guard.__exit__(type(exception), exception, None)
