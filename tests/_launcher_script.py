"""A 2-rank ``ddp`` script for ``tests/plugins/strategies/test_launchers.py``.

    python tests/_launcher_script.py OUT_DIR [--launcher auto|script|spawn] [--kill-rank-zero]
        [--fail-every-rank] [--rank-one-fails-outside-a-stage between|after]
        [--rank-zero-fails-alone]

It calls ``fit``, then ``validate`` twice, on one trainer, and every process that ran a stage
writes ``OUT_DIR/<pid>.json``: its pid, its parent's, its rank, and, for each stage it ran, the
stage's name and its result. Rank 0 also writes ``OUT_DIR/result.json``: the script's pid, the
results of the three calls and the trained weights. ``--kill-rank-zero``: rank 0 SIGKILLs
itself at the second training step (rank 1 writes ``OUT_DIR/rank1.pid`` first).
``--fail-every-rank``: at the second training step every rank raises ``RuntimeError("every rank
broke: rank R")``, together (after a collective). ``--rank-one-fails-outside-a-stage``: rank 1
raises ``RuntimeError("rank 1 broke outside a stage")`` in the script itself, ``between`` fit
and the first validate, or ``after`` the last validate. ``--rank-zero-fails-alone``: at the
second training step rank 0 raises ``RuntimeError("rank 0 broke alone")`` while rank 1 goes on
into the next step's collectives, where it waits for rank 0 until it is stopped.

``main`` is importable, so that ``python -c`` can run the same job without a script file.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ptrain  # noqa: E402


class StageRecorder:
    """Writes, in every process, which stages it ran and what they gave."""

    name = "stage-recorder"

    def __init__(self, out: str, kill_rank_zero: bool = False, fail_every_rank: bool = False,
                 rank_zero_fails_alone: bool = False):
        self.out, self.kill_rank_zero = out, kill_rank_zero
        self.fail_every_rank, self.rank_zero_fails_alone = fail_every_rank, rank_zero_fails_alone

    def _write(self, trainer, entry):
        path = Path(self.out) / f"{os.getpid()}.json"
        record = json.loads(path.read_text()) if path.exists() else {
            "pid": os.getpid(), "ppid": os.getppid(), "rank": trainer.global_rank,
            "stages": []}
        record["stages"].append(entry)
        path.write_text(json.dumps(record))

    @ptrain.hookimpl
    def teardown(self, trainer, stage):
        self._write(trainer, {"stage": stage, "global_step": trainer.global_step,
                              "metrics": {k: float(v) for k, v in
                                          trainer.callback_metrics.items()}})

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer, batch_idx):
        if self.fail_every_rank and trainer.global_step == 2:
            trainer.hook.all_gather_object(trainer=trainer, obj=None)
            raise RuntimeError(f"every rank broke: rank {trainer.global_rank}")
        if self.rank_zero_fails_alone and trainer.global_step == 2 and trainer.global_rank == 0:
            raise RuntimeError("rank 0 broke alone")
        if not self.kill_rank_zero or trainer.global_step != 2:
            return
        if trainer.global_rank == 1:
            (Path(self.out) / "rank1.pid").write_text(str(os.getpid()))
        trainer.hook.all_gather_object(trainer=trainer, obj=None)  # rank 1's file is there
        if trainer.global_rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)


class Regressor(ptrain.TrainModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 8, generator=g)
        self.data = TensorDataset(x, torch.sin(x.sum(1, keepdim=True)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=8, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.data, batch_size=16)


def main(out: str, launcher: str = "auto", kill_rank_zero: bool = False,
         fail_every_rank: bool = False, rank_one_fails: str | None = None,
         rank_zero_fails_alone: bool = False) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    ptrain.seed_everything(3)
    module = Regressor()
    trainer = ptrain.Trainer(
        strategy="ddp", devices=2, accelerator="cpu", max_epochs=2,
        default_root_dir=str(Path(out) / "runs"),
        callbacks=["no:progress-bar", "no:tensorboard", "no:model-summary",
                   StageRecorder(out, kill_rank_zero, fail_every_rank,
                                 rank_zero_fails_alone)],
        plugin_options={"ddp": {"launcher": launcher, "timeout": 60}})
    trainer.fit(module)
    if rank_one_fails == "between" and trainer.global_rank == 1:
        raise RuntimeError("rank 1 broke outside a stage")
    results = [trainer.validate(module), trainer.validate(module)]
    if rank_one_fails == "after" and trainer.global_rank == 1:
        raise RuntimeError("rank 1 broke outside a stage")
    if trainer.is_global_zero:
        (Path(out) / "result.json").write_text(json.dumps({
            "pid": os.getpid(), "validate": results,
            "weights": {k: v.tolist() for k, v in module.state_dict().items()}}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--launcher", default="auto")
    parser.add_argument("--kill-rank-zero", action="store_true")
    parser.add_argument("--fail-every-rank", action="store_true")
    parser.add_argument("--rank-one-fails-outside-a-stage", choices=["between", "after"])
    parser.add_argument("--rank-zero-fails-alone", action="store_true")
    args = parser.parse_args()
    main(args.out, args.launcher, args.kill_rank_zero, args.fail_every_rank,
         args.rank_one_fails_outside_a_stage, args.rank_zero_fails_alone)
