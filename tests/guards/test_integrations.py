"""The Lightning and Hugging Face callbacks: thin layers over the same guard, in real Trainers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from flaketriage.guards import NumericFault

# Lightning and transformers warn about things a three-step CPU run does on purpose (few workers,
# no logger, a tiny model).
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
    pytest.mark.filterwarnings("ignore:.*(GPU available|TPU available|HPU available)"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),  # lightning 2.6 on torch 2.13
]


class Rows(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """64 regression rows; one input poisoned when asked."""

    def __init__(self, poisoned: int | None = None) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 4, generator=g)
        self.y = self.x.sum(1, keepdim=True)
        if poisoned is not None:
            self.x[poisoned, 1] = math.nan

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[i], self.y[i], i


def test_lightning_callback_trips_on_the_poisoned_batch() -> None:
    pl: Any = pytest.importorskip("lightning.pytorch")
    from flaketriage.guards.lightning import NumericGuardCallback

    class Regression(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y, _ = batch
            loss: torch.Tensor = torch.nn.functional.mse_loss(self.net(x), y)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def fit(poisoned: int | None, max_steps: int) -> NumericGuardCallback:
        torch.manual_seed(0)
        callback = NumericGuardCallback(batch_indices=lambda batch: batch[2], capture=False)
        trainer = pl.Trainer(
            max_steps=max_steps,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[callback],
        )
        trainer.fit(Regression(), DataLoader(Rows(poisoned), batch_size=8, shuffle=False))
        return callback

    clean = fit(None, 12)
    assert clean.guard is not None and clean.guard.trips == [] and clean.guard.step_index == 12
    with pytest.raises(NumericFault) as caught:
        fit(21, 12)  # row 21 is in the third batch: step 2
    assert (caught.value.check, caught.value.step) == ("loss_nonfinite", 2)
    assert caught.value.where == "the model's inputs (the batch)"


def test_hugging_face_callback_trips_on_the_step_a_weight_goes_bad(tmp_path: Path) -> None:
    transformers: Any = pytest.importorskip("transformers")
    from flaketriage.guards.huggingface import NumericGuardCallback

    class Tokens(Dataset[dict[str, torch.Tensor]]):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    class PoisonAt(transformers.TrainerCallback):  # type: ignore[misc]
        """Writes a NaN into one MLP weight when the given optimizer step begins."""

        def __init__(self, step: int | None) -> None:
            self.step = step

        def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            if state.global_step == self.step:
                with torch.no_grad():
                    model.transformer.h[0].mlp.c_fc.weight[0, 0] = math.nan

    def train(poison_step: int | None) -> NumericGuardCallback:
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
        model = transformers.GPT2LMHeadModel(config)  # built from a config: nothing downloaded
        guard = NumericGuardCallback(capture=False)
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"),
            max_steps=8,
            per_device_train_batch_size=4,
            learning_rate=1e-3,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=Tokens(), callbacks=[guard, PoisonAt(poison_step)]
        )
        trainer.train()
        return guard

    clean = train(None)
    assert clean.guard is not None and clean.guard.trips == [] and clean.guard.step_index == 8
    with pytest.raises(NumericFault) as caught:
        train(5)
    assert (caught.value.check, caught.value.step) == ("loss_nonfinite", 5)
    assert caught.value.where == "module transformer.h.0.mlp.c_fc (Conv1D)"
