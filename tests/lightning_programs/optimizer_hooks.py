"""Optimizer hooks as tutorials override them: a learning-rate warm-up in ``optimizer_step``
(``optimizer.step(closure=optimizer_closure)``), a per-iteration scheduler stepped after
``super().optimizer_step(*args, **kwargs)``, ``lr_scheduler_step`` for a scheduler whose ``step``
takes the epoch, and the scheduler's monitor given beside the optimizer.

Run as ``python optimizer_hooks.py OUT_DIR``; writes ``OUT_DIR/result.json``.
"""

import json
import math
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, x @ torch.arange(6.0).unsqueeze(1) / 6)


class Base(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
        self.lrs = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])

    def train_dataloader(self):
        return DataLoader(data(48, 0), batch_size=8, shuffle=True)

    def val_dataloader(self):
        return DataLoader(data(16, 1), batch_size=8)


class WarmUp(Base):
    """Lightning's documented warm-up, and a plateau scheduler monitored at the top level."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
        return {"optimizer": optimizer, "lr_scheduler": plateau, "monitor": "val_loss"}

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        optimizer.step(closure=optimizer_closure)
        if self.trainer.global_step < 5:
            scale = min(1.0, float(self.trainer.global_step + 1) / 5)
            for group in optimizer.param_groups:
                group["lr"] = scale * 0.1


class CosineWarmup(torch.optim.lr_scheduler._LRScheduler):
    def __init__(self, optimizer, warmup, max_iters):
        self.warmup, self.max_iters = warmup, max_iters
        super().__init__(optimizer)

    def get_lr(self):
        factor = 0.5 * (1 + math.cos(math.pi * self.last_epoch / self.max_iters))
        if self.last_epoch <= self.warmup:
            factor *= self.last_epoch / self.warmup
        return [base * factor for base in self.base_lrs]


class PerIteration(Base):
    """The UvA course's pattern: a scheduler kept on the module, stepped per iteration."""

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        self.lr_scheduler = CosineWarmup(optimizer, warmup=4, max_iters=40)
        return optimizer

    def optimizer_step(self, *args, **kwargs):
        super().optimizer_step(*args, **kwargs)
        self.lr_scheduler.step()


class EpochScheduler:
    """A scheduler in the style of timm's: ``step(epoch)``, not torch's ``step()``."""

    def __init__(self, optimizer, decay):
        self.optimizer, self.decay = optimizer, decay
        self.base = [g["lr"] for g in optimizer.param_groups]

    def step(self, epoch):
        for group, base in zip(self.optimizer.param_groups, self.base):
            group["lr"] = base * self.decay ** epoch

    def state_dict(self):
        return {"decay": self.decay, "base": self.base}

    def load_state_dict(self, state):
        self.decay, self.base = state["decay"], state["base"]


class CustomStep(Base):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": EpochScheduler(optimizer, 0.5), "interval": "epoch"}}

    def lr_scheduler_step(self, scheduler, metric):
        scheduler.step(epoch=self.current_epoch + 1)


def main(out: str) -> None:
    result = {}
    for cls in (WarmUp, PerIteration, CustomStep):
        pl.seed_everything(0)
        model = cls()
        trainer = pl.Trainer(max_epochs=3, accelerator="cpu", default_root_dir=out, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        trainer.fit(model)
        result[cls.__name__] = {
            "weights": [float(p.detach().double().sum()) for p in model.parameters()],
            "lrs": model.lrs, "global_step": trainer.global_step,
            "val_loss": float(trainer.callback_metrics["val_loss"]),
        }
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
