"""A run with asynchronous checkpoints that something happens to while a write is in flight,
for tests/test_async_checkpoints.py:

    python -m tests._async_checkpoint_script ACTION ROOT [--resume]

ACTION is what happens at the first epoch end after the first (so a complete checkpoint exists)
where the checkpoint write just started is still in flight: ``kill`` (SIGKILL), ``sigterm``,
``fill`` (a file-size limit of 1 MiB for this process: the write in flight is refused with
EFBIG), ``fill-warn`` (the same under ``on_write_error="warn"``, with the top 2 by validation
loss kept), or ``none``. ``ROOT/saboteur.json`` says at which step it acted and what the run ended
with; ``ROOT/final.pt`` holds the final weights of a run that completed. ``--resume`` resumes
from ``last``."""

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

    def __init__(self, width: int = 3_000_000):
        super().__init__(n=64, batch_size=16, lr=1e-7)  # width makes a step large
        self.net = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class Saboteur:
    name = "saboteur"

    def __init__(self, action: str, record: Path):
        self.action, self.record, self.acted_at = action, record, None

    @ptrain.hookimpl(trylast=True)  # after the checkpoint callback's save at this epoch end
    def on_epoch_end(self, trainer) -> None:
        if self.action == "none" or self.acted_at is not None or trainer.current_epoch < 1:
            return
        if trainer.checkpoint_write_done():
            return  # the write ended already: act at a later epoch end
        self.acted_at = trainer.global_step
        self.write(acted_at=self.acted_at)
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.action == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        elif self.action in ("fill", "fill-warn"):
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))

    def write(self, **entries) -> None:
        old = json.loads(self.record.read_text()) if self.record.exists() else {}
        self.record.write_text(json.dumps({**old, **entries}))


def main(action: str, root: Path, resume: bool) -> int:
    torch.manual_seed(0)
    module = WideRegressor()
    saboteur = Saboteur(action, root / "saboteur.json")
    checkpoint = {"async_save": True}
    if action == "fill-warn":
        checkpoint.update(on_write_error="warn", monitor="val_loss", save_top_k=2)
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=EPOCHS, seed=0,
                             default_root_dir=str(root),
                             callbacks=["no:progress-bar", "no:tensorboard", "no:model-summary",
                                        saboteur],
                             plugin_options={"checkpoint": checkpoint})
    try:
        trainer.fit(module, ckpt_path="last" if resume else None)
    except (CheckpointWriteError, Interrupted) as exc:
        saboteur.write(ended=type(exc).__name__, message=str(exc), step=trainer.global_step)
        return 3
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # a fill's limit is lifted
    torch.save(module.state_dict(), root / "final.pt")
    callback = trainer.plugins["checkpoint"]
    saboteur.write(ended="complete", step=trainer.global_step,
                   best_k_models=sorted(Path(p).name for p in callback.best_k_models))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), "--resume" in sys.argv[3:]))
