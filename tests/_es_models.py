"""Modules that log known metric sequences, for the ``early-stopping`` tests.

They live in an importable module (``tests._es_models``) because the 2-rank ddp test's spawned
workers unpickle them.
"""

from __future__ import annotations

import torch.distributed as dist

from tests.conftest import TinyRegressor


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _pick(values, index: int) -> float:
    return float(values[min(index, len(values) - 1)])  # past the end: the last value again


class SequenceModule(TinyRegressor):
    """TinyRegressor (2 training batches and 1 validation batch per epoch by default) whose
    ``validation_step`` logs ``val_metric`` from ``val_values``.

    ``val_values`` is indexed by ``trainer.current_epoch``, or with ``per_check=True`` by the
    number of validation runs so far (for several checks per epoch). With ``per_rank=True`` it is
    a list of sequences, one per rank: what the ranks log differs, their mean is the known
    sequence. ``train_values`` (indexed by epoch) is logged as the epoch-level ``train_metric``.
    Every epoch the training loop enters is recorded in ``epochs_seen`` (in this process)."""

    def __init__(self, val_values=(), train_values=None, per_check: bool = False,
                 per_rank: bool = False, n: int = 16, batch_size: int = 8, val_n: int = 8,
                 **kwargs):
        super().__init__(n=n, batch_size=batch_size, val_n=val_n, **kwargs)
        self.val_values, self.train_values = list(val_values), train_values
        self.per_check, self.per_rank = per_check, per_rank
        self.validations = 0
        self.epochs_seen: list[int] = []

    def training_step(self, batch, batch_idx):
        epoch = self.trainer.current_epoch
        if not self.epochs_seen or self.epochs_seen[-1] != epoch:
            self.epochs_seen.append(epoch)
        if self.train_values is not None:
            self.log("train_metric", _pick(self.train_values, epoch), on_step=False,
                     on_epoch=True)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        if not self.val_values:
            return
        index = self.validations if self.per_check else self.trainer.current_epoch
        if batch_idx == 0:
            self.validations += 1
        values = self.val_values[_rank()] if self.per_rank else self.val_values
        self.log("val_metric", _pick(values, index))


class StepSequenceModule(TinyRegressor):
    """TinyRegressor whose ``training_step`` also logs ``train_metric`` on step: from
    ``per_rank`` (one sequence per rank, indexed by the global step before the step), so what
    the ranks log differs and their mean is the known sequence."""

    def __init__(self, per_rank, **kwargs):
        super().__init__(**kwargs)
        self.per_rank = per_rank

    def training_step(self, batch, batch_idx):
        self.log("train_metric", _pick(self.per_rank[_rank()], self.trainer.global_step))
        return super().training_step(batch, batch_idx)
