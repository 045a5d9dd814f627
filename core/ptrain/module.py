"""The user's side of the contract: :class:`TrainModule` and :class:`DataModule`.

Shaped like Lightning's ``LightningModule`` and ``LightningDataModule`` so that a model is ported
by changing its imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from ptrain.trainer import Trainer


class TrainModule(nn.Module):
    """A model plus how to train it.

    Override ``training_step`` (return the loss tensor, or a dict with ``"loss"``),
    ``configure_optimizers`` and optionally ``validation_step``, ``train_dataloader`` and
    ``val_dataloader``. Set ``automatic_optimization = False`` to call backward and the optimizer
    steps yourself (through :meth:`manual_backward` and the optimizers of :meth:`optimizers`, so
    that precision and strategy plugins still apply).
    """

    automatic_optimization: bool = True

    def __init__(self) -> None:
        super().__init__()
        self._trainer: Trainer | None = None

    def __getstate__(self) -> dict[str, Any]:
        # pickled for a worker process: the trainer it was last attached to stays behind
        return {**super().__getstate__(), "_trainer": None}

    @property
    def trainer(self) -> Trainer:
        if self._trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer; this is "
                               f"only available during fit() or validate().")
        return self._trainer

    # -- to override -------------------------------------------------------------------------

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement training_step")

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return None

    def configure_optimizers(self) -> Any:
        """Return an optimizer; or a dict ``{"optimizer": opt, "lr_scheduler": sched}`` where the
        scheduler may be a dict ``{"scheduler": s, "interval": "step" | "epoch", "frequency":
        n}``; or a pair of lists ``([optimizers], [schedulers])``; or a list of such dicts."""
        raise NotImplementedError(f"{type(self).__name__} must implement configure_optimizers")

    def train_dataloader(self) -> DataLoader | None:
        return None

    def val_dataloader(self) -> DataLoader | None:
        return None

    # -- to call -----------------------------------------------------------------------------

    def log(
        self,
        name: str,
        value: torch.Tensor | float,
        prog_bar: bool = False,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
    ) -> None:
        """Record a metric. The value stays a tensor (no host sync) until it is shown or written.

        Defaults: in ``training_step`` ``on_step=True, on_epoch=False``; in ``validation_step``
        ``on_step=False, on_epoch=True`` (averaged over the validation run). With both on, the
        metric is published as ``NAME_step`` and ``NAME_epoch``. Outside fit/validate: ignored.
        """
        if self._trainer is not None:
            self._trainer.metrics.log(name, value, prog_bar, on_step, on_epoch)

    def optimizers(self) -> Any:
        """The optimizer (or list of them) for manual optimization; their ``step()`` runs the
        trainer's hooks (unscaling, clipping, the precision's step)."""
        wrapped = [ManualOptimizer(self.trainer, opt) for opt in self.trainer.optimizers]
        return wrapped[0] if len(wrapped) == 1 else wrapped

    def manual_backward(self, loss: torch.Tensor) -> None:
        """Backward through the active precision and strategy plugins (the ``backward`` hook).
        Under a multi-process strategy the gradients are synchronised unless
        ``trainer.sync_gradients`` is ``False`` (see ``ptrain_toggling.toggle_model``)."""
        self.trainer.step_hooks.backward(trainer=self.trainer, loss=loss)


class ManualOptimizer:
    """An optimizer as a manually-optimizing module sees it: ``step()`` goes through the trainer's
    ``on_before_optimizer_step``, ``clip_gradients`` and ``optimizer_step`` hooks and counts
    towards ``trainer.global_step``; everything else is the optimizer's own. ``optimizer`` is the
    one in ``trainer.optimizers``."""

    def __init__(self, trainer: Trainer, optimizer: torch.optim.Optimizer):
        self.trainer = trainer
        self.optimizer = optimizer

    def step(self) -> None:
        self.trainer.run_optimizer_step(self.optimizer)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


class DataModule:
    """Data kept apart from the model: ``train_dataloader()`` and ``val_dataloader()``.

    ``setup(stage)`` is called once before the dataloaders are requested (``"fit"`` or
    ``"validate"``); download or split there.
    """

    def setup(self, stage: str) -> None:
        pass

    def train_dataloader(self) -> DataLoader | None:
        return None

    def val_dataloader(self) -> DataLoader | None:
        return None
