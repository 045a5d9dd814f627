"""Checkpoints as tutorials write them: ``ModelCheckpoint(dirpath=..., save_weights_only=True)``
with a monitored top-k, the best one reloaded with ``load_from_checkpoint``; then a second
trainer whose ``ModelCheckpoint`` monitors nothing, tested with ``ckpt_path="best"``.

Run as ``python checkpoint_files.py OUT_DIR``; writes ``OUT_DIR/result.json``.
"""

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x.sum(1) > 0).long())


class Model(pl.LightningModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self):
        return DataLoader(data(64, 0), batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(data(32, 1), batch_size=16)

    def test_dataloader(self):
        return DataLoader(data(32, 2), batch_size=16)


def weights(model):
    return [float(p.detach().double().sum()) for p in model.parameters()]


def main(out: str) -> None:
    pl.seed_everything(0)
    folder = os.path.join(out, "ckpts")
    checkpoint = ModelCheckpoint(dirpath=folder, filename="{epoch}", monitor="val_loss",
                                 save_top_k=2, save_weights_only=True)
    trainer = pl.Trainer(max_epochs=4, accelerator="cpu", default_root_dir=out, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[checkpoint])
    model = Model()
    trainer.fit(model)
    best = Model.load_from_checkpoint(checkpoint.best_model_path)
    [tested] = trainer.test(model, ckpt_path="best", verbose=False)

    plain = ModelCheckpoint(dirpath=os.path.join(out, "plain"))
    second = pl.Trainer(max_epochs=2, accelerator="cpu", default_root_dir=out, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[plain])
    other = Model()
    second.fit(other)
    [tested_plain] = second.test(other, ckpt_path="best", verbose=False)
    result = {
        "files": sorted(f for f in os.listdir(folder) if f.endswith(".ckpt")),
        "best_model": os.path.basename(checkpoint.best_model_path),
        "best_score": float(checkpoint.best_model_score),
        "best_weights": weights(best),
        "test": tested,
        "plain_files": sorted(os.listdir(os.path.join(out, "plain"))),
        "plain_best": os.path.basename(plain.best_model_path),
        "plain_test": tested_plain,
    }
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
