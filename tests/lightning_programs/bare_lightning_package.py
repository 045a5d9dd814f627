"""A program that imports the ``lightning`` package itself (``import lightning as L``), as
Lightning 2's documentation and the dl-fundamentals course do, and reaches the trainer's names
both at the top (``L.LightningModule``, ``L.Trainer``) and through ``L.pytorch``
(``L.pytorch.seed_everything``, ``L.pytorch.callbacks``, ``L.pytorch.loggers``).

Run as ``python bare_lightning_package.py OUT_DIR``; writes ``OUT_DIR/result.json``.
"""

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).squeeze(1), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main(out: str) -> None:
    L.pytorch.seed_everything(123)
    model = Model()  # its initial weights come from the seed set through L.pytorch
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 6, generator=g)
    data = DataLoader(TensorDataset(x, x.sum(1)), batch_size=8, shuffle=True)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=out,
                        logger=L.pytorch.loggers.CSVLogger(out, name="logs"),
                        callbacks=[L.pytorch.callbacks.ModelCheckpoint(monitor="train_loss")])
    trainer.fit(model, data)
    result = {
        "same_classes": L.pytorch.LightningModule is L.LightningModule
        and L.pytorch.Trainer is L.Trainer,
        "weights": [float(p.detach().double().sum()) for p in model.parameters()],
        "train_loss": float(trainer.callback_metrics["train_loss"]),
        "checkpoint": os.path.relpath(trainer.checkpoint_callback.best_model_path, out),
    }
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
