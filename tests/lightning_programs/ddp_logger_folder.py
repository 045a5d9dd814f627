"""A ddp program that reads its logger's folder after fit on every rank, as notebooks do
(``pd.read_csv(f"{trainer.logger.log_dir}/metrics.csv")``): 2 processes, a CSVLogger.

Run as ``python ddp_logger_folder.py OUT_DIR``; each rank writes ``OUT_DIR/rank<R>.json``: its
logger's folder and version, ``trainer.log_dir``, whether ``metrics.csv`` is there, and the
folder and version the module's ``self.logger`` named during fit (output paths are made so).
"""

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_end(self):
        self.logger_seen = [self.logger.log_dir, self.logger.version]


def main(out: str) -> None:
    pl.seed_everything(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=2, strategy="ddp",
                         logger=CSVLogger(save_dir=os.path.join(out, "logs"), name="m"),
                         log_every_n_steps=1, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    model = Model()
    trainer.fit(model, DataLoader(data, batch_size=16))
    folder = trainer.logger.log_dir
    seen = {"log_dir": os.path.relpath(folder, out), "version": trainer.logger.version,
            "module_logger": [os.path.relpath(model.logger_seen[0], out), model.logger_seen[1]],
            "trainer_log_dir": os.path.relpath(trainer.log_dir, out),
            "metrics_csv": os.path.exists(os.path.join(folder, "metrics.csv"))}
    with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(seen, f)
    if trainer.global_rank == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"ranks": 2}, f)


if __name__ == "__main__":
    main(sys.argv[1])
