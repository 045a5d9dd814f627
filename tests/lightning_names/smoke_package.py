"""Smoke uses of ``ptrain.lightning``'s own names."""

from __future__ import annotations

import torch

import ptrain.lightning as pl


def _trains_with_its_callback():
    seen = []

    class Counter(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(batch_idx)

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Data(pl.LightningDataModule):
        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.ones(4, 2), batch_size=2)

    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[Counter()], accelerator="cpu")
    trainer.fit(Model(), datamodule=Data())
    assert seen == [0, 1] and trainer.global_step == 2


def _seeds_alike():
    assert pl.seed_everything(3) == 3
    first = torch.rand(2)
    pl.seed_everything(3)
    assert torch.equal(first, torch.rand(2))


def _logo():
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        pl.cli_lightning_logo()
    assert pl.LIGHTNING_LOGO.strip() in out.getvalue()


SMOKE = {
    "Callback": _trains_with_its_callback,
    "LightningModule": _trains_with_its_callback,
    "LightningDataModule": _trains_with_its_callback,
    "Trainer": _trains_with_its_callback,
    "seed_everything": _seeds_alike,
    "LIGHTNING_LOGO": _logo,
    "cli_lightning_logo": _logo,
}