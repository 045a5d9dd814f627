"""The paths a Trainer given no ``default_root_dir`` reports, in the working directory: the
logger's and the trainer's folders and the checkpoint callback's files, with the default logger
and with ``logger=False``. A program that prints them, or that changes directory and then loads
``best_model_path``, needs them as Lightning gives them (absolute: its root is the working
directory).

Run as ``python default_paths.py OUT_DIR``; writes ``OUT_DIR/result.json``.
"""

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def paths(trainer):
    found = {"default_root_dir": trainer.default_root_dir, "log_dir": trainer.log_dir,
             "dirpath": trainer.checkpoint_callback.dirpath,
             "best_model_path": trainer.checkpoint_callback.best_model_path}
    if trainer.logger is not None:
        found.update(save_dir=trainer.logger.save_dir, logger_log_dir=trainer.logger.log_dir,
                     root_dir=trainer.logger.root_dir)
    return found


def main(out: str) -> None:
    os.chdir(out)
    pl.seed_everything(0)
    loader = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=8)
    result = {}
    for name, logger in (("default", None), ("no_logger", False)):
        trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=logger,
                             enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Model(), loader)
        result[name] = {key: [os.path.isabs(value), os.path.relpath(value, out)]
                        for key, value in paths(trainer).items()}
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(os.path.abspath(sys.argv[1]))
