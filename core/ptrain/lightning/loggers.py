"""``lightning.pytorch.loggers``: Lightning's logger classes over ptrain's logger plugins.

A Lightning logger names the run folder: ``save_dir/name/version_N`` (``name`` defaults to
``lightning_logs``), where ptrain's :class:`~ptrain.lightning.Trainer` then writes the run's
logs and checkpoints, as Lightning does. ``MLFlowLogger`` and ``WandbLogger`` come with the
``ptrain-mlflow`` and ``ptrain-wandb`` distributions.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ptrain.builtins.csv_logger import CSVLogger as _CSV
from ptrain.builtins.tensorboard import TensorBoardLogger as _TensorBoard
from ptrain.lightning._common import from_distribution, refuse_unless


class _RunFolder:
    """What a Lightning logger says about the run folder."""

    save_dir: str
    _name: str

    def _init_folder(self, owner: str, save_dir: Any, name: str | None, version: Any,
                     prefix: str) -> None:
        refuse_unless(owner, {"version": version, "prefix": prefix}, {
            "version": (None, "ptrain numbers the run folders itself (version_N, the next "
                              "free one); leave version out"),
            "prefix": ("", "metric names are published as logged; add the prefix to the names "
                           "in self.log"),
        })
        self.save_dir, self._name = os.fspath(save_dir), name or ""
        self._run_dir: str | None = None  # set by the Trainer once a stage chose the folder

    @property
    def root_dir(self) -> str:
        """The folder the ``version_N`` run folders go under."""
        return str(Path(self.save_dir) / self._name)


class CSVLogger(_CSV, _RunFolder):
    """Lightning's ``CSVLogger``: ``metrics.csv`` (and ``hparams.yaml``'s content as
    ``hparams.toml``) in the run folder."""

    def __init__(self, save_dir: Any = ".", name: str | None = "lightning_logs",
                 version: Any = None, prefix: str = "", flush_logs_every_n_steps: int = 100):
        _CSV.__init__(self, flush_every_n_steps=flush_logs_every_n_steps)
        self._init_folder("CSVLogger", save_dir, name, version, prefix)

    @property
    def log_dir(self) -> str | None:
        """The run folder (``None`` before the first stage)."""
        return str(Path(self.path).parent) if self.path is not None else self._run_dir


class TensorBoardLogger(_TensorBoard, _RunFolder):
    """Lightning's ``TensorBoardLogger``: event files in the run folder. ``experiment`` is the
    ``SummaryWriter`` (on rank 0, during a stage). ptrain writes no ``hp_metric`` placeholder,
    so ``default_hp_metric`` changes nothing."""

    def __init__(self, save_dir: Any = ".", name: str | None = "lightning_logs",
                 version: Any = None, log_graph: bool = False, default_hp_metric: bool = True,
                 prefix: str = "", sub_dir: Any = None):
        _TensorBoard.__init__(self)
        self._init_folder("TensorBoardLogger", save_dir, name, version, prefix)
        refuse_unless("TensorBoardLogger", {"log_graph": log_graph, "sub_dir": sub_dir}, {
            "log_graph": (False, "add the graph yourself with "
                                 "self.logger.experiment.add_graph(...)"),
            "sub_dir": (None, "event files go to the run folder itself"),
        })
        self.default_hp_metric = default_hp_metric

    @property
    def log_dir(self) -> str | None:
        """The run folder (``None`` before the first stage)."""
        return self.writer.log_dir if self.writer is not None else self._run_dir


def __getattr__(name: str) -> Any:
    return from_distribution(__name__, name, _FROM_DISTRIBUTIONS)


_FROM_DISTRIBUTIONS = {
    "MLFlowLogger": ("ptrain-mlflow", "ptrain.lightning._mlflow_logger", "MLFlowLogger"),
    "WandbLogger": ("ptrain-wandb", "ptrain.lightning._wandb_logger", "WandbLogger"),
}

__all__ = ["CSVLogger", "TensorBoardLogger", *_FROM_DISTRIBUTIONS]
