"""``lightning.pytorch.callbacks.prediction_writer``: ``BasePredictionWriter``, the base class
of callbacks that write predictions as they are made."""

from __future__ import annotations

from typing import Any

from ptrain.errors import ConfigError
from ptrain.evaluation_loop import loaders_of
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

    ``batch_indices`` are the dataset indices of the batch where the predict loader's order is
    fixed (no shuffling), else ``None``. ``write_on_epoch_end`` gets them as Lightning gives
    them: one list per batch, in a list per dataloader; and ``predictions`` as the list of batch
    outputs, or under several predict dataloaders one such list per dataloader. The writer
    keeps this process's predictions itself, so it works with ``return_predictions=False`` too.
    """

    def __init__(self, write_interval: str = "batch") -> None:
        if write_interval not in INTERVALS:
            raise ConfigError(f"BasePredictionWriter(write_interval={write_interval!r}) is not "
                              f"an interval; valid choices: {', '.join(INTERVALS)}.")
        self.interval = WriteInterval(write_interval)
        self._predictions: list[list[Any]] = []  # per dataloader
        self._batch_indices: list[list[Any]] = []

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
            while len(self._predictions) <= dataloader_idx:
                self._predictions.append([])
                self._batch_indices.append([])
            self._predictions[dataloader_idx].append(outputs)
            self._batch_indices[dataloader_idx].append(indices)

    def on_predict_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.interval.on_epoch:
            # a dataloader that gave no batch (the last ones, limited to 0) has its empty list
            count = len(loaders_of(trainer.predict_dataloader))
            predictions = self._predictions + [[] for _ in range(count - len(self._predictions))]
            indices = self._batch_indices + [[] for _ in range(count - len(self._batch_indices))]
            self._predictions, self._batch_indices = [], []
            self.write_on_epoch_end(trainer, pl_module,
                                    predictions[0] if count == 1 else predictions, indices)


__all__ = ["BasePredictionWriter"]
