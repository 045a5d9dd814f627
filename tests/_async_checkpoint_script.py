"""A run with asynchronous checkpoints that something happens to while a write is in flight,
for tests/test_async_checkpoints.py:

    python -m tests._async_checkpoint_script ACTION ROOT [--resume] [--strategy S]

ACTION is what happens at the first epoch end after the first (so a complete checkpoint exists)
where the checkpoint write just started is still in flight: ``kill`` (SIGKILL), ``sigterm``; or
as the second epoch's checkpoint point begins (after its validation, before the checkpoint
callback's saves), so that its background write is refused with EFBIG wherever it has got to:
``fill`` (a file-size limit of 1 MiB for this process), ``fill-warn`` (the same under
``on_write_error="warn"``, with the top 2 by validation loss kept); ``change`` (one epoch,
a checkpoint every 2 steps, each kept as ``step=N``: after the callback's save at step 2, the
last rank changes its first parameter in place, before its deferred copy is made); or
``none``. ``ROOT/saboteur.json`` says at which step it acted and what the run ended with; ``ROOT/final.pt`` holds the final weights of a run that completed. ``--resume`` resumes
from ``last``. ``--strategy S`` (``ddp``, ``fsdp``): a job of 2 processes, every one running this
script (the script launcher), with twice the data, so that an epoch has as many steps; global
rank 0 acts, a kill being of the whole job (this script's process group: start it in a session
of its own)."""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from pathlib import Path

import torch
from torch import nn

import ptrain
from ptrain import CheckpointWriteError, Interrupted
from tests.conftest import TinyRegressor

EPOCHS = 4


class WideRegressor(TinyRegressor):
    """A regressor with a wide hidden layer and SGD with momentum: a checkpoint of about 100 MB,
    whose write takes long enough to be seen in flight. (Adam is left out on purpose: on this
    model its update divides gradients near zero by their own size, and the last bits of a
    multithreaded matmul, which differ from run to run, then change the weights visibly.)"""

    def __init__(self, width: int = 3_000_000, n: int = 64):
        super().__init__(n=n, batch_size=16, lr=1e-7)  # width makes a step large
        self.net = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class Saboteur:
    name = "saboteur"

    def __init__(self, action: str, record: Path):
        self.action, self.record, self.acted_at = action, record, None

    @ptrain.hookimpl(tryfirst=True)  # before the checkpoint callback's saves
    def on_validation_end(self, trainer) -> None:
        if self.action in ("fill", "fill-warn") and self.acted_at is None \
                and trainer.current_epoch == 1 and trainer.is_global_zero:
            self.acted_at = trainer.global_step
            self.write(acted_at=self.acted_at)
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))

    @ptrain.hookimpl(trylast=True)  # after the checkpoint callback's save at this epoch end
    def on_epoch_end(self, trainer) -> None:
        if self.action not in ("kill", "sigterm") or self.acted_at is not None \
                or trainer.current_epoch < 1 or not trainer.is_global_zero:
            return
        if trainer.checkpoint_write_done():
            return  # the write ended already: act at a later epoch end
        self.acted_at = trainer.global_step
        self.write(acted_at=self.acted_at)
        if self.action == "kill":
            sys.stdout.flush()
            os.killpg(os.getpgrp(), signal.SIGKILL)
        elif self.action == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)

    @ptrain.hookimpl(trylast=True)  # after the checkpoint callback's save at this step
    def on_train_batch_end(self, trainer) -> None:
        if self.action == "change" and trainer.global_step == 2 \
                and trainer.global_rank == trainer.world_size - 1:
            with torch.no_grad():
                next(trainer.module.parameters()).mul_(1.0)  # the values stay

    def write(self, **entries) -> None:
        old = json.loads(self.record.read_text()) if self.record.exists() else {}
        self.record.write_text(json.dumps({**old, **entries}))


def main(action: str, root: Path, resume: bool, strategy: str | None) -> int:
    torch.manual_seed(0)
    processes = 1 if strategy is None else 2
    module = WideRegressor(n=64 * processes)
    saboteur = Saboteur(action, root / "saboteur.json")
    checkpoint = {"async_save": True}
    if action == "fill-warn":
        checkpoint.update(on_write_error="warn", monitor="val_loss", save_top_k=2)
    if action == "change":
        checkpoint.update(every_n_train_steps=2, save_top_k=-1, filename="{step}")
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1 if action == "change" else EPOCHS,
                             seed=0,
                             default_root_dir=str(root), devices=processes,
                             **({} if strategy is None else {"strategy": strategy}),
                             callbacks=["no:progress-bar", "no:tensorboard", "no:model-summary",
                                        saboteur],
                             plugin_options={"checkpoint": checkpoint})
    try:
        trainer.fit(module, ckpt_path="last" if resume else None)
    except (CheckpointWriteError, Interrupted) as exc:
        if trainer.is_global_zero:
            saboteur.write(ended=type(exc).__name__, message=str(exc), step=trainer.global_step)
        return 3
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # a fill's limit is lifted
    weights = trainer.full_state_dict()  # each rank holds its shards: gathered, on rank 0
    if trainer.is_global_zero:
        torch.save(weights, root / "final.pt")
        callback = trainer.plugins["checkpoint"]
        saboteur.write(ended="complete", step=trainer.global_step,
                       best_k_models=sorted(Path(p).name for p in callback.best_k_models))
    return 0


if __name__ == "__main__":
    rest = sys.argv[3:]
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), "--resume" in rest,
                  rest[rest.index("--strategy") + 1] if "--strategy" in rest else None))
