"""A training run of a small Llama-style decoder under ``model-parallel`` (4 ranks through the
script launcher) or on one process, for ``tests/plugins/strategies/test_model_parallel.py``.

    python tests/_model_parallel_script.py --root DIR --out DIR [--devices 4]
        [--strategy model-parallel|fsdp] [--replicate R] [--shard S] [--tensor T] [--loss-parallel] [--steps N]
        [--clip VALUE] [--build configure|init] [--hidden H] [--plan-typo] [--self-shard]
        [--epochs E] [--save] [--resume]

``--devices 1`` runs the same model on one process (``single-device``) with the global batch of
the 4-rank run: the batch size times ``--dp``, the data-parallel size (``replicate x shard``)
of the run it stands for; both read ``--steps`` global batches. Every rank writes
``<out>/rank<R>.json``: its loss at every step, its mesh coordinate and data-parallel rank, the
bytes of parameters and optimizer state it holds (local shards), and the model's whole
parameter bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import ptrain  # noqa: E402
from ptrain.distributed import held_bytes  # noqa: E402

VOCAB, DIM, HEADS, DEPTH, SEQ = 64, 32, 4, 2, 8
BATCH = 4  # per data-parallel replica


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Linear(DIM, DIM, bias=False) for _ in range(3))
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        # -1 heads: under a tensor-parallel plan each rank holds HEADS / tp of them
        q, k, v = (w(x).view(b, s, -1, DIM // HEADS).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(DIM, hidden, bias=False)
        self.w3 = nn.Linear(DIM, hidden, bias=False)
        self.w2 = nn.Linear(hidden, DIM, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.attention_norm = nn.RMSNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(DIM)
        self.feed_forward = FeedForward(hidden)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Decoder(ptrain.TrainModule):
    """Token embedding, ``DEPTH`` blocks, a norm and the output layer, made in
    ``configure_model`` (``build="configure"``: on the meta device under ``model-parallel``)
    or in ``__init__``; with a mesh, ``configure_model`` applies the tensor-parallel plan."""

    def __init__(self, build: str = "configure", loss_parallel: bool = False,
                 hidden: int = 2 * DIM, plan_typo: bool = False, batch_size: int = BATCH,
                 samples: int = BATCH * 8, self_shard: bool = False):
        super().__init__()
        self.self_shard = self_shard
        self.build, self.loss_parallel = build, loss_parallel
        self.hidden, self.plan_typo = hidden, plan_typo
        self.batch_size, self.samples = batch_size, samples
        self.layers = None
        self.losses: list[torch.Tensor] = []
        if build == "init":
            self._make_layers()

    def _make_layers(self):
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block(self.hidden) for _ in range(DEPTH))
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def configure_model(self):
        if self.layers is None:
            self._make_layers()
        if self.device_mesh is None or "tp" not in self.device_mesh.mesh_dim_names:
            return  # one process, or fsdp's mesh
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)

        tp = self.device_mesh["tp"]
        parallelize_module(self, tp, {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
            # sharded logits for loss_parallel, else gathered whole
            "output": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
            if self.loss_parallel else ColwiseParallel(output_layouts=Replicate()),
        })
        for block in self.layers:
            parallelize_module(block, tp, {
                "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(),
                **({"feed_forwrd.w2": RowwiseParallel()} if self.plan_typo else {}),
            })
        if self.self_shard:  # as a Lightning program does it: the strategy then leaves it
            from torch.distributed.fsdp import fully_shard

            data = self.device_mesh["dp_shard"]
            for block in self.layers:
                fully_shard(block, mesh=data)
            fully_shard(self, mesh=data)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for block in self.layers:
            h = block(h)
        return self.output(self.norm(h))

    def training_step(self, batch, batch_idx):
        tokens, targets = batch
        logits = self(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self):
        return DataLoader(make_tokens(self.samples), batch_size=self.batch_size)


def make_tokens(n: int) -> TensorDataset:
    """``n`` sequences of a learnable pattern (each token the previous plus a per-sequence
    step, modulo VOCAB), next-token targets."""
    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    step = torch.randint(1, 4, (n, 1), generator=g)
    seq = (start + step * torch.arange(SEQ + 1)) % VOCAB
    return TensorDataset(seq[:, :-1], seq[:, 1:])


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
    p.add_argument("--resume", action="store_true", help="from the root's last.ckpt")
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--build", default="configure", choices=["configure", "init"])
    p.add_argument("--hidden", type=int, default=2 * DIM, help="the feed-forward width")
    p.add_argument("--plan-typo", action="store_true", help="a plan key naming no submodule")
    p.add_argument("--self-shard", action="store_true",
                   help="configure_model calls fully_shard itself (over dp_shard)")
    args = p.parse_args()

    ptrain.seed_everything(7)
    module = Decoder(args.build, loss_parallel=args.loss_parallel, hidden=args.hidden,
                     plan_typo=args.plan_typo,
                     batch_size=BATCH if args.devices > 1 else BATCH * args.dp,
                     samples=BATCH * args.dp * args.steps, self_shard=args.self_shard)
    strategy = args.strategy if args.devices > 1 else "single-device"
    options = {}
    if strategy == "model-parallel":
        options = {strategy: {"replicate": args.replicate, "shard": args.shard,
                              "tensor": args.tensor, "timeout": 120,
                              "loss_parallel": args.loss_parallel}}
    elif strategy == "fsdp":
        options = {strategy: {"replicate": args.replicate, "timeout": 120}}
    trainer = ptrain.Trainer(
        strategy=strategy, devices=args.devices,
        accelerator="cpu", max_epochs=args.epochs, gradient_clip_val=args.clip,
        default_root_dir=args.root,
        callbacks=["no:progress-bar", "no:tensorboard", "no:model-summary",
                   *([] if args.save else ["no:checkpoint"]),
                   Probe(Path(args.out))],
        plugin_options=options)
    trainer.fit(module, ckpt_path="last" if args.resume else None)


if __name__ == "__main__":
    main()
