"""A run whose disk fills while a checkpoint point writes, under
``on_write_error="warn"``, for tests/test_checkpoint_full_disk.py:

    python -m tests._checkpoint_full_disk_script ROOT LIMIT [--async]

The best file of ``val_metric`` (``VALUES``, one per epoch) is kept (``save_top_k=1``). Right
after epoch 1's top-k file is written (which pushes epoch 0's out), this process may write no
file past LIMIT bytes (``RLIMIT_FSIZE``: the system refuses with EFBIG): 0 refuses the top-k
record and ``last.ckpt``, 2048 ``last.ckpt`` only (the record is smaller). With ``--async`` the
limit is set on the writer's thread, between the two files of the point. Epoch 3 begins with
the limit lifted (the write in flight ended first). ``ROOT/checks.json``: after each epoch's
checkpoint point, the files the record names that are missing."""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import ptrain
from tests._es_models import SequenceModule

VALUES = [5, 3, 4, 1]


def set_limit(limit: int) -> None:
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))


class Filler:
    name = "filler"

    def __init__(self, root: Path, limit: int):
        self.root, self.limit, self.checks = root, limit, []

    @staticmethod
    def fills_after(path: str) -> bool:
        return Path(path).name.startswith("epoch=1-")

    @ptrain.hookimpl(trylast=True)  # after the checkpoint callback's point
    def on_epoch_end(self, trainer) -> None:
        folder = trainer.run_dir / "checkpoints"
        if not (folder / "best_k_models.json").exists():  # a background write's, not yet
            return
        record = json.loads((folder / "best_k_models.json").read_text())
        named = {record["best_model_path"], *record["best_k_models"]}
        self.checks.append({"epoch": trainer.current_epoch,
                            "missing": sorted(n for n in named if not (folder / n).exists())})

    @ptrain.hookimpl
    def on_epoch_start(self, trainer) -> None:
        if trainer.current_epoch == 3:
            while not trainer.checkpoint_write_done():
                time.sleep(0.01)
            set_limit(resource.RLIM_INFINITY)

    def write_checks(self) -> None:
        set_limit(resource.RLIM_INFINITY)
        (self.root / "checks.json").write_text(json.dumps(self.checks))


class SyncFiller(Filler):
    @ptrain.hookimpl(wrapper=True)
    def save_checkpoint(self, trainer, path):
        written = yield
        if self.fills_after(path):
            set_limit(self.limit)
        return written


class AsyncFiller(Filler):
    @ptrain.hookimpl(wrapper=True)
    def save_checkpoint_in_background(self, trainer, path):
        files = yield
        if self.fills_after(path):
            return [*files, lambda: set_limit(self.limit)]
        return files


def main(root: Path, limit: int, asynchronous: bool) -> int:
    filler = (AsyncFiller if asynchronous else SyncFiller)(root, limit)
    trainer = ptrain.Trainer(
        accelerator="cpu", max_epochs=len(VALUES), seed=0, default_root_dir=str(root),
        callbacks=["no:progress-bar", "no:tensorboard", "no:model-summary", filler],
        plugin_options={"checkpoint": {"monitor": "val_metric", "save_top_k": 1,
                                       "filename": "{epoch}-{val_metric:.1f}",
                                       "async_save": asynchronous, "on_write_error": "warn"}})
    try:
        trainer.fit(SequenceModule(VALUES))
    finally:
        filler.write_checks()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2]), "--async" in sys.argv[3:]))
