"""The ``checkpoint`` callback: writes the resumable ``last.ckpt`` and, with a monitor, ``best.ckpt``.

Files go to ``<run folder>/checkpoints/``; ``--ckpt-path last`` resumes from the newest run's
``last.ckpt``. Writing is atomic (see :func:`ptrain.checkpoint_io.atomic_save`).
"""

from __future__ import annotations

import math
from typing import Any

from ptrain.errors import ConfigError
from ptrain.hookspecs import hookimpl


class ModelCheckpoint:
    name = "checkpoint"  # its entry point's name, also when given as an object

    def __init__(self, every_n_epochs: int = 1, every_n_train_steps: int = 0,
                 monitor: str | None = None, mode: str = "min"):
        self.every_n_epochs = every_n_epochs
        self.every_n_train_steps = every_n_train_steps
        self.monitor = monitor
        self.mode = mode
        self.best: float | None = None
        self.best_step: int | None = None
        self._last_saved_step = -1

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("every_n_epochs", int, default=1,
                    help="write last.ckpt at the end of every n-th epoch (0: never)")
        options.add("every_n_train_steps", int, default=0,
                    help="also write last.ckpt every n optimizer steps (0: never)")
        options.add("monitor", str, help="metric whose best value is kept in best.ckpt")
        options.add("mode", str, default="min", choices=("min", "max"),
                    help="whether a lower or a higher monitored value is better")

    def _save_last(self, trainer) -> None:
        trainer.save_checkpoint(trainer.last_checkpoint_path)
        self._last_saved_step = trainer.global_step

    @hookimpl
    def on_train_batch_end(self, trainer, batch, batch_idx, loss) -> None:  # all: see hook_calls
        n = self.every_n_train_steps
        # only where an optimizer step just happened: mid-window gradients are not saved
        if (n and trainer.sync_gradients and trainer.global_step % n == 0
                and trainer.global_step != self._last_saved_step):
            self._save_last(trainer)

    @hookimpl
    def on_epoch_end(self, trainer) -> None:
        n = self.every_n_epochs
        if n and (trainer.current_epoch + 1) % n == 0:
            self._save_last(trainer)

    @hookimpl
    def on_validation_end(self, trainer) -> None:
        if self.monitor is None or trainer.stage != "train":
            return
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            raise ConfigError(
                f"checkpoint monitor {self.monitor!r} was not logged; logged metrics: "
                f"{', '.join(sorted(metrics)) or '(none)'}. Log it with self.log({self.monitor!r}, "
                f"...) or change --checkpoint-monitor."
            )
        value = float(metrics[self.monitor])
        better = self.best is None or (value < self.best if self.mode == "min" else value > self.best)
        if better and not math.isnan(value):
            self.best, self.best_step = value, trainer.global_step
            trainer.save_checkpoint(trainer.log_dir / "checkpoints" / "best.ckpt")

    @hookimpl
    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step, "monitor": self.monitor}

    @hookimpl
    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("monitor") == self.monitor:
            self.best, self.best_step = state["best"], state["best_step"]
