"""A 2-rank ``fsdp`` training run for the sharded resume tests, run in its own process (and its
own session, so that the whole job can be killed as a process group).

    python tests/_shard_resume_script.py --root DIR --out RESULT.pt [--kill-step K] [--resume]
        [--full-state-out STATE.pt] [--strategy fsdp]

It trains :class:`ShardNet` (shuffled data, dropout, Adam, a per-step LR scheduler) with a
sharded checkpoint every 3 optimizer steps and at each epoch's end, and writes the final full
parameters and loop counters to ``--out``. ``--kill-step K``: rank 0 SIGKILLs the whole process
group (this process and every worker) at the end of the batch where ``global_step`` reaches K,
after the checkpoint callback had its turn. ``--resume`` continues from ``ckpt_path="last"``.
``--full-state-out``: the whole optimizer state, gathered at the end of the run (keyed by
parameter name), is written there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import ptrain  # noqa: E402
from _shard_models import FullOptimizerStateProbe, KillJob, ShardNet  # noqa: E402

#: The model of these runs: small (the resume path, not memory, is under test), with every
#: source of state a resume has to restore.
MODEL_ARGS = dict(width=64, depth=2, features=16, n=64, batch_size=8, lr=0.01, optimizer="adam",
                  shuffle=True, dropout=0.1, scheduler_gamma=0.95, init_seed=3)
MAX_EPOCHS = 3
EVERY_N_TRAIN_STEPS = 3


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--kill-step", type=int)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--full-state-out")
    p.add_argument("--strategy", default="fsdp")
    p.add_argument("--stall-timeout", type=float, default=300.0)
    p.add_argument("--max-epochs", type=int, default=MAX_EPOCHS)
    args = p.parse_args(argv)

    callbacks: list = ["no:progress-bar", "no:tensorboard"]
    if args.kill_step is not None:
        callbacks.append(KillJob(args.kill_step))
    if args.full_state_out:
        callbacks.append(FullOptimizerStateProbe(args.full_state_out))
    model = ShardNet(**MODEL_ARGS)
    trainer = ptrain.Trainer(
        strategy=args.strategy, devices=2, accelerator="cpu", max_epochs=args.max_epochs, seed=0,
        default_root_dir=args.root, callbacks=callbacks,
        plugin_options={"checkpoint": {"every_n_train_steps": EVERY_N_TRAIN_STEPS},
                        args.strategy: {"stall_timeout": args.stall_timeout}})
    trainer.fit(model, ckpt_path="last" if args.resume else None)
    params = trainer.full_state_dict()  # each rank holds its shards: gathered, on rank 0
    if trainer.is_global_zero:  # every rank runs this script (the script launcher)
        torch.save({"params": params, "global_step": trainer.global_step,
                    "current_epoch": trainer.current_epoch,
                    "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()}},
                   args.out)


if __name__ == "__main__":
    main()
