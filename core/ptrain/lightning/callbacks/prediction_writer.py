"""``lightning.pytorch.callbacks.prediction_writer``: ``BasePredictionWriter``, the base class
of callbacks that write predictions as they are made."""

from __future__ import annotations

from typing import Any

from ptrain.errors import ConfigError
from ptrain.hook_methods import Callback

INTERVALS = ("batch", "epoch", "batch_and_epoch")


class WriteInterval:
    """When a writer writes: after each batch, at the end of the pass, or both."""

    def __init__(self, value: str):
        self.value = value

    @property
    def on_batch(self) -> bool:
        return self.value in ("batch", "batch_and_epoch")

    @property
    def on_epoch(self) -> bool:
        return self.value in ("epoch", "batch_and_epoch")


class BasePredictionWriter(Callback):
    """Lightning's ``BasePredictionWriter``: subclass it with ``write_on_batch_end(trainer,
    pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx)`` and/or
    ``write_on_epoch_end(trainer, pl_module, predictions, batch_indices)`` and pass it in
    ``callbacks``; ``trainer.predict(...)`` calls them on every process with that process's
    predictions, as Lightning does.

    ``batch_indices`` are the dataset indices of the batch (``write_on_epoch_end``: one list per
    batch, in a list per dataloader, as Lightning's) where the predict loader's order is fixed
    (no shuffling), else ``None``. ``dataloader_idx`` is 0: ptrain predicts over one dataloader.
    For ``write_on_epoch_end`` the writer keeps this process's predictions itself, so it works
    with ``return_predictions=False`` too.
    """

    def __init__(self, write_interval: str = "batch") -> None:
        if write_interval not in INTERVALS:
            raise ConfigError(f"BasePredictionWriter(write_interval={write_interval!r}) is not "
                              f"an interval; valid choices: {', '.join(INTERVALS)}.")
        self.interval = WriteInterval(write_interval)
        self._predictions: list[Any] = []
        self._batch_indices: list[Any] = []

    def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: Any,
                           batch_indices: Any, batch: Any, batch_idx: int,
                           dataloader_idx: int) -> None:
        """Write one batch's prediction (override with ``write_interval`` ``"batch"``)."""
        raise NotImplementedError(f"{type(self).__name__} writes after each batch "
                                  f"(write_interval={self.interval.value!r}) but does not "
                                  f"override write_on_batch_end.")

    def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: list[Any],
                           batch_indices: list[Any]) -> None:
        """Write the pass's predictions (override with ``write_interval`` ``"epoch"``)."""
        raise NotImplementedError(f"{type(self).__name__} writes at the end of the pass "
                                  f"(write_interval={self.interval.value!r}) but does not "
                                  f"override write_on_epoch_end.")

    def on_predict_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._predictions, self._batch_indices = [], []

    def on_predict_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None:
        indices = trainer.batch_indices
        if self.interval.on_batch:
            self.write_on_batch_end(trainer, pl_module, outputs, indices, batch, batch_idx,
                                    dataloader_idx)
        if self.interval.on_epoch:
            self._predictions.append(outputs)
            self._batch_indices.append(indices)

    def on_predict_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.interval.on_epoch:
            predictions, indices = self._predictions, [self._batch_indices]
            self._predictions, self._batch_indices = [], []
            self.write_on_epoch_end(trainer, pl_module, predictions, indices)


__all__ = ["BasePredictionWriter"]
