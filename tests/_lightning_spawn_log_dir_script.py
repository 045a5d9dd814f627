"""Where a callback finds the run folder under ``ddp_spawn``, for tests/test_lightning_trainer.py:

    python -m tests._lightning_spawn_log_dir_script FRAMEWORK ROOT

``FRAMEWORK`` is ``lightning.pytorch`` or ``ptrain.lightning``. A one-process ``ddp_spawn`` fit
with a ``TensorBoardLogger`` under ``ROOT``, whose callback writes into ``ROOT/seen.json``, from
the worker, ``trainer.log_dir`` and ``trainer.logger.log_dir`` in its ``setup`` and
``on_fit_start`` (relative to ``ROOT``); ``ROOT/listing.json`` then holds the log folders."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

pl = importlib.import_module(sys.argv[1])
demos = importlib.import_module(f"{sys.argv[1]}.demos.boring_classes")
ROOT = Path(sys.argv[2])


class Probe(pl.Callback):
    def __init__(self) -> None:
        self.seen: list = []

    def _record(self, trainer, where: str) -> None:
        self.seen.append([where, os.path.relpath(trainer.log_dir, ROOT),
                          os.path.relpath(trainer.logger.log_dir, ROOT)])
        (ROOT / "seen.json").write_text(json.dumps(self.seen))

    def setup(self, trainer, pl_module, stage):
        self._record(trainer, "setup")

    def on_fit_start(self, trainer, pl_module):
        self._record(trainer, "on_fit_start")


if __name__ == "__main__":
    trainer = pl.Trainer(logger=pl.loggers.TensorBoardLogger(save_dir=str(ROOT)), max_steps=1,
                         strategy="ddp_spawn", devices=1, accelerator="cpu", callbacks=[Probe()],
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False)
    trainer.fit(demos.BoringModel())
    (ROOT / "listing.json").write_text(json.dumps(sorted(os.listdir(ROOT / "lightning_logs"))))
