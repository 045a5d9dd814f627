"""Models for tests/plugins/strategies/test_context_parallel.py: a model that works token by
token (no attention), so that a sequence split over processes computes what the whole
sequence does, and what each process saw can be read back.

Each training step appends ``{"loss", "positions"}`` (a JSON line) to
``<record_dir>/rank<R>.jsonl``: the step's loss on this process and the sequence positions of
the tokens it held (the first feature of every token is its position)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import ptrain

FEATURES = 8


def token_sequences(samples: int, length: int, seed: int = 0) -> TensorDataset:
    """``samples`` sequences of ``length`` tokens of ``FEATURES`` features, the first of
    which is the token's position, and a per-token target of 2 values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, length, FEATURES, generator=g)
    x[..., 0] = torch.arange(length, dtype=torch.float32)
    y = torch.randn(samples, length, 2, generator=g)
    return TensorDataset(x, y)


class TokenMLP(ptrain.TrainModule):
    """``prebatched``: the training set holds whole batches, read with ``batch_size=None``, so
    each batch is a view of the dataset's tensors; ``<record_dir>/dataset<R>.json`` then says
    whether the dataset is as made after training (a split done in place would change it)."""

    def __init__(self, samples: int = 32, length: int = 8, batch_size: int = 8,
                 record_dir: str = "", lr: float = 0.05, prebatched: bool = False):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.GELU(), nn.Linear(32, 2))
        self.train_data: TensorDataset | None = None

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        if self.hparams.record_dir:
            rank = dist.get_rank() if dist.is_initialized() else 0
            positions = sorted(set(x[..., 0].flatten().long().tolist()))
            with open(Path(self.hparams.record_dir) / f"rank{rank}.jsonl", "a",
                      encoding="utf-8") as f:
                f.write(json.dumps({"loss": loss.item(), "positions": positions}) + "\n")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self):
        h = self.hparams
        data = token_sequences(h.samples, h.length)
        if not h.prebatched:
            return DataLoader(data, batch_size=h.batch_size)
        self.train_data = TensorDataset(*(t.view(-1, h.batch_size, *t.shape[1:])
                                          for t in data.tensors))
        return DataLoader(self.train_data, batch_size=None)

    def on_train_end(self):
        if self.train_data is not None and self.hparams.record_dir:
            h = self.hparams
            made = token_sequences(h.samples, h.length).tensors
            intact = all(torch.equal(kept.flatten(0, 1), whole)
                         for kept, whole in zip(self.train_data.tensors, made))
            rank = dist.get_rank() if dist.is_initialized() else 0
            (Path(h.record_dir) / f"dataset{rank}.json").write_text(json.dumps(intact))

    def val_dataloader(self):
        h = self.hparams
        return DataLoader(token_sequences(16, h.length, seed=1), batch_size=h.batch_size)

    def predict_dataloader(self):
        return self.val_dataloader()


def read(record_dir: Path, rank: int = 0) -> list[dict]:
    path = Path(record_dir) / f"rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
