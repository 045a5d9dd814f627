"""A module that runs its network on two views of each batch in one training step, as
self-supervised programs do (Barlow Twins, SimCLR): each weight is used twice, so under
autocast its gradient is the sum of two, which Lightning takes in float32.

Run as ``python two_views.py OUT_DIR [precision]``; writes ``OUT_DIR/result.json``. The tests
run it under Lightning and, with its import lines rewritten, under ptrain.lightning.
"""

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl


class TwoViews(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        noise = torch.Generator().manual_seed(batch_idx)
        views = [x + 0.1 * torch.randn(x.shape, generator=noise) for _ in range(2)]
        loss = sum(nn.functional.cross_entropy(self.net(v), y) for v in views)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(out: str, precision: str = "32-true") -> None:
    from sklearn.datasets import load_digits

    pl.seed_everything(0)
    x, y = load_digits(return_X_y=True)
    data = TensorDataset(torch.tensor(x, dtype=torch.float32) / 16, torch.tensor(y))
    model = TwoViews()
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, precision=precision,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=64))
    result = {"weights": [p.detach().flatten().tolist() for p in model.parameters()],
              "train_loss": float(trainer.callback_metrics["train_loss"])}
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
