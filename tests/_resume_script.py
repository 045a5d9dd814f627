"""A training run for the resume tests, meant to be run in its own process.

    python tests/_resume_script.py --root DIR --out PARAMS.pt [--resume] [--kill-step K]
        [--kill-at EPOCH:BATCH] [--max-epochs N] [--every-n-train-steps N] [--every-n-epochs N]
        [--val-check-interval X] [--accumulate N] [--seed S] [--precision NAME]

It trains ``TinyRegressor`` (shuffled data, dropout, Adam, a per-step LR scheduler: every source
of randomness and state a resume has to restore) and writes the final parameters plus a few
loop numbers to ``--out``. ``--kill-step K`` makes a real plugin SIGKILL this very process in
``on_train_batch_end`` the first time ``global_step`` reaches ``K`` (after the checkpoint callback
had its turn at that batch); ``--kill-at E:B`` does the same at batch ``B`` of epoch ``E``.
``--resume`` continues from ``ckpt_path="last"``. ``--signal-step K [--signal NAME]
[--signal-twice] [--requeue-command CMD]`` sends this process the signal (default SIGTERM) at the end of the batch where
``global_step`` reaches ``K``; a run stopped by it exits with the code of ``ptrain.Interrupted``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import ptrain  # noqa: E402
from conftest import TinyRegressor  # noqa: E402


class Killer:
    """SIGKILLs its own process at a chosen point; ``trylast`` so that the checkpoint callback
    has already written what it writes at that batch."""

    name = "killer"

    def __init__(self, step: int | None, at: tuple[int, int] | None):
        self.step, self.at = step, at

    @ptrain.hookimpl(trylast=True)
    def on_train_batch_end(self, trainer, batch_idx):
        hit_step = self.step is not None and trainer.global_step == self.step
        hit_at = self.at is not None and (trainer.current_epoch, batch_idx) == self.at
        if hit_step or hit_at:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


class Signaller:
    """Sends ``signal`` to its own process (``twice``: two in a row) the first time
    ``global_step`` reaches ``step``, at the end of that batch."""

    name = "signaller"

    def __init__(self, step: int, signum: signal.Signals, twice: bool = False):
        self.step, self.signum, self.twice = step, signum, twice
        self.sent = False

    @ptrain.hookimpl(trylast=True)
    def on_train_batch_end(self, trainer):
        if self.sent or trainer.global_step != self.step:
            return
        self.sent = True
        for _ in range(2 if self.twice else 1):
            os.kill(os.getpid(), self.signum)


class ResumeModel(TinyRegressor):
    """TinyRegressor that also logs an epoch-level mean, whose running sum a checkpoint keeps."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("epoch_loss", loss, on_step=False, on_epoch=True)
        return loss


def build_model(seed: int) -> TinyRegressor:
    ptrain.seed_everything(seed)  # the initial weights are part of the run
    return ResumeModel(n=64, batch_size=8, lr=0.05, shuffle=True, dropout=0.25,
                         optimizer="adam", scheduler={"gamma": 0.97, "interval": "step"})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--kill-step", type=int)
    p.add_argument("--kill-at")
    p.add_argument("--max-epochs", type=int, default=3)
    p.add_argument("--every-n-train-steps", type=int, default=3)
    p.add_argument("--every-n-epochs", type=int, default=1)
    p.add_argument("--val-check-interval", type=float, default=1.0)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", default="32-true")
    p.add_argument("--signal-step", type=int)
    p.add_argument("--signal", default="SIGTERM")
    p.add_argument("--signal-twice", action="store_true")
    p.add_argument("--requeue-command", help="requeue (under SLURM) with this command")
    args = p.parse_args(argv)

    at = tuple(int(v) for v in args.kill_at.split(":")) if args.kill_at else None
    model = build_model(args.seed)
    trainer = ptrain.Trainer(
        default_root_dir=args.root, accelerator="cpu", max_epochs=args.max_epochs, seed=args.seed,
        precision=args.precision,
        val_check_interval=args.val_check_interval, accumulate_grad_batches=args.accumulate,
        callbacks=["no:progress-bar", "no:tensorboard", Killer(args.kill_step, at),
                   *([Signaller(args.signal_step, signal.Signals[args.signal],
                                args.signal_twice)] if args.signal_step else [])],
        plugin_options={"checkpoint": {"every_n_train_steps": args.every_n_train_steps,
                                       "every_n_epochs": args.every_n_epochs},
                        **({"stop-signals": {"requeue": True,
                                             "requeue_command": args.requeue_command}}
                           if args.requeue_command else {})},
    )
    # stopped by a signal, fit raises ptrain.Interrupted: uncaught, the program ends with its
    # code, after ptrain said where the checkpoint is
    trainer.fit(model, ckpt_path="last" if args.resume else None)
    torch.save({"params": {k: v.clone() for k, v in model.state_dict().items()},
                "global_step": trainer.global_step,
                "current_epoch": trainer.current_epoch,
                "lr": trainer.optimizers[0].param_groups[0]["lr"],
                "optimizer": trainer.optimizers[0].state_dict(),
                "scheduler": trainer.lr_schedulers[0]["scheduler"].state_dict(),
                "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
                "precision_state": getattr(trainer.plugins[args.precision], "state_dict",
                                           lambda: None)()}, args.out)


if __name__ == "__main__":
    main()
