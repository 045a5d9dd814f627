"""A model and a callback for the tests of a logger's file on a full disk
(``tests/test_logger_write_errors.py``), importable by the ``ptrain`` processes they start."""

from __future__ import annotations

from pathlib import Path

import ptrain
from tests._faults import fill_tmpfs
from tests.conftest import TinyRegressor


class FillDisk:
    """A callback that fills the tmpfs at ``path`` once the run has taken ``at_step`` optimizer
    steps (``-p tests._log_fault_models:FillDisk --fill-disk-path P --fill-disk-at-step N``):
    the run's next writes there are refused, at a known point of the run and from inside it."""

    def __init__(self, path: str = "", at_step: int = 1):
        self.path, self.at_step = Path(path), at_step

    @staticmethod
    @ptrain.hookimpl
    def add_options(options) -> None:
        options.add("path", str, default="", help="the mounted tmpfs to fill")
        options.add("at_step", int, default=1, help="fill it after this optimizer step")

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer) -> None:
        if trainer.global_step == self.at_step and trainer.is_global_zero:
            fill_tmpfs(self.path)


class ChattyRegressor(TinyRegressor):
    """``TinyRegressor`` on 1024 samples (128 steps an epoch) that logs ten more numbers at every
    step: a logger's file grows by some hundred bytes a step."""

    def __init__(self):
        super().__init__(n=1024)

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log_dict({f"chat{i}": loss.detach() * i for i in range(10)})
        return loss
