"""A second ``predict`` given dataloaders and no datamodule, after one given a datamodule:
Lightning keeps the datamodule of the first (``trainer.datamodule``) and runs its
``prepare_data``, ``setup("predict")`` and ``teardown("predict")`` again, while the data
comes from the dataloaders given. The datamodule records each call; ``predict_step`` records
which datamodule the trainer holds.

Run as ``python datamodule_kept.py OUT_DIR``; writes ``OUT_DIR/result.json``.
"""

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl


def rows(n, seed):
    return TensorDataset(torch.randn(n, 4, generator=torch.Generator().manual_seed(seed)))


def word(stage):
    return getattr(stage, "value", stage)  # Lightning's is a str enum


class Data(pl.LightningDataModule):
    def __init__(self):
        super().__init__()
        self.calls = []

    def prepare_data(self):
        self.calls.append("prepare_data")

    def setup(self, stage):
        self.calls.append(f"setup {word(stage)}")

    def teardown(self, stage):
        self.calls.append(f"teardown {word(stage)}")

    def predict_dataloader(self):
        return DataLoader(rows(4, 0), batch_size=2)


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.held = []

    def predict_step(self, batch, batch_idx):
        held = self.trainer.datamodule
        self.held.append(None if held is None else type(held).__name__)
        return self.net(batch[0])


def main(out: str) -> None:
    pl.seed_everything(0)
    trainer = pl.Trainer(accelerator="cpu", default_root_dir=out, logger=False,
                         enable_progress_bar=False, enable_model_summary=False)
    model, data = Model(), Data()
    first = trainer.predict(model, datamodule=data)
    after_first = list(data.calls)
    second = trainer.predict(model, dataloaders=DataLoader(rows(6, 1), batch_size=3))
    result = {"after_first": after_first, "calls": data.calls, "held": model.held,
              "batches": [len(first), len(second)],
              "trainer_datamodule": type(trainer.datamodule).__name__}
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
