"""Modules for the CLI tests, imported by the ``ptrain`` subprocesses as
``tests._cli_models:NAME`` (the tests run the CLI from the repository root)."""

from __future__ import annotations

import torch

from tests.conftest import TinyRegressor

#: The first (0-based) training batch, counted over the whole run, whose loss is NaN.
NAN_FROM_BATCH = 5


class NaNRegressor(TinyRegressor):
    """TinyRegressor whose training loss is NaN from the ``nan_from``-th training batch on."""

    def __init__(self, nan_from: int = NAN_FROM_BATCH, **kwargs):
        super().__init__(**kwargs)
        self.nan_from = nan_from
        self.batches_seen = 0

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.batches_seen >= self.nan_from:
            loss = loss * float("nan")
        self.batches_seen += 1
        return loss


class RecordingRegressor(TinyRegressor):
    """TinyRegressor that appends ``epoch batch_idx global_step`` to the file ``record`` for
    every training step it runs (to see where a resumed run started)."""

    def __init__(self, record: str, **kwargs):
        super().__init__(**kwargs)
        self.record = record

    def training_step(self, batch, batch_idx):
        with open(self.record, "a", encoding="utf-8") as f:
            f.write(f"{self.trainer.current_epoch} {batch_idx} {self.trainer.global_step}\n")
        return super().training_step(batch, batch_idx)


class FreezeCountRegressor(TinyRegressor):
    """TinyRegressor that writes, as it is built, how many objects the garbage collector has
    frozen (``gc.get_freeze_count()``) and whether it is itself among those it collects."""

    def __init__(self, record: str, **kwargs):
        super().__init__(**kwargs)
        import gc

        collected = any(obj is self for obj in gc.get_objects())
        with open(record, "w", encoding="utf-8") as f:
            f.write(f"{gc.get_freeze_count()} {collected}\n")


class NotAModule:
    """A class that is not a ptrain.TrainModule."""


class NaNGradientRegressor(TinyRegressor):
    """TinyRegressor whose ``nan_at``-th training batch (0-based, over the whole run) has a
    finite loss but NaN gradients, so the optimizer step leaves NaN weights."""

    def __init__(self, nan_at: int, **kwargs):
        super().__init__(**kwargs)
        self.nan_at = nan_at
        self.batches_seen = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        prediction = self(x)
        if self.batches_seen == self.nan_at:
            prediction.register_hook(lambda grad: grad * float("nan"))
        self.batches_seen += 1
        loss = torch.nn.functional.mse_loss(prediction, y)
        self.log("train_loss", loss, prog_bar=True)
        return loss
