"""A 2-rank ``ddp`` training run for the resume test, meant to be run in its own process group.

    python tests/_ddp_resume_script.py --root DIR --out RESULT.pt [--resume] [--kill-step K]

It trains ``WideRegressor`` (two hidden layers) with shuffled data, dropout, Adam and a per-step
LR scheduler on two CPU processes (gloo), writes ``last.ckpt`` every ``--every-n-train-steps``
optimizer steps, and saves rank 0's final parameters and loop counters to ``--out`` (every rank runs
this script: the script launcher starts it again as rank 1).
``--kill-step K`` makes rank 0 SIGKILL the whole process group when ``global_step`` first
reaches ``K`` (start it with ``start_new_session=True``); ``--resume`` continues from
``ckpt_path="last"``. ``--signal-step K``: rank 0 alone gets SIGTERM at step ``K``; the job
stops with a resumable checkpoint and exits with ``ptrain.Interrupted``'s code.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import ptrain  # noqa: E402
from tests._dist_models import GroupKiller, WideRegressor  # noqa: E402


class RankZeroSignaller:
    """Sends SIGTERM to rank 0's own process, and to no other rank, at the end of the batch
    where ``global_step`` first reaches ``step`` (as ``kill -TERM`` of one process would)."""

    name = "rank-zero-signaller"

    def __init__(self, step: int):
        self.step, self.sent = step, False

    @ptrain.hookimpl(trylast=True)
    def on_train_batch_end(self, trainer):
        if trainer.global_rank == 0 and not self.sent and trainer.global_step == self.step:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)


def build_model(seed: int) -> WideRegressor:
    ptrain.seed_everything(seed)  # the initial weights are part of the run
    return WideRegressor(width=512, n=64, batch_size=8, lr=1e-3, shuffle=True, dropout=0.25,
                         optimizer="adam", scheduler={"gamma": 0.97, "interval": "step"})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--kill-step", type=int)
    p.add_argument("--max-epochs", type=int, default=2)
    p.add_argument("--every-n-train-steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--signal-step", type=int, help="rank 0 alone gets SIGTERM at this step")
    p.add_argument("--stall-timeout", type=float, default=300.0)
    args = p.parse_args(argv)

    model = build_model(args.seed)
    trainer = ptrain.Trainer(
        strategy="ddp", devices=2, accelerator="cpu", max_epochs=args.max_epochs,
        seed=args.seed, default_root_dir=args.root,
        callbacks=["no:progress-bar", GroupKiller(args.kill_step),
                   *([RankZeroSignaller(args.signal_step)] if args.signal_step else [])],
        plugin_options={"checkpoint": {"every_n_train_steps": args.every_n_train_steps},
                        "ddp": {"timeout": 120.0, "stall_timeout": args.stall_timeout}},
    )
    # stopped by a signal, fit raises ptrain.Interrupted on every rank: uncaught, each process
    # ends with its code, after rank 0 said where the checkpoint is
    trainer.fit(model, ckpt_path="last" if args.resume else None)
    if trainer.is_global_zero:  # every rank runs this script (the script launcher)
        torch.save({"params": {k: v.clone() for k, v in model.state_dict().items()},
                    "global_step": trainer.global_step,
                    "current_epoch": trainer.current_epoch,
                    "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()}},
                   args.out)


if __name__ == "__main__":
    main()
