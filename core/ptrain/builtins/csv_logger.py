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
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

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

    def __init__(self, flush_every_n_steps: int = 100, log_config: bool = True) -> None:
        self.flush_every_n_steps = _positive_int(flush_every_n_steps)
        self.log_config = log_config
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

    @hookimpl
    def setup(self, trainer) -> None:
        self.rows, self.columns, self.path = [], [], None
        self._flushed_step = trainer.global_step
        if not trainer.is_global_zero:
            return
        self.path = Path(trainer.run_dir) / METRICS_FILE
        if self.path.is_file():  # a resumed run continues its own file
            with open(self.path, newline="", encoding="utf-8") as f:
                self.columns = next(csv.reader(f), [])

    @hookimpl
    def log_hyperparams(self, trainer) -> None:
        if self.path is not None and self.log_config:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            (self.path.parent / CONFIG_FILE).write_text(dump_config(trainer.config),
                                                        encoding="utf-8")

    @hookimpl
    def log_metrics(self, trainer, metrics: dict[str, float], step: int) -> None:
        if self.path is None:
            return
        self.rows.append({"step": step, "epoch": trainer.current_epoch, **metrics})
        if step - self._flushed_step >= self.flush_every_n_steps:
            self.flush()

    @hookimpl
    def on_epoch_end(self) -> None:
        self.flush()

    @hookimpl
    def teardown(self) -> None:
        self.flush()

    def flush(self) -> None:
        """Write the buffered rows: appended when the header has all their names, else the
        whole file rewritten with a header of all names, sorted."""
        if self.path is None or not self.rows:
            return
        self._flushed_step = self.rows[-1]["step"]
        new = [k for row in self.rows for k in row if k not in self.columns]
        new = list(dict.fromkeys(new))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if new or not self.path.is_file():
            old_rows = []
            if self.path.is_file():
                with open(self.path, newline="", encoding="utf-8") as f:
                    old_rows = list(csv.DictReader(f))
            self.columns = sorted({*self.columns, *INDEX_COLUMNS, *new})
            tmp = self.path.with_suffix(".csv.tmp")
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=self.columns)
                writer.writeheader()
                writer.writerows(old_rows)
                writer.writerows(_cells(row) for row in self.rows)
            tmp.replace(self.path)
        else:
            with open(self.path, "a", newline="", encoding="utf-8") as f:
                csv.DictWriter(f, fieldnames=self.columns).writerows(
                    _cells(row) for row in self.rows)
        self.rows = []


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
