"""What a trainer of 2 processes answers once made, before ``fit``, in each process the script
launcher runs: Lightning's tensor-parallel example prints with ``trainer.print`` there (once,
on rank 0), and programs guard work with ``trainer.is_global_zero``.

Run as ``python ranks_before_fit.py OUT_DIR``; rank 0 writes ``OUT_DIR/result.json``: every
process's ranks, world size and what ``trainer.print`` printed, as seen before ``fit``.
"""

import contextlib
import io
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import lightning.pytorch as pl
from lightning.pytorch.strategies import ModelParallelStrategy


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def configure_model(self):
        fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])

    def training_step(self, batch):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.ones(8, 4))
        return torch.utils.data.DataLoader(data, batch_size=2)


def main(out: str) -> None:
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        trainer.print("made")
    before = {"global_rank": trainer.global_rank, "local_rank": trainer.local_rank,
              "node_rank": trainer.node_rank, "world_size": trainer.world_size,
              "is_global_zero": trainer.is_global_zero, "printed": printed.getvalue()}
    trainer.fit(Model())
    every = [None] * trainer.world_size
    dist.all_gather_object(every, {"pid": os.getpid(), "before": before})
    if trainer.global_rank == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"processes": len({p["pid"] for p in every}),
                       "before": [p["before"] for p in every]}, f)


if __name__ == "__main__":
    main(sys.argv[1])
