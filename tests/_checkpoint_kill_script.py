"""A run killed right after a checkpoint point wrote its files and before it deleted the file
that fell out of the top-k, for tests/test_checkpoint_kill.py:

    python -m tests._checkpoint_kill_script ROOT [--async] [--resume] [--strategy S]

The top 2 of ``val_metric`` (``VALUES``, one per epoch) are kept; epoch 2's file pushes epoch
0's out. Without ``--resume``, the run is killed (SIGKILL, of its whole process group: start it
in a session of its own) once the epoch-2 point's ``last.ckpt`` is complete and the dropped
file is still there: synchronously, as soon as ``last.ckpt`` is written (a wrapper of the
``save_checkpoint`` hook); with ``--async``, at the next step boundary, before the checkpoint
callback settles the background write, once that write has ended. ``--resume``: the same run
without the killer, resumed from ``last``. ``--strategy ddp``: 2 processes (the script
launcher), global rank 0 kills. ``ROOT/killed.json`` says at which step and what the folder
held then. ``--kill-before-last``: killed as that point's ``last.ckpt`` is begun (its top-k file
and record complete); resumed, epoch 2 logs ``RESUMED_VALUES``."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import ptrain
from tests._es_models import SequenceModule

VALUES = [5, 3, 4, 1, 2, 6]
#: what the run resumed after ``--kill-before-last`` logs: epoch 2 (done again) differs, as a
#: nondeterministic step's metric would, so its file gets another name
RESUMED_VALUES = [5, 3, 4.5, 1, 2, 6]
TOP_K = 2


def top_k_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.ckpt") if p.name != "last.ckpt")


class Killer:
    name = "killer"

    def __init__(self, root: Path):
        self.root = root

    def kill_if_due(self, trainer) -> None:
        """Kill the job when a top-k file written waits for its deletion."""
        held = top_k_files(Path(trainer.plugins["checkpoint"].dirpath))
        if len(held) <= TOP_K:
            return
        (self.root / "killed.json").write_text(json.dumps(
            {"step": trainer.global_step, "held": held,
             "folder": trainer.plugins["checkpoint"].dirpath}))
        sys.stdout.flush()
        os.killpg(os.getpgrp(), signal.SIGKILL)


class SyncKiller(Killer):
    @ptrain.hookimpl(wrapper=True)
    def save_checkpoint(self, trainer, path):
        written = yield
        if Path(path).name == "last.ckpt" and trainer.is_global_zero:
            self.kill_if_due(trainer)
        return written


class BeforeLastKiller(Killer):
    """Kills once the top-k file and its record are written, as ``last.ckpt`` is begun."""

    @ptrain.hookimpl(wrapper=True)
    def save_checkpoint(self, trainer, path):
        if Path(path).name == "last.ckpt" and trainer.is_global_zero:
            self.kill_if_due(trainer)
        return (yield)


class AsyncKiller(Killer):
    @ptrain.hookimpl(tryfirst=True)  # before the checkpoint callback settles the write
    def on_train_batch_end(self, trainer) -> None:
        if not trainer.is_global_zero:
            return
        while not trainer.checkpoint_write_done():  # its files complete, or refused
            time.sleep(0.01)
        self.kill_if_due(trainer)


def main(root: Path, asynchronous: bool, resume: bool, strategy: str | None,
         before_last: bool = False) -> int:
    callbacks = ["no:progress-bar", "no:tensorboard", "no:model-summary"]
    if not resume:
        callbacks.append((BeforeLastKiller if before_last else AsyncKiller if asynchronous
                          else SyncKiller)(root))
    values = RESUMED_VALUES if resume and before_last else VALUES
    processes = 1 if strategy is None else 2
    trainer = ptrain.Trainer(
        accelerator="cpu", max_epochs=len(VALUES), seed=0, default_root_dir=str(root),
        devices=processes, **({} if strategy is None else {"strategy": strategy}),
        callbacks=callbacks,
        plugin_options={"checkpoint": {"monitor": "val_metric", "save_top_k": TOP_K,
                                       "filename": "{epoch}-{val_metric:.1f}",
                                       "async_save": asynchronous}})
    trainer.fit(SequenceModule(values, n=16 * processes), ckpt_path="last" if resume else None)
    return 0


if __name__ == "__main__":
    rest = sys.argv[2:]
    sys.exit(main(Path(sys.argv[1]), "--async" in rest, "--resume" in rest,
                  rest[rest.index("--strategy") + 1] if "--strategy" in rest else None,
                  "--kill-before-last" in rest))
