"""``lightning.pytorch.callbacks.gradient_accumulation_scheduler``:
``GradientAccumulationScheduler``, a number of batches to accumulate that changes by epoch."""

from __future__ import annotations

from typing import Any

import torch

from ptrain.errors import ConfigError, ModelError
from ptrain.hook_methods import Callback


class GradientAccumulationScheduler(Callback):
    """Lightning's ``GradientAccumulationScheduler``: ``scheduling`` maps an epoch to the number
    of batches whose gradients make one optimizer step from that epoch on (``{0: 1, 4: 2}``; an
    epoch before the first key accumulates 1). ``trainer.accumulate_grad_batches`` reads the
    epoch's number, as in Lightning.

    How, through Lightning's callback methods: at each training batch it decides whether the
    batch ends an accumulation window (``trainer.sync_gradients``: every ``k``-th batch and the
    epoch's last, as Lightning), and before each optimizer step it divides the summed gradients
    by ``k``. Lightning divides each batch's loss by ``k`` instead: the same gradients, to the
    bit when ``k`` is a power of two (otherwise within float rounding). ``on_before_backward``
    therefore sees the undivided loss.
    """

    def __init__(self, scheduling: dict[int, int]):
        if not isinstance(scheduling, dict) or not scheduling:
            raise ConfigError(f"GradientAccumulationScheduler(scheduling={scheduling!r}) needs "
                              f"a dict of epoch -> batches to accumulate, e.g. {{0: 1, 4: 2}}.")
        for epoch, batches in scheduling.items():
            if not isinstance(epoch, int) or epoch < 0:
                raise ConfigError(f"GradientAccumulationScheduler: epoch {epoch!r} must be an "
                                  f"int of at least 0 (the first epoch is 0).")
            if not isinstance(batches, int) or batches < 1:
                raise ConfigError(f"GradientAccumulationScheduler: {batches!r} batches at "
                                  f"epoch {epoch} must be an int of at least 1.")
        self.scheduling = dict(sorted(({0: 1} | scheduling).items()))
        self.epochs = list(self.scheduling)
        self._batches = 1
        self._configured: int | None = None  # trainer.accumulate_grad_batches before fit

    def going_to_accumulate_grad_batches(self) -> bool:
        return any(batches > 1 for batches in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        """The number of batches epoch ``epoch`` accumulates."""
        return self.scheduling[max(e for e in self.epochs if e <= epoch)]

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not pl_module.automatic_optimization:
            raise ModelError(f"GradientAccumulationScheduler applies to automatic optimization; "
                             f"{type(pl_module).__name__} optimizes manually, so it accumulates "
                             f"itself. Remove the callback.")
        if trainer.accumulate_grad_batches != 1:
            raise ConfigError(f"Trainer(accumulate_grad_batches="
                              f"{trainer.accumulate_grad_batches}) and a "
                              f"GradientAccumulationScheduler both set the batches to "
                              f"accumulate; keep one (the scheduler: {{0: N}} for N from the "
                              f"start).")
        self._configured = trainer.accumulate_grad_batches

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._batches = self.get_accumulate_grad_batches(trainer.current_epoch)
        trainer.accumulate_grad_batches = self._batches

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        if self._batches > 1:
            trainer.sync_gradients = ((batch_idx + 1) % self._batches == 0
                                      or batch_idx + 1 == trainer.num_training_batches)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._batches > 1:
            grads = [p.grad for group in optimizer.param_groups for p in group["params"]
                     if p.grad is not None]
            if grads:
                torch._foreach_mul_(grads, 1.0 / self._batches)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._configured is not None:  # the next fit starts from the Trainer's own
            trainer.accumulate_grad_batches, self._configured = self._configured, None
        self._batches = 1


__all__ = ["GradientAccumulationScheduler"]
