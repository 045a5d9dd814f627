"""A module that builds a table on first use in ``forward`` without a dtype (as Lightning's demo
transformer's positional encoding does), trained under a true precision given as the second
argument (``bf16-true`` or ``64-true``): Lightning makes such tensors in the precision's dtype.

Run as ``python lazy_table_true_precision.py OUT_DIR PRECISION``; writes ``OUT_DIR/result.json``.
"""

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(6, 6)
        self.outer = nn.Linear(6, 1)
        self.table = None

    def forward(self, x):
        if self.table is None:  # made on first use, in the default dtype
            self.table = torch.linspace(0, 1, 6)
        return self.outer(torch.tanh(self.inner(x)) + self.table)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x).squeeze(1), y)
        self.log("train_loss", loss)
        self.log("a_number", 1.0001)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main(out: str, precision: str) -> None:
    pl.seed_everything(5)
    model = Model()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 6, generator=g)
    data = DataLoader(TensorDataset(x, x.sum(1)), batch_size=8)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", precision=precision, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, default_root_dir=out)
    trainer.fit(model, data)
    result = {
        "table_dtype": str(model.table.dtype),
        "weights": [float(p.detach().double().sum()) for p in model.parameters()],
        "train_loss": float(trainer.callback_metrics["train_loss"]),
        "a_number": float(trainer.callback_metrics["a_number"]),
        "default_dtype_after": str(torch.get_default_dtype()),
    }
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
