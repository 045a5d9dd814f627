"""Modules for ``tests/test_export.py`` and ``tests/test_model_summary.py``, in a module of their
own so that worker processes (ddp, fsdp) and the CLI (``--model tests._export_models:NAME``) can
import them."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ptrain

VOCAB = 16


def token_data(n: int = 64, length: int = 6, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (n, length + 1), generator=g)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


class TiedLM(ptrain.TrainModule):
    """A next-token model whose output projection is the embedding matrix (weight tying), with a
    non-trainable layer and a buffer: what an export must get right."""

    def __init__(self, width: int = 8, lr: float = 0.05, batch_size: int = 8):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(VOCAB, width)
        self.mix = nn.Linear(width, width)
        self.frozen = nn.Linear(width, width)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(width, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("scale", torch.tensor(0.5))
        self.lr, self.batch_size = lr, batch_size
        self.train_set = token_data()

    def forward(self, tokens):
        h = self.embed(tokens)
        h = torch.tanh(self.mix(h)) + self.frozen(h) * self.scale
        return self.head(h)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x).flatten(0, 1), y.flatten())
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.lr)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size)
