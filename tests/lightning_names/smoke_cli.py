"""Smoke uses of ``ptrain.lightning.cli`` (run against Lightning's own CLI, as programs, in
tests/test_lightning_cli.py)."""

from __future__ import annotations

import contextlib
import sys
import tempfile
import typing
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ptrain.lightning as pl
from ptrain.lightning import cli


class SmokeData(pl.LightningDataModule):
    def __init__(self, size: int = 16, batch_size: int = 4):
        super().__init__()
        self.size, self.batch_size = size, batch_size

    def train_dataloader(self):
        x = torch.linspace(-1, 1, self.size).unsqueeze(1)
        return DataLoader(TensorDataset(x, 2 * x), batch_size=self.batch_size)


class SmokeModel(pl.LightningModule):
    def __init__(self, hidden: int = 3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(1, hidden), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss


class WiderSmokeModel(SmokeModel):
    def __init__(self, hidden: int = 4):
        super().__init__(hidden)


class InjectedModel(pl.LightningModule):
    """Makes its own optimizer and scheduler from the callables the CLI gives it."""

    def __init__(self, hidden: int = 3, optimizer: cli.OptimizerCallable = torch.optim.Adam,
                 scheduler: cli.LRSchedulerCallable = torch.optim.lr_scheduler.ConstantLR):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Linear(1, hidden)
        self.optimizer, self.scheduler = optimizer, scheduler

    def configure_optimizers(self):
        optimizer = self.optimizer(self.parameters())
        return [optimizer], [self.scheduler(optimizer)]


_QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@contextlib.contextmanager
def _program_argv():
    """``sys.argv`` as a program started without arguments has it (``args=`` is parsed)."""
    saved = sys.argv
    sys.argv = ["smoke.py"]
    try:
        yield
    finally:
        sys.argv = saved


def _fits_and_saves_its_config():
    with tempfile.TemporaryDirectory() as root, _program_argv():
        run = cli.LightningCLI(SmokeModel, SmokeData, args=[
            "fit", f"--trainer.default_root_dir={root}", "--trainer.max_epochs=2",
            "--model.hidden=5", "--seed_everything=3", "--optimizer=SGD",
            "--optimizer.lr=0.1", *_QUIET])
        assert run.subcommand == "fit" and run.trainer.global_step == 8
        assert run.model.net[0].out_features == 5
        saved = Path(run.trainer.log_dir) / "config.yaml"
        text = saved.read_text()
        assert "hidden: 5" in text and "seed_everything: 3" in text
        assert "class_path: torch.optim.SGD" in text


def _parser_groups():
    parser = cli.LightningArgumentParser(exit_on_error=False)
    parser.add_lightning_class_args(SmokeModel, "model")
    parser.add_lightning_class_args(pl.Trainer, "trainer")
    parser.add_optimizer_args(torch.optim.Adam)
    parser.add_lr_scheduler_args(torch.optim.lr_scheduler.StepLR)
    config = parser.parse_args(["--model.hidden=7", "--optimizer.lr=0.3",
                                "--lr_scheduler.step_size=2", "--trainer.max_epochs=4"])
    assert config.model.hidden == 7 and config.optimizer.lr == 0.3
    assert config.lr_scheduler.step_size == 2 and config.trainer.max_epochs == 4
    assert set(parser._optimizers) == {"optimizer"}
    with pytest.raises(Exception, match="max_epochs"):
        parser.parse_args(["--trainer.max_epochs=many"])


def _save_config_refuses_to_overwrite():
    with tempfile.TemporaryDirectory() as root, _program_argv():
        run = cli.LightningCLI(SmokeModel, SmokeData, run=False, args=[
            f"--trainer.default_root_dir={root}", "--trainer.max_epochs=1", *_QUIET])
        saver = cli.SaveConfigCallback(run.parser, run.config)
        saver.setup(run.trainer, run.model, "fit")
        folder = Path(run.trainer.log_dir)  # Lightning's: the default root without a logger
        assert "hidden: 3" in (folder / "config.yaml").read_text()
        with pytest.raises(RuntimeError, match="overwrite"):
            cli.SaveConfigCallback(run.parser, run.config).setup(run.trainer, run.model, "fit")
        run.config.model.hidden = 9
        cli.SaveConfigCallback(run.parser, run.config, overwrite=True).setup(
            run.trainer, run.model, "fit")
        assert "hidden: 9" in (folder / "config.yaml").read_text()
        with pytest.raises(ValueError, match="save_config"):
            cli.SaveConfigCallback(run.parser, run.config, save_to_log_dir=False)


def _instantiate_class():
    params = [nn.Parameter(torch.zeros(2))]
    optimizer = cli.instantiate_class(params, {"class_path": "torch.optim.SGD",
                                               "init_args": {"lr": 0.25, "momentum": 0.5}})
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.param_groups[0]["lr"] == 0.25 and optimizer.param_groups[0]["params"] == params
    scheduler = cli.instantiate_class(optimizer, {"class_path": "torch.optim.lr_scheduler.StepLR",
                                                  "init_args": {"step_size": 3}})
    assert scheduler.step_size == 3


def _instantiate_module():
    model = cli.instantiate_module(SmokeModel, {"hidden": 6})
    assert type(model) is SmokeModel and model.net[0].out_features == 6
    sub = cli.instantiate_module(SmokeModel, {"_class_path": f"{__name__}.WiderSmokeModel",
                                              "hidden": 2})
    assert type(sub) is WiderSmokeModel and sub.net[0].out_features == 2


def _reduce_on_plateau_steps_on_its_monitor():
    with tempfile.TemporaryDirectory() as root, _program_argv():
        run = cli.LightningCLI(SmokeModel, SmokeData, args=[
            "fit", f"--trainer.default_root_dir={root}", "--trainer.max_epochs=3",
            "--optimizer=SGD", "--optimizer.lr=0.1",
            "--lr_scheduler=ptrain.lightning.cli.ReduceLROnPlateau",
            "--lr_scheduler.monitor=train_loss", "--lr_scheduler.patience=0",
            "--lr_scheduler.threshold_mode=abs", "--lr_scheduler.threshold=1000",
            "--seed_everything=0", *_QUIET])
        (config,) = run.trainer.lr_schedulers
        assert isinstance(config["scheduler"], cli.ReduceLROnPlateau)
        assert config["monitor"] == "train_loss"
        # after the first epoch none improves on the best by 1000: the rate falls tenfold after
        # the second and the third
        assert run.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(1e-3)


def _types_choose_classes():
    assert set(typing.get_args(cli.ArgsType)) >= {list[str], dict[str, typing.Any],
                                                  type(None)}
    assert typing.get_args(cli.LRSchedulerTypeUnion) == cli.LRSchedulerTypeTuple
    assert typing.get_args(cli.LRSchedulerType) == tuple(type[c]
                                                         for c in cli.LRSchedulerTypeTuple)
    assert isinstance(cli.ModuleType, typing.TypeVar)
    with _program_argv():
        run = cli.LightningCLI(InjectedModel, SmokeData, run=False, args={
            "trainer": {"max_epochs": 1},
            "model": {"optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.3}},
                      "scheduler": {"class_path": "torch.optim.lr_scheduler.StepLR",
                                    "init_args": {"step_size": 2}}}})
    [optimizer], [scheduler] = run.model.configure_optimizers()
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.param_groups[0]["lr"] == 0.3
    assert isinstance(scheduler, cli.LRSchedulerTypeTuple) and scheduler.step_size == 2
    assert run.model.hparams["hidden"] == 3
    remade = run.model.hparams["optimizer"](run.model.parameters())  # kept as made by the CLI
    assert isinstance(remade, torch.optim.SGD) and remade.param_groups[0]["lr"] == 0.3


def _configure_optimizers():
    model = SmokeModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert cli.LightningCLI.configure_optimizers(model, optimizer) is optimizer
    step = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    assert cli.LightningCLI.configure_optimizers(model, optimizer, step) == ([optimizer], [step])
    plateau = cli.ReduceLROnPlateau(optimizer, monitor="val_loss")
    answer = cli.LightningCLI.configure_optimizers(model, optimizer, plateau)
    assert answer["lr_scheduler"] == {"scheduler": plateau, "monitor": "val_loss"}


def _lightning_cli():
    _fits_and_saves_its_config()
    _configure_optimizers()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no stray warning from a plain run=False CLI
        with tempfile.TemporaryDirectory() as root, _program_argv():
            run = cli.LightningCLI(SmokeModel, SmokeData, run=False, args=[
                f"--trainer.default_root_dir={root}", "--trainer.max_epochs=1",
                "--seed_everything=false", *_QUIET])
    assert isinstance(run.trainer, pl.Trainer) and isinstance(run.datamodule, SmokeData)
    assert run.config.seed_everything is False


SMOKE = {
    "LightningCLI": _lightning_cli,
    "LightningArgumentParser": _parser_groups,
    "SaveConfigCallback": _save_config_refuses_to_overwrite,
    "instantiate_class": _instantiate_class,
    "instantiate_module": _instantiate_module,
    "ReduceLROnPlateau": _reduce_on_plateau_steps_on_its_monitor,
    "ArgsType": _types_choose_classes,
    "OptimizerCallable": _types_choose_classes,
    "LRSchedulerCallable": _types_choose_classes,
    "LRSchedulerType": _types_choose_classes,
    "LRSchedulerTypeTuple": _types_choose_classes,
    "LRSchedulerTypeUnion": _types_choose_classes,
    "ModuleType": _types_choose_classes,
}
