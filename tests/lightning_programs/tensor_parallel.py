"""A 2-D parallel program written as Lightning's ``examples/pytorch/tensor_parallel`` teaches:
``ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2)`` on 4 processes, a small
Llama-style decoder whose ``configure_model`` applies a tensor-parallel plan on
``self.device_mesh["tensor_parallel"]`` (the output layer's logits left sharded) and
``fully_shard`` on ``self.device_mesh["data_parallel"]``, and the loss and its backward inside
``loss_parallel()``.

Run as ``python tensor_parallel.py OUT_DIR``; rank 0 writes ``OUT_DIR/result.json``: every rank's
loss at every step, and the sum of each parameter's whole tensor after training.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, loss_parallel,
                                               parallelize_module)
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl
from lightning.pytorch.strategies import ModelParallelStrategy

VOCAB, DIM, HEADS, DEPTH, SEQ = 64, 32, 4, 2, 8


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, DIM // HEADS).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, 2 * DIM, bias=False)
        self.w3 = nn.Linear(DIM, 2 * DIM, bias=False)
        self.w2 = nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.attention, self.feed_forward = Attention(), FeedForward()

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(DEPTH))
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def parallelize(model: Transformer, device_mesh) -> Transformer:
    dp_mesh, tp_mesh = device_mesh["data_parallel"], device_mesh["tensor_parallel"]
    parallelize_module(model, tp_mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
        "output": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    })
    for block in model.layers:
        parallelize_module(block, tp_mesh, {
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(),
        })
    for block in model.layers:
        fully_shard(block, mesh=dp_mesh)
    return fully_shard(model, mesh=dp_mesh)


class Decoder(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = Transformer()
        self.losses = []

    def configure_model(self):
        parallelize(self.model, device_mesh=self.device_mesh)

    def training_step(self, batch):
        tokens, targets = batch
        output = self.model(tokens)
        with loss_parallel():
            loss = F.cross_entropy(output.reshape(-1, output.size(-1)), targets.reshape(-1))
        self.losses.append(loss.detach())
        return loss

    def backward(self, *args, **kwargs):
        with loss_parallel():
            super().backward(*args, **kwargs)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.model.parameters(), lr=1e-2)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        start = torch.randint(0, VOCAB, (64, 1), generator=g)
        step = torch.randint(1, 4, (64, 1), generator=g)
        seq = (start + step * torch.arange(SEQ + 1)) % VOCAB
        # the trainer gives each data-parallel replica its share; a tensor-parallel pair reads
        # the same batches
        return DataLoader(TensorDataset(seq[:, :-1], seq[:, 1:]), batch_size=4)


def main(out: str) -> None:
    pl.seed_everything(0)
    trainer = pl.Trainer(
        accelerator="cpu", devices=4, max_steps=6, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2))
    model = Decoder()
    trainer.fit(model)
    losses = [float(x.full_tensor() if hasattr(x, "full_tensor") else x) for x in model.losses]
    every_rank = [None] * trainer.world_size
    dist.all_gather_object(every_rank, losses)
    whole = get_model_state_dict(model.model, options=StateDictOptions(full_state_dict=True))
    if trainer.global_rank == 0:
        result = {"losses": every_rank, "global_step": trainer.global_step,
                  "mesh": list(model.device_mesh.mesh_dim_names),
                  "weights": {k: float(v.double().sum()) for k, v in whole.items()}}
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
