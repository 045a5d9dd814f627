"""tests/_checkpoint_kill_script.py's kill, in a ``ptrain.lightning`` program, for
tests/test_checkpoint_kill.py:

    python -m tests._lightning_checkpoint_kill_script ROOT [--resume]

Lightning's ``ModelCheckpoint(monitor="val_metric", save_top_k=2, save_last=True)`` keeps the
top 2 of ``VALUES`` (one per epoch); epoch 2's file pushes epoch 0's out, and the run is killed
(SIGKILL, of its process group) as soon as that point's ``last.ckpt`` is written, the dropped
file still there. ``--resume``: the same program without the killer, resumed from ``last``.
``ROOT/killed.json`` says at which step and what the folder held then."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from ptrain import lightning as L
from ptrain.lightning.callbacks import ModelCheckpoint
from tests._checkpoint_kill_script import TOP_K, VALUES, SyncKiller


class Scripted(L.LightningModule):
    """Logs ``val_metric`` = ``VALUES[epoch]`` after each epoch's validation."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_metric", float(VALUES[self.current_epoch]))

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(16, 4, generator=torch.Generator()
                                                    .manual_seed(0))), batch_size=8)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.zeros(8, 4)), batch_size=8)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(root: Path, resume: bool) -> int:
    callbacks = [ModelCheckpoint(monitor="val_metric", save_top_k=TOP_K, save_last=True,
                                 filename="{epoch}-{val_metric:.1f}")]
    if not resume:
        callbacks.append(SyncKiller(root))
    trainer = L.Trainer(accelerator="cpu", max_epochs=len(VALUES), default_root_dir=str(root),
                        callbacks=callbacks, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Scripted(), ckpt_path="last" if resume else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), "--resume" in sys.argv[2:]))
