"""Modules that get one thing wrong each, for ``tests/test_bad_inputs.py`` (issue 21): what a
user's model, loss, logging, optimizer or data can be, and what ptrain must name."""

from __future__ import annotations

import os
import signal

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import ptrain


def _data(n: int = 16) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


class Base(ptrain.TrainModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(_data(), batch_size=4)

    def val_dataloader(self):
        return DataLoader(_data(8), batch_size=4)


class ReturnsNone(Base):
    def training_step(self, batch, batch_idx):
        return None


class FloatLoss(Base):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx).item()


class VectorLoss(Base):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return (self(x) - y) ** 2


class DetachedLoss(Base):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx).detach()


class IntegerLoss(Base):
    def training_step(self, batch, batch_idx):
        return torch.tensor(3)


class DictWithoutLoss(Base):
    def training_step(self, batch, batch_idx):
        return {"total": super().training_step(batch, batch_idx)}


class LogsAVector(Base):
    def training_step(self, batch, batch_idx):
        x, y = batch
        self.log("per_sample", (self(x) - y).squeeze(1))
        return nn.functional.mse_loss(self(x), y)


class ForeignOptimizer(Base):
    def configure_optimizers(self):
        return torch.optim.SGD(nn.Linear(4, 1).parameters(), lr=0.1)


class Frozen(Base):
    def __init__(self):
        super().__init__()
        self.net.requires_grad_(False)


class NoTrainingStep(ptrain.TrainModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(_data(), batch_size=4)


class NoConfigureOptimizers(Base):
    configure_optimizers = ptrain.TrainModule.configure_optimizers

    def configure_optimizer(self):  # a typo
        return torch.optim.SGD(self.parameters(), lr=0.1)


class NotIterableLoader(Base):
    def train_dataloader(self):
        return 42


class EmptyValidation(Base):
    def val_dataloader(self):
        return DataLoader(_data(0), batch_size=4)


class NoValidation(Base):
    val_dataloader = None  # type: ignore[assignment]


class RaisesInInit(Base):
    def __init__(self):
        super().__init__()
        raise ValueError("bad width in the user's __init__")


class _BrokenDataset(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        if index == 5:
            raise KeyError(f"sample {index} is missing from the user's dataset")
        return torch.zeros(4), torch.zeros(1)


class RaisesInDataset(Base):
    def train_dataloader(self):
        return DataLoader(_BrokenDataset(), batch_size=2)


class RaisesInDataLoaderWorker(Base):
    """The same dataset read by worker processes: torch re-raises the error in the main process
    with the worker's traceback as text."""

    def train_dataloader(self):
        return DataLoader(_BrokenDataset(), batch_size=2, num_workers=2,
                          persistent_workers=True)


class _CrashingDataset(_BrokenDataset):
    def __getitem__(self, index):
        if index == 5:  # as a native extension's fault would: no Python traceback
            os.kill(os.getpid(), signal.SIGSEGV)
        return torch.zeros(4), torch.zeros(1)


class CrashesInDataLoaderWorker(Base):
    # one worker: with two, the other one could be passing a batch's file descriptor when the
    # loader shut it down, and multiprocessing's fd-sharing thread printed its BrokenPipeError
    # traceback (1 CI run in many), noise from the standard library, not this test's subject
    def train_dataloader(self):
        return DataLoader(_CrashingDataset(), batch_size=2, num_workers=1,
                          persistent_workers=True)


class RaisesInValidationStep(Base):
    def validation_step(self, batch, batch_idx):
        raise RuntimeError("the user's validation_step failed")


class RaisesInSecondEpoch(Base):
    """Trains epoch 0 (its end writes last.ckpt), then fails in epoch 1."""

    def training_step(self, batch, batch_idx):
        if self.current_epoch == 1:
            raise RuntimeError("the user's training_step failed in epoch 1")
        return super().training_step(batch, batch_idx)


class NoValidationData(Base):
    """A validation_step, but no validation data."""

    def val_dataloader(self):
        return None


class UnusedHead(Base):
    """The optimizer holds a registered submodule that the loss never uses."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(1, 1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.head.parameters(), lr=0.1)
