"""A small Lightning-style module and a quiet Trainer for the smoke uses of the accelerators,
strategies, plugins, profilers and tuner (one place, shared by those smoke files)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ptrain.lightning as pl

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False,
             enable_model_summary=False)


class Regressor(pl.LightningModule):
    """A linear model (a batch norm in front with ``norm=True``) on 32 made-up samples."""

    def __init__(self, lr: float = 0.1, batch_size: int = 8, norm: bool = False):
        super().__init__()
        self.save_hyperparameters()
        self.lr, self.batch_size = lr, batch_size
        self.net = nn.Sequential(nn.BatchNorm1d(4) if norm else nn.Identity(), nn.Linear(4, 1))
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(32, 4, generator=generator)
        self.data = TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def trainer(**options: Any) -> pl.Trainer:
    """A Lightning Trainer on the CPU that writes nothing and shows nothing, for one epoch."""
    return pl.Trainer(**{"max_epochs": 1, "accelerator": "cpu", **QUIET, **options})


def fit(**options: Any) -> tuple[pl.Trainer, Regressor]:
    """A fit of :class:`Regressor` with those Trainer options; the trainer and the module."""
    torch.manual_seed(0)
    module = Regressor()
    run = trainer(**options)
    run.fit(module)
    return run, module
