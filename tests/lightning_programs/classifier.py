"""A digits classifier written as a Lightning user writes one: a DataModule, save_hyperparameters,
validation and test steps, a torchmetrics accuracy, ReduceLROnPlateau on a monitored metric,
EarlyStopping, a top-k ModelCheckpoint with a filename template, a CSV logger and an LR monitor.

Run as ``python classifier.py OUT_DIR [precision] [devices]``; writes ``OUT_DIR/result.json``.
The tests run it under Lightning and, with its import lines rewritten, under ptrain.lightning.
"""

import json
import os
import sys

import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger


class Digits(pl.LightningDataModule):
    def __init__(self, batch_size: int = 50):
        super().__init__()
        self.save_hyperparameters()

    def prepare_data(self):
        from sklearn.datasets import load_digits

        load_digits()

    def setup(self, stage):
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x, y = torch.tensor(x, dtype=torch.float32) / 16, torch.tensor(y)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
        x, y = x[order], y[order]
        self.train = TensorDataset(x[:1000], y[:1000])
        self.val = TensorDataset(x[1000:1290], y[1000:1290])  # a short last batch
        self.test = TensorDataset(x[1290:], y[1290:])

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.hparams.batch_size)

    def test_dataloader(self):
        return DataLoader(self.test, batch_size=self.hparams.batch_size)


class Classifier(pl.LightningModule):
    def __init__(self, hidden: int = 32, lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=10,
                                                                      average="micro")

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), prog_bar=True)
        self.val_acc(logits, y)
        self.log("val_acc", self.val_acc)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5,
                                                               patience=0, threshold=0.05)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss"}}


def main(out: str, precision: str = "32-true", devices: int = 1) -> None:
    pl.seed_everything(0)
    datamodule, model = Digits(), Classifier()
    checkpoint = ModelCheckpoint(monitor="val_acc", mode="max", save_top_k=2,
                                 filename="{epoch}-{val_acc:.3f}")
    trainer = pl.Trainer(
        max_epochs=5, accelerator="cpu", devices=devices, precision=precision,
        logger=CSVLogger(out, name="run"), enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[EarlyStopping("val_loss", patience=1, min_delta=0.01), checkpoint,
                   LearningRateMonitor()])
    trainer.fit(model, datamodule=datamodule)
    [test_metrics] = trainer.test(model, datamodule=datamodule, verbose=False)
    if trainer.is_global_zero:
        with open(os.path.join(trainer.logger.log_dir, "metrics.csv")) as f:
            header = f.readline().strip().split(",")
        result = {
            "callback_metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
            "logged_names": sorted(set(header) - {"epoch", "step"}),
            "test": test_metrics,
            "checkpoints": sorted(os.listdir(os.path.join(trainer.logger.log_dir,
                                                          "checkpoints"))),
            "best_model": os.path.basename(checkpoint.best_model_path),
            "current_epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            "lr": model.trainer.optimizers[0].param_groups[0]["lr"] if devices == 1 else None,
            "weights": [float(p.detach().double().sum()) for p in model.parameters()],
        }
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:3], *[int(d) for d in sys.argv[3:4]])
