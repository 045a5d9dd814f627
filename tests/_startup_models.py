"""A module for tests/test_startup_bound.py, imported by its ``ptrain`` subprocesses as
``tests._startup_models:PortRecorder``."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import TinyRegressor


class PortRecorder(TinyRegressor):
    """TinyRegressor that writes ``MASTER_ADDR:MASTER_PORT`` as its rank saw them to
    ``folder/RANK.endpoint`` at its first training step."""

    def __init__(self, folder: str, **kwargs):
        super().__init__(**kwargs)
        self.folder = folder

    def training_step(self, batch, batch_idx):
        if batch_idx == 0:
            path = Path(self.folder) / f"{self.trainer.global_rank}.endpoint"
            path.write_text(f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")
        return super().training_step(batch, batch_idx)
