"""Several evaluation dataloaders, as a program that checks on more than one data set writes it:
a DataModule whose ``setup(stage)`` builds only what each stage needs and returns two
validation, test and predict loaders each (``dataloader_idx``, a metric logged per loader with
``add_dataloader_idx=False``); the fit accumulates gradients over 3 batches, clips them and steps
a ``OneCycleLR`` per optimizer step, with a callback that keeps counters in its ``state_dict``
across a resume; predict returns its outputs and a ``BasePredictionWriter`` (batch and epoch)
records what it is given.
Run as ``python several_loaders.py OUT_DIR``; writes ``OUT_DIR/result.json``.
"""

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BasePredictionWriter, Callback

g = torch.Generator().manual_seed(0)
X, X2 = torch.randn(96, 4, generator=g), torch.randn(32, 4, generator=g)
Y, Y2 = (X.sum(1) > 0).long(), (X2.sum(1) > 0).long()


class Data(pl.LightningDataModule):
    def __init__(self):
        super().__init__()
        self.stages = []

    def setup(self, stage):
        self.stages.append(stage)
        if stage in ("fit", "validate"):
            self.train = TensorDataset(X, Y)
            self.val_a, self.val_b = TensorDataset(X2, Y2), TensorDataset(2 * X2[:16], Y2[:16])
        elif stage == "test":
            self.test = TensorDataset(X2, Y2)
        elif stage == "predict":
            self.inputs = TensorDataset(X2)

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=8, shuffle=True)

    def val_dataloader(self):
        return [DataLoader(self.val_a, batch_size=8), DataLoader(self.val_b, batch_size=4)]

    def test_dataloader(self):
        return [DataLoader(self.test, batch_size=8), DataLoader(self.test, batch_size=16)]

    def predict_dataloader(self):
        return [DataLoader(self.inputs, batch_size=8), DataLoader(self.inputs, batch_size=5)]


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log(f"acc_{dataloader_idx}", (logits.argmax(1) == y).float().mean(),
                 add_dataloader_idx=False)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.log("test_loss", nn.functional.cross_entropy(self(x), y))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0]).softmax(-1)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        cycle = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=40)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": cycle, "interval": "step"}}


class Counter(Callback):
    def __init__(self):
        self.batches = self.epochs = 0
        self.loaded = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches += 1

    def on_train_epoch_end(self, trainer, pl_module):
        self.epochs += 1

    def state_dict(self):
        return {"batches": self.batches, "epochs": self.epochs}

    def load_state_dict(self, state_dict):
        self.loaded = dict(state_dict)
        self.batches, self.epochs = state_dict["batches"], state_dict["epochs"]


class Recorder(BasePredictionWriter):
    def __init__(self):
        super().__init__("batch_and_epoch")
        self.batches, self.epoch = [], None

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch,
                           batch_idx, dataloader_idx):
        self.batches.append([batch_idx, dataloader_idx, list(batch_indices),
                             list(prediction.shape)])

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        self.epoch = {"shapes": [[list(p.shape) for p in per_loader]
                                 for per_loader in predictions],
                      "batch_indices": [[list(b) for b in per_loader]
                                        for per_loader in batch_indices]}


def numbers(metrics):
    return {name: float(value) for name, value in sorted(metrics.items())}


def main(out):
    pl.seed_everything(1)
    data, model = Data(), Classifier()
    common = dict(enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                  default_root_dir=out, logger=False, accumulate_grad_batches=3,
                  gradient_clip_val=0.5)
    result = {}
    first = Counter()
    trainer = pl.Trainer(max_epochs=2, callbacks=[first], **common)
    trainer.fit(model, datamodule=data)
    ckpt = os.path.join(out, "mid.ckpt")
    trainer.save_checkpoint(ckpt)
    result["first"] = {"metrics": numbers(trainer.callback_metrics),
                       "global_step": trainer.global_step, "counter": [first.batches, first.epochs],
                       "lr": trainer.optimizers[0].param_groups[0]["lr"]}
    second = Counter()
    trainer = pl.Trainer(max_epochs=3, callbacks=[second], **common)
    trainer.fit(model, datamodule=data, ckpt_path=ckpt)
    result["resumed"] = {"metrics": numbers(trainer.callback_metrics),
                         "global_step": trainer.global_step, "loaded": second.loaded,
                         "counter": [second.batches, second.epochs],
                         "lr": trainer.optimizers[0].param_groups[0]["lr"]}
    result["validate"] = trainer.validate(model, datamodule=data, verbose=False)
    result["test"] = trainer.test(model, datamodule=data, verbose=False)
    recorder = Recorder()
    trainer = pl.Trainer(callbacks=[recorder], enable_progress_bar=False, accelerator="cpu",
                         default_root_dir=out, logger=False)
    predictions = trainer.predict(model, datamodule=data)
    result["predict"] = {"shapes": [[list(p.shape) for p in per_loader]
                                    for per_loader in predictions],
                         "sum": float(sum(p.sum() for per in predictions for p in per)),
                         "writer_batches": recorder.batches, "writer_epoch": recorder.epoch}
    result["stages"] = data.stages
    result["weights"] = [p.detach().flatten().tolist() for p in model.parameters()]
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
