"""A LightningCLI program: a small regression model and its data, run from the command line.

Written against ``lightning.pytorch``; tests/test_lightning_cli.py runs it as written and, with
its import lines rewritten, under ``ptrain.lightning``. ``CLI_MODE`` picks how the CLI is
made (``plain``, ``subclass``, ``custom``, ``env``, ``run_false``, ``preseeded``, ``failing``);
with ``RESULT_FILE`` set, what the run ended with is written there as JSON.
"""

import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import MisconfigurationException


class RegressionData(pl.LightningDataModule):
    """Noisy linear targets from random features, the same for every seed."""

    def __init__(self, size: int = 64, features: int = 4, batch_size: int = 16):
        super().__init__()
        self.size, self.features, self.batch_size = size, features, batch_size
        self.num_targets = 2 if os.environ.get("TWO_TARGETS") else 1

    def setup(self, stage: str) -> None:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(self.size, self.features, generator=generator)
        w = torch.randn(self.features, self.num_targets, generator=generator)
        y = x @ w + 0.1 * torch.randn(self.size, self.num_targets, generator=generator)
        self.dataset = TensorDataset(x, y)

    def train_dataloader(self):
        return DataLoader(self.dataset, batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(self.dataset, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.dataset, batch_size=self.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.dataset, batch_size=self.batch_size)


class Regressor(pl.LightningModule):
    """A two-layer network fitted with the mean squared error."""

    def __init__(self, features: int = 4, hidden: int = 8, outputs: int = 1, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(),
                                 nn.Linear(hidden, outputs))
        self.predicted = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def on_predict_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self.predicted.extend(outputs.flatten().tolist())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class FailingRegressor(Regressor):
    """A model whose own check fails when fit starts (the program's error, not the CLI's)."""

    def on_fit_start(self):
        raise MisconfigurationException("FailingRegressor refuses to fit")


class WideRegressor(Regressor):
    """The same model, wider by default: a subclass chosen with --model."""

    def __init__(self, features: int = 4, hidden: int = 16, outputs: int = 1, lr: float = 0.05,
                 depth_note: str = "wide"):
        super().__init__(features=features, hidden=hidden, outputs=outputs, lr=lr)


class Recorder(pl.Callback):
    """Records the stages it saw; a callback group of its own in the custom CLI."""

    def __init__(self, label: str = "recorder"):
        self.label = label
        self.events = []

    @property
    def state_key(self):
        return f"Recorder[{self.label}]"  # one run may hold several

    def on_fit_start(self, trainer, pl_module):
        self.events.append(f"{self.label}:fit_start")

    def on_fit_end(self, trainer, pl_module):
        self.events.append(f"{self.label}:fit_end")


class RecordingCLI(LightningCLI):
    """A CLI subclass: its own arguments, links and hooks."""

    events = []

    def add_arguments_to_parser(self, parser):
        parser.add_lightning_class_args(Recorder, "recorder")
        parser.add_argument("--note", type=str, default="none")
        parser.link_arguments("data.features", "model.features")
        parser.link_arguments("data.num_targets", "model.outputs", apply_on="instantiate")

    def before_instantiate_classes(self):
        self.events.append("before_instantiate_classes")

    def after_instantiate_classes(self):
        self.events.append("after_instantiate_classes")

    def before_fit(self):
        self.events.append("before_fit")

    def after_fit(self):
        self.events.append("after_fit")


def _make_cli():
    mode = os.environ.get("CLI_MODE", "plain")
    if mode == "plain":
        return LightningCLI(Regressor, RegressionData)
    if mode == "subclass":
        return LightningCLI(datamodule_class=RegressionData,
                            save_config_kwargs={"overwrite": True})
    if mode == "custom":
        return RecordingCLI(Regressor, RegressionData, seed_everything_default=7,
                            trainer_defaults={"max_epochs": 1, "enable_progress_bar": False})
    if mode == "env":
        return LightningCLI(Regressor, RegressionData, run=False, auto_configure_optimizers=False,
                            parser_kwargs={"default_env": True})
    if mode == "run_false":
        cli = LightningCLI(Regressor, RegressionData, run=False)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        cli.test_metrics = cli.trainer.test(cli.model, datamodule=cli.datamodule)
        return cli
    if mode == "preseeded":  # seeded before the CLI is made; seed_everything left at true
        pl.seed_everything(11)
        return LightningCLI(Regressor, RegressionData)
    if mode == "failing":
        return LightningCLI(FailingRegressor, RegressionData)
    raise SystemExit(f"unknown CLI_MODE {mode}")


def _result(cli):
    trainer, model = cli.trainer, cli.model
    checkpoint = getattr(trainer, "checkpoint_callback", None)
    recorder = cli._get(cli.config_init, "recorder")
    return {
        "weights": {k: v.flatten().tolist() for k, v in model.state_dict().items()},
        "model_class": type(model).__name__,
        "hparams": dict(model.hparams),
        "global_step": trainer.global_step,
        "current_epoch": trainer.current_epoch,
        "callback_metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
        "log_dir": os.path.relpath(trainer.log_dir) if trainer.log_dir else None,
        "best_model_path": getattr(checkpoint, "best_model_path", None) or None,
        "lr": [g["lr"] for o in trainer.optimizers for g in o.param_groups],
        "predicted": model.predicted,
        "cli_events": list(getattr(cli, "events", [])),
        "recorder_events": recorder.events if isinstance(recorder, Recorder) else [],
        "config_seed": cli._get(cli.config, "seed_everything"),
        "note": cli._get(cli.config, "note"),
        "test_metrics": getattr(cli, "test_metrics", None),
    }


if __name__ == "__main__":
    cli = _make_cli()
    if os.environ.get("RESULT_FILE"):
        with open(os.environ["RESULT_FILE"], "w") as f:
            json.dump(_result(cli), f)
