"""Smoke uses of ``ptrain.lightning.loggers``: each logger takes part in a short fit and what it
wrote is read back (tests/test_lightning_callbacks_loggers.py compares them with Lightning)."""

from __future__ import annotations

import csv
import os
import tempfile
from pathlib import Path

import torch

import ptrain.lightning as pl
from lightning_names import refuses
from ptrain.lightning import loggers


class _Model(pl.LightningModule):
    def __init__(self, lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).pow(2).mean()
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(4, 2), batch_size=2)


def _fit(logger, root: str) -> pl.Trainer:
    trainer = pl.Trainer(max_epochs=1, logger=logger, log_every_n_steps=1, accelerator="cpu",
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=root)
    trainer.fit(_Model())
    return trainer


def _users_logger():
    class Recording(loggers.Logger):
        def __init__(self):
            self.metrics, self.hparams, self.status = [], None, None

        name = property(lambda self: "recording")
        version = property(lambda self: 0)

        def log_metrics(self, metrics, step=None):
            self.metrics.append((step, dict(metrics)))

        def log_hyperparams(self, params):
            self.hparams = dict(params)

        def finalize(self, status):
            self.status = status

    logger = Recording()
    with tempfile.TemporaryDirectory() as root:
        trainer = _fit(logger, root)
    assert trainer.logger is logger and logger.hparams == {"lr": 0.1}
    assert [step for step, _ in logger.metrics] == [1, 2] and logger.status == "success"
    assert all({"train_loss", "epoch"} <= set(m) for _, m in logger.metrics)


def _tensorboard():
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with tempfile.TemporaryDirectory() as root:
        logger = loggers.TensorBoardLogger(root)
        _fit(logger, root)
        logger.log_hyperparams({"extra": 1})  # Lightning's signature
        logger.save()
        events = EventAccumulator(logger.log_dir)
        events.Reload()
        assert [e.step for e in events.Scalars("train_loss")] == [1, 2]
        assert logger.log_dir == os.path.join(root, "lightning_logs", "version_0")


def _csv():
    with tempfile.TemporaryDirectory() as root:
        logger = loggers.CSVLogger(root)
        _fit(logger, root)
        logger.log_metrics({"extra": 3.0}, step=9)  # Lightning's signature
        logger.save()
        with open(Path(logger.log_dir) / "metrics.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert [r["step"] for r in rows if r["train_loss"]] == ["1", "2"]
        assert [(r["step"], r["extra"]) for r in rows if r["extra"]] == [("9", "3.0")]


def _mlflow():
    saved = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 keeps a file store behind it
    try:
        with tempfile.TemporaryDirectory() as root:
            logger = loggers.MLFlowLogger(save_dir=os.path.join(root, "mlruns"))
            _fit(logger, root)
            run = logger.experiment.get_run(logger.run_id)
            assert run.data.params == {"lr": "0.1"} and "train_loss" in run.data.metrics
    finally:
        if saved is None:
            del os.environ["MLFLOW_ALLOW_FILE_STORE"]
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = saved


def _wandb():
    with tempfile.TemporaryDirectory() as root:
        logger = loggers.WandbLogger(save_dir=root, offline=True, project="smoke")
        _fit(logger, root)
        assert logger.name == "smoke" and logger.version is not None
        assert logger.experiment.config["lr"] == 0.1  # the stage's (finished) run
        assert list(Path(root).glob("wandb/offline-run-*/run-*.wandb"))


SMOKE = {
    "Logger": _users_logger,
    "TensorBoardLogger": _tensorboard,
    "CSVLogger": _csv,
    "MLFlowLogger": _mlflow,
    "WandbLogger": _wandb,
    "CometLogger": lambda: refuses(lambda: loggers.CometLogger(api_key="k"), "CometLogger",
                                   "Logger"),
    "LitLogger": lambda: refuses(lambda: loggers.LitLogger(), "LitLogger", "Logger"),
}
