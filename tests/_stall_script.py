"""A long 2-rank job for the hung- and dead-rank tests (``tests/test_rank_watch.py``) and the
fault benchmark (``benchmarks/faults.py``).

    python tests/_stall_script.py OUT_DIR [--strategy ddp|fsdp] [--stall-timeout S]
                                  [--launcher script|spawn] [--timeout S] [--block-at STEP]

Trains for many slow steps (a 20 ms sleep in each). Every rank writes ``OUT_DIR/rank<r>.pid``
at its first step, then ``OUT_DIR/rank<r>.step`` (its global step) at each; the test stops or
kills a rank from outside once both have started. ``--block-at STEP``: at that step rank 0
enters a barrier that rank 1 never joins (rank 1 sleeps, alive, its heartbeat going); each
writes ``OUT_DIR/rank<r>.blocked`` first.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ptrain  # noqa: E402


class Progress:
    """Writes each rank's pid at its first step and its global step at every step."""

    name = "progress-files"

    def __init__(self, out: str, block_at: int | None = None):
        self.out, self.block_at = Path(out), block_at

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer):
        rank = trainer.global_rank
        if not (self.out / f"rank{rank}.pid").exists():
            (self.out / f"rank{rank}.pid").write_text(str(os.getpid()))
        (self.out / f"rank{rank}.step").write_text(str(trainer.global_step))
        if trainer.global_step == self.block_at:
            (self.out / f"rank{rank}.blocked").write_text("")
            if rank == 0:
                import torch.distributed as dist

                dist.barrier()
            while True:
                time.sleep(1)


class Slow(ptrain.TrainModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 1)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(4096, 8, generator=g)
        self.data = TensorDataset(x, x.sum(1, keepdim=True))

    def training_step(self, batch, batch_idx):
        time.sleep(0.02)
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--stall-timeout", type=float, default=2.0)
    parser.add_argument("--launcher", default="auto")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--block-at", type=int)
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    trainer = ptrain.Trainer(
        strategy=args.strategy, devices=2, accelerator="cpu", max_epochs=5,
        default_root_dir=str(Path(args.out) / "runs"),
        callbacks=["no:progress-bar", "no:tensorboard", "no:model-summary", "no:checkpoint",
                   Progress(args.out, args.block_at)],
        plugin_options={args.strategy: {"stall_timeout": args.stall_timeout,
                                         "launcher": args.launcher, "timeout": args.timeout}})
    trainer.fit(Slow())


if __name__ == "__main__":
    main()
