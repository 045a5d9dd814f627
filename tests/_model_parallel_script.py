"""A training run of examples/decoder.py's small Llama-style decoder under ``model-parallel``
(4 ranks through the script launcher) or on one process, for
``tests/plugins/strategies/test_model_parallel.py``.

    python tests/_model_parallel_script.py --root DIR --out DIR [--devices 4]
        [--strategy model-parallel|fsdp] [--replicate R] [--shard S] [--tensor T] [--loss-parallel] [--steps N]
        [--clip VALUE] [--build configure|init] [--hidden H] [--plan-typo] [--self-shard]
        [--epochs E] [--save] [--async-save] [--resume] [--batch B] [--kill-step K]
        [--nan-step N]

``--devices 1`` runs the same model on one process (``single-device``) with the global batch of
the 4-rank run: the batch size times ``--dp``, the data-parallel size (``replicate x shard``)
of the run it stands for; both read ``--steps`` global batches. ``--batch`` sets the batch of
each data-parallel replica, for a run whose data-parallel size is not ``--dp`` but which reads
the same global batches (a resumed run on another mesh). ``--kill-step K``: rank 0 SIGKILLs the
whole process group (run the script in a session of its own) once ``global_step`` reaches K.
``--nan-step N``: the loss of the batch at global step N is NaN.
Every rank writes ``<out>/rank<R>.json``: its loss at every step, its mesh coordinate and
data-parallel rank, the bytes of parameters and optimizer state it holds (local shards), and
the model's whole parameter bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # the tests' helpers, and examples/

import torch  # noqa: E402

import ptrain  # noqa: E402
from ptrain.distributed import held_bytes  # noqa: E402

from _shard_models import KillJob  # noqa: E402
from examples import decoder  # noqa: E402

DIM = 32  # the decoder's width (examples/decoder.py's default)
BATCH = 4  # per data-parallel replica


class Decoder(decoder.Decoder):
    """examples/decoder.py's decoder (its default sizes), with what the tests need: its losses
    kept, a plan key naming no submodule (``plan_typo``), and ``configure_model`` that calls
    ``fully_shard`` itself over ``dp_shard`` (``self_shard``), as a Lightning program does."""

    def __init__(self, build: str = "configure", loss_parallel: bool = False,
                 hidden: int = 2 * DIM, plan_typo: bool = False, batch_size: int = BATCH,
                 samples: int = BATCH * 8, self_shard: bool = False, nan_step: int = -1):
        super().__init__(hidden=hidden, samples=samples, batch_size=batch_size, build=build,
                         loss_parallel=loss_parallel)
        self.plan_typo, self.self_shard, self.nan_step = plan_typo, self_shard, nan_step
        self.losses: list[torch.Tensor] = []

    def block_plan(self) -> dict:
        plan = super().block_plan()
        if self.plan_typo:
            plan["feed_forwrd.w2"] = plan["feed_forward.w2"]
        return plan

    def configure_model(self):
        super().configure_model()
        if self.self_shard:  # the strategy then leaves the model as it is
            from torch.distributed.fsdp import fully_shard

            data = self.device_mesh["dp_shard"]
            for block in self.layers:
                fully_shard(block, mesh=data)
            fully_shard(self, mesh=data)

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.trainer.global_step == self.nan_step:
            loss = loss * float("nan")
        self.losses.append(loss.detach())
        return loss


class Probe:
    name = "model-parallel-probe"

    def __init__(self, out: Path):
        self.out = out
        self.record: dict = {}

    @ptrain.hookimpl
    def on_before_optimizer_step(self, trainer, optimizer):
        if "held" not in self.record:  # gradients exist here
            self.record["held"] = held_bytes(trainer.module, trainer.optimizers)
            mesh = trainer.device_mesh
            self.record["data_parallel"] = [0, 1] if mesh is None else list(
                trainer.plugins.get(trainer.options["strategy"]).data_parallel(trainer)[:2])

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer, batch, batch_idx, loss):
        if "held" in self.record and "held_after_step" not in self.record:
            self.record["held_after_step"] = held_bytes(trainer.module, trainer.optimizers)

    @ptrain.hookimpl
    def teardown(self, trainer):
        module = trainer.module
        mesh = trainer.device_mesh
        self.record.update(
            losses=[float(x) for x in module.losses], global_step=trainer.global_step,
            whole_param_bytes=sum(p.numel() * p.element_size() for p in module.parameters()),
            coordinate=list(mesh.get_coordinate()) if mesh is not None else None,
            mesh=dict(zip(mesh.mesh_dim_names, mesh.shape)) if mesh is not None else None,
        )
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.record))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--dp", type=int, default=2, help="the data-parallel size of the 4-rank "
                   "run (replicate x shard): the global batch is BATCH times it")
    p.add_argument("--strategy", default="model-parallel", choices=["model-parallel", "fsdp"])
    p.add_argument("--replicate", default="1")
    p.add_argument("--shard", default="auto")
    p.add_argument("--tensor", default="auto")
    p.add_argument("--loss-parallel", action="store_true")
    p.add_argument("--steps", type=int, default=4, help="steps per epoch")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--save", action="store_true", help="write checkpoints (last.ckpt)")
    p.add_argument("--async-save", action="store_true", help="write them in the background")
    p.add_argument("--resume", action="store_true", help="from the root's last.ckpt")
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--build", default="configure", choices=["configure", "init"])
    p.add_argument("--hidden", type=int, default=2 * DIM, help="the feed-forward width")
    p.add_argument("--plan-typo", action="store_true", help="a plan key naming no submodule")
    p.add_argument("--self-shard", action="store_true",
                   help="configure_model calls fully_shard itself (over dp_shard)")
    p.add_argument("--batch", type=int, default=BATCH, help="per data-parallel replica")
    p.add_argument("--kill-step", type=int)
    p.add_argument("--nan-step", type=int, default=-1)
    args = p.parse_args()

    ptrain.seed_everything(7)
    module = Decoder(args.build, loss_parallel=args.loss_parallel, hidden=args.hidden,
                     plan_typo=args.plan_typo,
                     batch_size=args.batch if args.devices > 1 else BATCH * args.dp,
                     samples=BATCH * args.dp * args.steps, self_shard=args.self_shard,
                     nan_step=args.nan_step)
    strategy = args.strategy if args.devices > 1 else "single-device"
    options = {}
    if strategy == "model-parallel":
        options = {strategy: {"replicate": args.replicate, "shard": args.shard,
                              "tensor": args.tensor, "timeout": 120,
                              "loss_parallel": args.loss_parallel}}
    elif strategy == "fsdp":
        options = {strategy: {"replicate": args.replicate, "timeout": 120}}
    if args.async_save:
        options["checkpoint"] = {"async_save": True}
    trainer = ptrain.Trainer(
        strategy=strategy, devices=args.devices,
        accelerator="cpu", max_epochs=args.epochs, gradient_clip_val=args.clip,
        default_root_dir=args.root,
        callbacks=["no:progress-bar", "no:tensorboard", "no:model-summary",
                   *([] if args.save else ["no:checkpoint"]),
                   Probe(Path(args.out)),
                   *([] if args.kill_step is None else [KillJob(args.kill_step)])],
        plugin_options=options)
    trainer.fit(module, ckpt_path="last" if args.resume else None)


if __name__ == "__main__":
    main()
