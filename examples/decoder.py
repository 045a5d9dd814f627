"""A small Llama-style decoder with a tensor-parallel plan, for ``--strategy model-parallel``.

Token embedding, ``depth`` blocks (RMSNorm, causal self-attention, RMSNorm, SwiGLU feed-forward,
each with a residual), a norm and the output layer, learning to continue arithmetic sequences
of tokens (each the previous plus a per-sequence step, modulo the vocabulary)::

    ptrain fit --config examples/decoder.toml                  # 4 processes: shard 2 x tensor 2
    ptrain fit --config examples/decoder.toml --model-parallel-replicate 2 \\
        --model-parallel-tensor 1                               # hybrid: replicate 2 x shard 2

Under ``model-parallel`` the layers are made in ``configure_model``, on the meta device, and
the plan of :meth:`Decoder.plan` and :meth:`Decoder.block_plan` is applied there, on
``self.device_mesh["tp"]``; the strategy then shards the result with FSDP2 over the
data-parallel dimensions. The attention reshapes with ``view(b, s, -1, head_dim)``, so each
process computes its own ``heads / tp`` heads. On one process (or under ``fsdp``, whose mesh
has no ``tp``) the same module trains without a plan.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import ptrain


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        # -1 heads: under a tensor-parallel plan each process holds heads / tp of them
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim)
        self.attention = Attention(dim, heads)
        self.ffn_norm = nn.RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


def arithmetic_sequences(samples: int, vocab: int, length: int, seed: int = 0) -> TensorDataset:
    """``samples`` token sequences of ``length`` (each token the previous plus a per-sequence
    step of 1 to 3, modulo ``vocab``) and their next-token targets."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (samples, 1), generator=g)
    step = torch.randint(1, 4, (samples, 1), generator=g)
    seq = (start + step * torch.arange(length + 1)) % vocab
    return TensorDataset(seq[:, :-1], seq[:, 1:])


class Decoder(ptrain.TrainModule):
    """The decoder. ``build="configure"`` makes the layers in ``configure_model`` (on the meta
    device under ``model-parallel`` and ``fsdp``), ``"init"`` in ``__init__``.
    ``loss_parallel=True`` leaves the logits sharded over ``tp`` for a loss computed inside
    torch's ``loss_parallel()`` (with ``--model-parallel-loss-parallel``)."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, depth: int = 2,
                 hidden: int = 64, length: int = 8, samples: int = 32, batch_size: int = 4,
                 lr: float = 1e-2, build: str = "configure", loss_parallel: bool = False):
        super().__init__()
        self.save_hyperparameters()
        self.layers = None
        if build == "init":
            self._make_layers()

    def _make_layers(self):
        h = self.hparams
        self.tok_embeddings = nn.Embedding(h.vocab, h.dim)
        self.layers = nn.ModuleList(Block(h.dim, h.heads, h.hidden) for _ in range(h.depth))
        self.norm = nn.RMSNorm(h.dim)
        self.output = nn.Linear(h.dim, h.vocab, bias=False)

    def plan(self) -> dict:
        """The plan of the layers outside the blocks (``parallelize_module`` on the module)."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        # logits sharded for loss_parallel, else gathered whole
        output = (ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
                  if self.hparams.loss_parallel else ColwiseParallel(output_layouts=Replicate()))
        return {"tok_embeddings": RowwiseParallel(input_layouts=Replicate()), "output": output}

    def block_plan(self) -> dict:
        """Each block's plan: attention's and the feed-forward's input projections split by
        output features (column-wise), their output projections by input features (row-wise),
        so each block needs one all-reduce in attention and one in the feed-forward."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel()}

    def configure_model(self):
        if self.layers is None:
            self._make_layers()
        if self.device_mesh is None or "tp" not in self.device_mesh.mesh_dim_names:
            return  # one process, or a mesh without tensor parallelism
        # self.parallelize is torch's parallelize_module with the run's plugins taking part
        # (fp8-mixed converts the planned layers first)
        tp = self.device_mesh["tp"]
        self.parallelize(self, tp, self.plan())
        for block in self.layers:
            self.parallelize(block, tp, self.block_plan())

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for block in self.layers:
            h = block(h)
        return self.output(self.norm(h))

    def training_step(self, batch, batch_idx):
        tokens, targets = batch
        logits = self(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self):
        h = self.hparams
        return DataLoader(arithmetic_sequences(h.samples, h.vocab, h.length),
                          batch_size=h.batch_size)
