"""A gradient-norm monitor, as public programs write it: a callback that reads ``p.grad`` in
``on_train_batch_end``, with gradient accumulation over 2 batches, and the program reading the
gradients after ``fit``. Lightning clears gradients before the next window's backward, so both
places see the last optimizer step's gradients.

Run as ``python gradient_monitor.py OUT_DIR``; writes ``OUT_DIR/result.json``.
"""

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl


class GradientNorms(pl.Callback):
    def __init__(self):
        self.norms, self.zeroed = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        grads = [p.grad for p in pl_module.parameters()]
        self.norms.append(None if any(g is None for g in grads)
                          else float(torch.stack([g.norm() for g in grads]).sum()))

    def on_before_zero_grad(self, trainer, pl_module, optimizer):
        self.zeroed.append(trainer.global_step)


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main(out: str) -> None:
    pl.seed_everything(7)
    model = Model()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(56, 5, generator=g)
    data = DataLoader(TensorDataset(x, x.sum(1)), batch_size=8)  # 7 batches: a short window
    monitor = GradientNorms()
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", enable_progress_bar=False,
                         enable_model_summary=False, logger=False, enable_checkpointing=False,
                         accumulate_grad_batches=2, callbacks=[monitor], default_root_dir=out)
    trainer.fit(model, data)
    after = [p.grad for p in model.parameters()]
    result = {
        "norms": monitor.norms,
        "zeroed_at_step": monitor.zeroed,
        "after_fit": None if any(g is None for g in after)
        else float(torch.stack([g.norm() for g in after]).sum()),
        "weights": [float(p.detach().double().sum()) for p in model.parameters()],
    }
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
