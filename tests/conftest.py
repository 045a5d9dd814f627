"""Shared fixtures: small real models and data made by code, and a way to run the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ptrain
from ptrain.examples import config_path

REPO = Path(__file__).resolve().parent.parent
#: the config of the example that ships with the core (`ptrain example digits` trains it)
DIGITS_CONFIG = config_path("digits")


def make_regression_data(n: int = 64, features: int = 4, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    y = x @ w + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


class TinyRegressor(ptrain.TrainModule):
    """A linear model on made-up regression data; every knob a test needs is an init argument."""

    def __init__(self, n: int = 64, batch_size: int = 8, lr: float = 0.1, shuffle: bool = False,
                 dropout: float = 0.0, optimizer: str = "sgd", scheduler: dict | None = None,
                 val_n: int = 16, with_val: bool = True):
        super().__init__()
        self.net = nn.Sequential(nn.Dropout(dropout), nn.Linear(4, 1))
        self.batch_size, self.lr, self.shuffle = batch_size, lr, shuffle
        self.optimizer_name, self.scheduler = optimizer, scheduler
        self.train_set = make_regression_data(n, seed=0)
        self.val_set = make_regression_data(val_n, seed=1) if with_val else None

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        if self.optimizer_name == "adam":
            opt = torch.optim.Adam(self.parameters(), lr=self.lr)
        else:
            opt = torch.optim.SGD(self.parameters(), lr=self.lr)
        if self.scheduler is None:
            return opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=self.scheduler["gamma"])
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched,
                                                   "interval": self.scheduler["interval"]}}

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=self.shuffle)

    def val_dataloader(self):
        if self.val_set is None:
            return None
        return DataLoader(self.val_set, batch_size=8)


@pytest.fixture(autouse=True)
def _no_seed_left_by_an_earlier_test(monkeypatch):
    """Each test starts without the seed variables an earlier test's ``seed_everything`` left in
    this process: a program a test starts inherits them, and would seed as it never does when
    run alone."""
    for variable in ("PTRAIN_GLOBAL_SEED", "PL_GLOBAL_SEED", "PL_SEED_WORKERS"):
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture
def tiny_module():
    return TinyRegressor


@pytest.fixture
def make_trainer(tmp_path):
    """``make_trainer(**options)``: a Trainer writing under ``tmp_path``, without progress output
    unless asked for."""

    def make(**options):
        options.setdefault("default_root_dir", str(tmp_path / "runs"))
        options.setdefault("accelerator", "cpu")
        options.setdefault("callbacks", ["no:progress-bar"])
        return ptrain.Trainer(**options)

    return make


@dataclass
class CLIResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, cwd: Path | str = REPO, env: dict | None = None,
            timeout: float = 300) -> CLIResult:
    """Run the real ``ptrain`` command (as ``python -m ptrain``) in a subprocess."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "ptrain", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    return CLIResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli():
    return run_cli


# -- the suite's own pytest plugins ---------------------------------------------------------
# Imported inside the hooks: scripts and `ptrain` processes import this module for its models
# with only tests/ (or only the repository) on sys.path, where `tests` is not importable.

def pytest_addoption(parser):
    from tests._campaigns import add_options

    add_options(parser)


def pytest_configure(config):
    from tests import _campaigns, _suite_time

    for plugin in (_campaigns, _suite_time):
        config.pluginmanager.register(plugin, f"ptrain-suite-{plugin.__name__}")
