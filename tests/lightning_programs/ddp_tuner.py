"""A ddp program that searches its learning rate (and its batch size) with the Tuner before fit,
as notebooks do, on 2 processes: ``python ddp_tuner.py OUT_DIR [scale]``, the batch size
search only with ``scale`` (Lightning's refuses a distributed strategy). Each rank writes
``OUT_DIR/rank<R>.json``: the learning rate and batch size it was set, the LR test's length
and the steps fit took."""

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl
from lightning.pytorch.tuner import Tuner


class Model(pl.LightningModule):
    def __init__(self, lr=1e-3, batch_size=8):
        super().__init__()
        self.save_hyperparameters()
        self.lr, self.batch_size = lr, batch_size
        x = torch.randn(512, 8, generator=torch.Generator().manual_seed(1))
        self.data = TensorDataset(x, (x[:, 0] > 0).long())
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def main(out: str, scale: bool) -> None:
    pl.seed_everything(0)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=2, strategy="ddp",
                         logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    model = Model()
    tuner = Tuner(trainer)
    found = tuner.lr_find(model, num_training=30)
    size = None
    if scale:
        size = tuner.scale_batch_size(model, init_val=8, max_trials=3, steps_per_trial=2)
    trainer.fit(model)
    seen = {"lr": model.lr, "points": len(found.results["lr"]), "batch_size": size,
            "model_batch_size": model.batch_size, "global_step": trainer.global_step}
    with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(seen, f)
    if trainer.global_rank == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"ranks": 2}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] == ["scale"])
