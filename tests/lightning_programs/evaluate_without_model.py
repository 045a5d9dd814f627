"""Evaluation stages called without a model after ``fit``, as tutorials do
(``trainer.test(dataloaders=...)``, ``trainer.test(datamodule=dm)``): the trainer evaluates the
best checkpoint its ``ModelCheckpoint`` recorded, not the weights the fit ended with, and loads
it into the module. The monitor is ``val_loss`` in ``max`` mode, so the best file is an early
one. A second trainer without checkpointing has no best checkpoint to use.

Run as ``python evaluate_without_model.py OUT_DIR``; writes ``OUT_DIR/result.json``.
"""

import json
import os
import sys
import warnings

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
    def __init__(self):
        super().__init__()
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

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)


def weights(model):
    return [float(p.detach().double().sum()) for p in model.parameters()]


def main(out: str) -> None:
    pl.seed_everything(0)
    train = DataLoader(data(64, 0), batch_size=16, shuffle=True)
    val = DataLoader(data(32, 1), batch_size=16)
    test = DataLoader(data(32, 2), batch_size=16)
    checkpoint = ModelCheckpoint(monitor="val_loss", mode="max")
    trainer = pl.Trainer(max_epochs=4, accelerator="cpu", default_root_dir=out, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[checkpoint])
    model = Model()
    trainer.fit(model, train, val)
    ended = weights(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        [tested] = trainer.test(dataloaders=test, verbose=False)
        after_test = weights(model)
        [validated] = trainer.validate(dataloaders=val, verbose=False)
        predicted = trainer.predict(dataloaders=test)
    said = [str(w.message) for w in caught if "model" in str(w.message)]
    best = Model.load_from_checkpoint(checkpoint.best_model_path)

    plain = pl.Trainer(max_epochs=1, accelerator="cpu", default_root_dir=out, logger=False,
                       enable_progress_bar=False, enable_model_summary=False,
                       enable_checkpointing=False)
    other = Model()
    plain.fit(other, train, val)
    try:
        [plain_test] = plain.test(dataloaders=test, verbose=False)
    except ValueError as exc:  # Lightning: no ModelCheckpoint, so no best model to use
        plain_test = {"error": type(exc).__name__}
    [plain_given] = plain.test(other, dataloaders=test, verbose=False)
    result = {
        "best_model": os.path.basename(checkpoint.best_model_path),
        "ended": ended,
        "best_weights": weights(best),
        "after_test": after_test,
        "test": tested,
        "validate": validated,
        "predict": float(torch.cat(predicted).double().sum()),
        "warnings": len(said),
        "plain_test": plain_test,
        "plain_given": plain_given,
    }
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
