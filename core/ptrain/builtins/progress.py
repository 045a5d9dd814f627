"""The ``progress-bar`` callback: a live bar on a terminal, plain lines otherwise.

Shows the epoch (or the validate/test/predict pass), batches done, it/s and the metrics logged
with ``prog_bar=True`` (running means for those the stage under way averages). It turns metrics
into numbers (a host sync) only when it redraws, at most every ``refresh_rate`` seconds on a
terminal. What a stage ended with is printed by the ``results`` callback, with or without the
bar. Turn the bar off with ``--no-progress-bar`` (the same as ``-p no:progress-bar``).
"""

from __future__ import annotations

import sys
import time

from ptrain.builtins.results import format_metrics as _format
from ptrain.hookspecs import hookimpl

PLAIN_INTERVAL_S = 30.0  # without a terminal, a mid-epoch line at most this often
_ACTIVE = {"validate": "Validating", "test": "Testing", "predict": "Predicting"}


class ProgressBar:
    def __init__(self, refresh_rate: float = 0.2):
        self.refresh_rate = refresh_rate
        self.enabled = False  # until setup: a run can fail before it
        self.live = None
        self.task = None
        self.fit_start = 0.0

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("refresh_rate", float, default=0.2,
                    help="seconds between redraws of the bar on a terminal")

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        self.enabled = trainer.is_global_zero
        self.terminal = sys.stdout.isatty()
        self.fit_start = self.last_draw = time.monotonic()
        self.stage = stage
        self.task = None

    @hookimpl
    def on_evaluation_batch_end(self, trainer, stage: str, batch_idx: int) -> None:
        """Progress of a ``validate``, ``test`` or ``predict`` run (within ``fit``, validation
        stays under the training bar)."""
        if not self.enabled or self.stage == "fit":
            return
        now = time.monotonic()
        done = batch_idx + 1
        last = done >= trainer.num_eval_batches
        if now - self.last_draw < (self.refresh_rate if self.terminal else PLAIN_INTERVAL_S) \
                and not (last and self.terminal):
            return
        self.last_draw = now
        total = trainer.num_eval_batches
        total = None if total == float("inf") else int(total)
        metrics = _format(self.shown_metrics(trainer))
        label = _ACTIVE[stage]
        if not self.terminal:
            of = f"/{total}" if total is not None else ""
            print(f"{label}  batch {done}{of}  {metrics}  ...".rstrip(), flush=True)
            return
        if self.live is None:
            self.live = self._new_progress()
            self.live.start()
        if self.task is None:
            self.task = self.live.add_task(label, total=total, completed=0, rate="", metrics="")
        elapsed = now - self.fit_start
        rate = f"{done / elapsed:.1f} it/s" if elapsed > 0 else ""
        self.live.update(self.task, completed=done, rate=rate, metrics=metrics)
        self.live.refresh()

    @hookimpl
    def on_epoch_start(self, trainer) -> None:
        if not self.enabled:
            return
        self.epoch_start = self.last_draw = time.monotonic()
        self.start_batch = trainer.loop_state.get("batch", 0)
        total = trainer.num_training_batches
        self.total = None if total == float("inf") else int(total)
        if self.terminal:
            if self.live is None:
                self.live = self._new_progress()
                self.live.start()
            self.task = self.live.add_task(self._epoch_label(trainer), total=self.total,
                                           completed=self.start_batch, rate="", metrics="")

    def shown_metrics(self, trainer) -> dict[str, float]:
        """The metrics the bar shows: those logged with ``prog_bar=True`` (a subclass may show
        others: Lightning's ``get_metrics``)."""
        return trainer.metrics.progress_values()

    @staticmethod
    def _new_progress():
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        return Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[metrics]}"), auto_refresh=False,
        )

    def _epoch_label(self, trainer) -> str:
        """``Epoch 0/2`` for the first of 3 epochs: epochs count from 0, as in every other
        message and the checkpoints' names (``epoch=0-...``), and as Lightning's bar shows them;
        the limit is the last epoch's number."""
        limit = f"/{trainer.max_epochs - 1}" if trainer.max_epochs not in (None, -1) else ""
        return f"Epoch {trainer.current_epoch}{limit}"

    def _rate(self, batches_done: int) -> str:
        elapsed = time.monotonic() - self.epoch_start
        return f"{(batches_done - self.start_batch) / elapsed:.1f} it/s" if elapsed > 0 else ""

    @hookimpl
    def on_train_batch_end(self, trainer, batch, batch_idx: int, loss) -> None:  # see hook_calls
        if not self.enabled:
            return
        now = time.monotonic()
        interval = self.refresh_rate if self.terminal else PLAIN_INTERVAL_S
        if now - self.last_draw < interval:
            return
        self.last_draw = now
        self._draw(trainer, batch_idx + 1)

    def _draw(self, trainer, done: int, final: bool = False) -> None:
        metrics = _format(self.shown_metrics(trainer))
        rate = self._rate(done)
        if self.terminal and not final:
            self.live.update(self.task, completed=done, rate=rate, metrics=metrics)
            self.live.refresh()
            return
        total = f"/{self.total}" if self.total is not None else ""
        line = (f"{self._epoch_label(trainer)}  batch {done}{total}  step {trainer.global_step}  "
                f"{rate}  {metrics}  {'done' if final else '...'}").rstrip()
        if self.terminal:  # a finished epoch becomes a line above the one live bar
            self.live.remove_task(self.task)
            self.live.console.print(line, highlight=False)
            self.live.refresh()
        else:
            print(line, flush=True)

    @hookimpl
    def on_epoch_end(self, trainer) -> None:
        if self.enabled:
            self._draw(trainer, trainer.batch_idx + 1, final=True)

    @hookimpl
    def teardown(self, trainer, stage: str) -> None:
        if not self.enabled:
            return
        if self.live is not None:
            self.live.stop()
            self.live = None
