"""``lightning.pytorch.loggers.csv_logs``: Lightning's ``CSVLogger`` over ptrain's ``csv`` logger
plugin."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch

from ptrain.builtins.csv_logger import CSVLogger as _CSV
from ptrain.builtins.loop_defaults import HPARAMS_FILE
from ptrain.config import dump_hyperparameters, tomllib
from ptrain.hookspecs import hookimpl
from ptrain.lightning.loggers._run_folder import RunFolder
from ptrain.lightning.loggers.logger import Logger


class CSVLogger(RunFolder, Logger, _CSV):
    """Lightning's ``CSVLogger``: ``metrics.csv`` in the run folder (``save_dir/name/version_N``),
    one row per ``log_metrics`` call, written every ``flush_logs_every_n_steps`` steps, at each
    epoch's end and at the end of the stage (and by ``save()``).

    Its methods take Lightning's arguments: ``log_metrics(metrics, step=None)`` adds a row
    (``step`` defaults to the number of rows so far, as Lightning's), and
    ``log_hyperparams(params)`` records the hyperparameters in the run folder's
    ``hparams.toml`` (ptrain's form of Lightning's ``hparams.yaml``), beside the run's own.
    Called before the first stage, what they are given is written when the run folder is
    chosen.
    """

    plugin_name = "csv"
    _save_after_publish = False  # rows reach the file on the csv plugin's schedule

    def __init__(self, save_dir: Any = ".", name: str | None = "lightning_logs",
                 version: Any = None, prefix: str = "", flush_logs_every_n_steps: int = 100):
        _CSV.__init__(self, flush_every_n_steps=flush_logs_every_n_steps)
        self._init_folder("CSVLogger", save_dir, name, version, prefix)
        self.hparams: dict[str, Any] = {}  # what log_hyperparams was given, as Lightning's
        self._rows_given = 0  # rows log_metrics received: a step left out counts them
        self._early: list[dict[str, Any]] = []  # rows given before the first stage
        # False from setup until the loop starts: the run writes its own hparams.toml then
        self._hparams_ready = True
        self._hparams_unwritten = False

    @property
    def log_dir(self) -> str:
        """The run folder; before the first stage, the one it will choose (the next free
        ``version_N``)."""
        return str(Path(self.path).parent) if self.path is not None else self._folder()

    @property
    def experiment(self) -> _CSVExperiment:
        """Lightning's experiment writer: ``log_metrics``, ``log_hparams``, ``save``,
        ``metrics_file_path``, ``log_dir``."""
        return _CSVExperiment(self)

    # -- Lightning's methods ---------------------------------------------------------------

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Add a row with ``metrics`` at ``step``; none after a refused write (as the ``csv``
        plugin's ``on_write_error="warn"``: nothing more is written in that stage)."""
        if self._rank() > 0:
            return
        if step is None:
            step = self._rows_given
        self._rows_given += 1
        if self._refused:  # on_write_error="warn": said once, nothing more this stage
            return
        row = {"step": step, **{name: value.item() if isinstance(value, torch.Tensor) else value
                                for name, value in metrics.items()}}
        if self.path is None:
            self._early.append(row)
            return
        self.rows.append(row)
        if step - self._flushed_step >= self.flush_every_n_steps:
            self.flush()

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Record ``params`` (a dict or ``argparse.Namespace``) in ``hparams.toml``."""
        if self._rank() > 0:
            return
        if isinstance(params, argparse.Namespace):
            params = vars(params)
        self.hparams.update(params)
        self._hparams_unwritten = True
        if self._hparams_ready:
            self._write_hparams()

    def save(self) -> None:
        """Write the rows given so far."""
        self.flush()

    def _publish_hyperparams(self, trainer: Any, hyperparameters: dict[str, Any]) -> None:
        _CSV.log_hyperparams(self, trainer)  # the run's configuration, as config.toml
        super()._publish_hyperparams(trainer, hyperparameters)

    def _write_hparams(self) -> None:
        """Add the hyperparameters given to ``hparams.toml``: whole (the old file stays until
        the new one is complete); a write the system refuses is handled as the csv plugin's
        ``on_write_error`` says, and nothing more is written in that stage."""
        if self.path is None or not self.hparams or self._refused:
            return
        file = self.path.parent / HPARAMS_FILE
        written = tomllib.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
        new = file.with_name(f".{file.name}.tmp")
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            new.write_text(dump_hyperparameters({**written, **self.hparams}), encoding="utf-8")
            os.replace(new, file)
        except OSError as exc:
            new.unlink(missing_ok=True)
            self._refuse(file, exc, "the hyperparameters")
        self._hparams_unwritten = False

    # -- the stage ---------------------------------------------------------------------------

    @hookimpl(specname="setup", trylast=True)  # after the csv plugin chose its file
    def _stage_starts(self) -> None:
        self._hparams_ready = False
        if self.path is not None and self._early:
            self.rows.extend(self._early)
            self._early = []

    @hookimpl(specname="on_loop_start")
    def _stage_runs(self) -> None:
        # the run's hparams.toml is written by now (log_hyperparams came before): add to it
        if not self._hparams_ready:
            self._hparams_ready = True
            if self._hparams_unwritten:
                self._write_hparams()

    @hookimpl(specname="teardown")
    def _stage_ends(self) -> None:
        self._hparams_ready = True


class _CSVExperiment:
    """What Lightning's ``CSVLogger.experiment`` offers, over the logger."""

    def __init__(self, logger: CSVLogger):
        self._logger = logger

    def log_metrics(self, metrics_dict: dict[str, Any], step: int | None = None) -> None:
        self._logger.log_metrics(metrics_dict, step)

    def log_hparams(self, params: dict[str, Any]) -> None:
        self._logger.log_hyperparams(params)

    def save(self) -> None:
        self._logger.save()

    @property
    def log_dir(self) -> str | None:
        return self._logger.log_dir

    @property
    def metrics_file_path(self) -> str | None:
        path = self._logger.path
        return str(path) if path is not None else None


__all__ = ["CSVLogger"]
