"""The kit's model: a small, seeded regression problem that trains in a fraction of a second."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ptrain.module import TrainModule


class TinyModule(TrainModule):
    """A regression MLP (``features`` inputs, ``hidden`` tanh units, one output) on generated data,
    trained by SGD with momentum 0.9 (so the optimizer has state to checkpoint).

    ``seed`` fixes everything the module holds: the target function, ``n`` training samples,
    ``max(n // 4, 1)`` validation samples and the initial weights (drawn without touching torch's
    global generator). The training loader shuffles with the global generator, which the
    trainer's ``seed`` option sets. It logs ``train_loss`` every step and ``val_loss`` per
    validation. Defined in an importable module, it can be pickled to worker processes.
    """

    def __init__(self, n: int = 64, batch_size: int = 16, features: int = 4, hidden: int = 8,
                 lr: float = 0.05, seed: int = 0):
        super().__init__()
        self.batch_size, self.lr = batch_size, lr
        data = torch.Generator().manual_seed(seed)
        weights = torch.randn(features, 1, generator=data) / features**0.5

        def sample(count: int) -> TensorDataset:
            x = torch.randn(count, features, generator=data)
            return TensorDataset(x, x @ weights + 0.05 * torch.randn(count, 1, generator=data))

        self.train_set, self.val_set = sample(n), sample(max(n // 4, 1))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def full_loss(self, stage: str = "train") -> float:
        """The mean squared error of the current weights on the whole training (or, with
        ``stage="validate"``, validation) set, computed in float32 on the CPU on a copy: the
        module itself is left as it is, whatever its dtype and device."""
        data = self.train_set if stage == "train" else self.val_set
        net = copy.deepcopy(self.net).float().cpu()
        x, y = data.tensors
        with torch.no_grad():
            return float(nn.functional.mse_loss(net(x), y))


class TinyConvModule(TinyModule):
    """:class:`TinyModule`'s regression on 2x4x4 images through a 3x3 convolution (4 channels,
    tanh) and a linear head, for plugins that act on convolutions or image batches (a memory
    format, cuDNN settings); two input channels, so that a memory format shows in the strides.
    Same seeding, logging, optimizer and ``full_loss``."""

    def __init__(self, n: int = 64, batch_size: int = 16, lr: float = 0.05, seed: int = 0):
        super().__init__(n=n, batch_size=batch_size, features=32, lr=lr, seed=seed)
        self.train_set, self.val_set = (
            TensorDataset(x.view(-1, 2, 4, 4), y) for x, y in (s.tensors for s in
                                                               (self.train_set, self.val_set)))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.Tanh(), nn.Flatten(),
                                     nn.Linear(64, 1))


class TinyManualModule(TinyModule):
    """:class:`TinyModule` optimizing manually (``automatic_optimization = False``): its
    ``training_step`` zeroes the gradients, calls ``manual_backward`` and steps the optimizer
    it gets from ``self.optimizers()``, so the precision's and strategy's hooks still apply.
    For plugins made for manual optimization (``toggling``) or that must work with it."""

    automatic_optimization = False

    def training_step(self, batch, batch_idx):
        x, y = batch
        optimizer = self.optimizers()
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss
