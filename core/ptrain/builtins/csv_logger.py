"""The ``csv`` callback: every published metric as a row of ``<run folder>/metrics.csv``.

No dependency beyond the standard library, and not on by default: ``-p csv``. The file is what a
Lightning user opens with pandas: a ``step`` column (``trainer.global_step`` when the row was
published: the optimizer steps taken, as TensorBoard's steps here; Lightning's is one less), an
``epoch`` column (``trainer.current_epoch`` then), and one column per metric name, empty where a
row has no value for it; the header is every name, sorted. One row per ``log_metrics`` call, so
the step metrics and the epoch metrics published at the same step are two rows. When a metric name appears that the
file has no column for (validation metrics first arrive after some training rows), the file is
rewritten once with the wider header, the earlier rows keeping empty cells in the new column.

Cost: ``log_metrics`` fires only at the core's publish points and only appends to a list; rows
reach the file every ``flush_every_n_steps`` optimizer steps, at the end of each epoch and at
teardown (also after an error). Only global rank 0 writes.

With ``log_config`` (on by default) the run's resolved configuration is written next to it as
``config.toml`` (``ptrain fit --config`` reads it back); the hyperparameters are in
``hparams.toml`` there, written by the core.

A write the system refuses (a full disk) leaves the file as it was (a rewrite goes to a temporary
file first; an append that fails is cut off again) and is handled as ``on_write_error`` says
(:mod:`ptrain.builtins.log_writes`): the run stops with the error (``stop``, the default), or it
is said once and training goes on without the file (``warn``).
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import Any

from ptrain.builtins.log_writes import add_write_error_option, refused, write_error_choice
from ptrain.config import dump_config, positive
from ptrain.hookspecs import hookimpl
from ptrain.options import to_int

METRICS_FILE = "metrics.csv"
CONFIG_FILE = "config.toml"
#: The columns every row has.
INDEX_COLUMNS = ("step", "epoch")


#: a number of optimizer steps, at least 1
_positive_int = positive(to_int)


class CSVLogger:
    """Writes metrics to ``<run folder>/metrics.csv`` (see the module's docstring)."""

    name = "csv"  # its entry point's name, also when given as an object

    def __init__(self, flush_every_n_steps: int = 100, log_config: bool = True,
                 on_write_error: str = "stop") -> None:
        self.flush_every_n_steps = _positive_int(flush_every_n_steps)
        self.log_config = log_config
        self.on_write_error = write_error_choice("csv", on_write_error)
        self._checkpoint: Path | None = None  # the run's last.ckpt, named by a refusal's advice
        self._refused = False  # a write was refused: nothing more is written this stage
        self.path: Path | None = None
        self.columns: list[str] = []  # the header of the file as written
        self.rows: list[dict[str, Any]] = []  # published, not yet written
        self._flushed_step = 0

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("flush_every_n_steps", _positive_int, default=100,
                    help="write the buffered rows every n optimizer steps (also at each epoch "
                         "end and at the end of the run)")
        options.add("log_config", bool, default=True,
                    help="also write the run's resolved configuration to config.toml in the run "
                         "folder")
        add_write_error_option(options, "metrics.csv or config.toml")

    @hookimpl
    def setup(self, trainer) -> None:
        self.rows, self.columns, self.path = [], [], None
        self._flushed_step = trainer.global_step
        self._refused = False
        if not trainer.is_global_zero:
            return
        self.path = self._writes_to(trainer) / METRICS_FILE
        self._checkpoint = trainer.last_checkpoint_path
        if self.path.is_file():  # a resumed run continues its own file
            with open(self.path, newline="", encoding="utf-8") as f:
                self.columns = next(csv.reader(f), [])

    def _writes_to(self, trainer) -> Path:
        """The folder this logger writes to in a stage: the run folder."""
        return Path(trainer.run_dir)

    @hookimpl
    def log_hyperparams(self, trainer) -> None:
        if self.path is None or not self.log_config or self._refused:
            return
        file = self.path.parent / CONFIG_FILE
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(dump_config(trainer.config), encoding="utf-8")
        except OSError as exc:
            self._refuse(file, exc, "the run's configuration")

    @hookimpl
    def log_metrics(self, trainer, metrics: dict[str, float], step: int) -> None:
        if self.path is None or self._refused:
            return
        self.rows.append({"step": step, "epoch": trainer.current_epoch, **metrics})
        if step - self._flushed_step >= self.flush_every_n_steps:
            self.flush()

    @hookimpl
    def on_epoch_end(self) -> None:
        self.flush()

    @hookimpl
    def teardown(self) -> None:
        self.flush(stage_over=True)

    def flush(self, stage_over: bool = False) -> None:
        """Write the buffered rows: appended when the header has all their names, else the
        whole file rewritten with a header of all names, sorted. A write the system refuses
        leaves the file as it was and is handled as ``on_write_error`` says (at the end of a
        stage, ``stage_over``, it is said)."""
        if self.path is None or not self.rows or self._refused:
            return
        self._flushed_step = self.rows[-1]["step"]
        try:
            self._write_rows()
        except OSError as exc:
            self._refuse(self.path, exc, "the CSV log", stage_over)
        self.rows = []

    def _refuse(self, file: Path, error: OSError, what: str, stage_over: bool = False) -> None:
        self._refused = True
        refused("csv", self.on_write_error, file, error, what, self._checkpoint, stage_over)

    def _write_rows(self) -> None:
        new = [k for row in self.rows for k in row if k not in self.columns]
        new = list(dict.fromkeys(new))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if new or not self.path.is_file():
            old_rows = []
            if self.path.is_file():
                with open(self.path, newline="", encoding="utf-8") as f:
                    old_rows = list(csv.DictReader(f))
            columns = sorted({*self.columns, *INDEX_COLUMNS, *new})
            tmp = self.path.with_suffix(".csv.tmp")
            try:
                with open(tmp, "w", newline="", encoding="utf-8") as f:
                    writer = csv.DictWriter(f, fieldnames=columns)
                    writer.writeheader()
                    writer.writerows(old_rows)
                    writer.writerows(_cells(row) for row in self.rows)
                tmp.replace(self.path)
            except OSError:
                tmp.unlink(missing_ok=True)
                raise
            self.columns = columns
        else:
            size = self.path.stat().st_size
            try:
                with open(self.path, "a", newline="", encoding="utf-8") as f:
                    csv.DictWriter(f, fieldnames=self.columns).writerows(
                        _cells(row) for row in self.rows)
            except OSError:
                os.truncate(self.path, size)  # no row cut short (a number read as another)
                raise


def _cells(row: dict[str, Any]) -> dict[str, Any]:
    """Numbers as Python writes them (``repr``: read back exactly by ``float``); NaN and
    infinities as ``nan``/``inf``/``-inf``."""
    out = {}
    for key, value in row.items():
        if isinstance(value, float) and math.isfinite(value):
            out[key] = repr(value)
        else:
            out[key] = value
    return out
