"""``lightning.pytorch.callbacks.throughput_monitor``: ``ThroughputMonitor``, batches, samples,
items and FLOPs per second sent to the loggers."""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable

import torch

from ptrain.hook_methods import Callback
from ptrain.lightning._common import refuse

_STAGE_NAMES = {"train": "train", "validate": "validate", "test": "test", "predict": "predict"}


class _Counts:
    """A stage's running totals and the totals at the last report."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.batches = self.samples = self.lengths = 0
        self.flops = 0.0
        self.last = (self.start, 0, 0, 0, 0.0)  # time, batches, samples, lengths, flops


class ThroughputMonitor(Callback):
    """Lightning's ``ThroughputMonitor``: counts the batches, samples (``batch_size_fn(batch)``),
    items (``length_fn(batch)``, e.g. tokens) and FLOPs (the module's ``flops_per_batch``) of
    training and of each evaluation pass, and sends the rates to the loggers as
    ``train/batches_per_sec``, ``train/samples_per_sec``, ``train/items_per_sec``,
    ``train/flops_per_sec``, their per-device forms ``train/device/...`` (and
    ``train/device/mfu`` when ``available_flops`` is given), with the totals ``train/time``,
    ``train/batches``, ``train/samples``, ``train/lengths``.

    Lightning synchronises the device after every batch to time it; ptrain times the device
    only where it reports (each ``log_every_n_steps`` steps in training, and once at the end of
    each evaluation pass), so the rates are over the batches since the last report, without a
    sync per batch. Global rates are rank 0's times the number of processes, as Lightning's.
    ``window_size`` is therefore not used, and refused; ``separator`` is Lightning's (``/``).
    """

    def __init__(self, batch_size_fn: Callable[[Any], int],
                 length_fn: Callable[[Any], int] | None = None, **kwargs: Any) -> None:
        self.batch_size_fn, self.length_fn = batch_size_fn, length_fn
        self.separator = kwargs.pop("separator", "/")
        self.available_flops = kwargs.pop("available_flops", None)
        if kwargs:
            argument = next(iter(kwargs))
            raise refuse("ThroughputMonitor", argument, kwargs[argument],
                         "ptrain reports the rates over the batches since the last report "
                         "(every log_every_n_steps steps); leave it out")
        self._counts: dict[str, _Counts] = {}
        self._warned_flops = False

    def _start(self, trainer: Any, stage: str) -> None:
        if trainer.is_global_zero:
            self._counts[stage] = _Counts()

    @torch.no_grad()
    def _update(self, trainer: Any, pl_module: Any, stage: str, batch: Any) -> None:
        counts = self._counts.get(stage)
        if counts is None:
            return
        counts.batches += 1
        counts.samples += self.batch_size_fn(batch)
        if self.length_fn is not None:
            counts.lengths += self.length_fn(batch)
        flops = getattr(pl_module, "flops_per_batch", None)
        if flops is None and not self._warned_flops:
            self._warned_flops = True
            warnings.warn(f"ThroughputMonitor reports FLOPs when {type(pl_module).__name__} has "
                          f"a flops_per_batch attribute (e.g. from "
                          f"ptrain.lightning.utilities.measure_flops).", stacklevel=3)
        counts.flops += flops or 0.0

    def _report(self, trainer: Any, stage: str) -> None:
        counts = self._counts.get(stage)
        if counts is None or counts.batches == counts.last[1]:
            return
        if trainer.device.type == "cuda":
            torch.cuda.synchronize(trainer.device)
        now = time.perf_counter()
        then, batches, samples, lengths, flops = counts.last
        elapsed = max(now - then, 1e-12)
        per_device = {"batches_per_sec": (counts.batches - batches) / elapsed,
                      "samples_per_sec": (counts.samples - samples) / elapsed}
        if self.length_fn is not None:
            per_device["items_per_sec"] = (counts.lengths - lengths) / elapsed
        if counts.flops:
            per_device["flops_per_sec"] = (counts.flops - flops) / elapsed
        sep, world = self.separator, trainer.world_size
        metrics = {f"{stage}{sep}time": now - counts.start,
                   f"{stage}{sep}batches": float(counts.batches),
                   f"{stage}{sep}samples": float(counts.samples)}
        if self.length_fn is not None:
            metrics[f"{stage}{sep}lengths"] = float(counts.lengths)
        for name, value in per_device.items():
            metrics[f"{stage}{sep}{name}"] = value * world
            metrics[f"{stage}{sep}device{sep}{name}"] = value
        if self.available_flops and "flops_per_sec" in per_device:
            metrics[f"{stage}{sep}device{sep}mfu"] = per_device["flops_per_sec"] / \
                self.available_flops
        counts.last = (now, counts.batches, counts.samples, counts.lengths, counts.flops)
        trainer.hook.log_metrics(trainer=trainer, metrics=metrics, step=trainer.global_step)

    # -- Lightning's callback methods ----------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._start(trainer, "train")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._update(trainer, pl_module, "train", batch)
        if trainer.global_step % trainer.log_every_n_steps == 0 and trainer.sync_gradients:
            self._report(trainer, "train")

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self._start(trainer, "validate")
            self._paused = time.perf_counter()

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if not trainer.sanity_checking:
            self._update(trainer, pl_module, "validate", batch)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self._report(trainer, "validate")
            train = self._counts.get("train")
            if train is not None:  # validation time is not training time
                paused = time.perf_counter() - self._paused
                train.start += paused
                train.last = (train.last[0] + paused, *train.last[1:])

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._start(trainer, "test")

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self._update(trainer, pl_module, "test", batch)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._report(trainer, "test")

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self._start(trainer, "predict")

    def on_predict_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None:
        self._update(trainer, pl_module, "predict", batch)

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self._report(trainer, "predict")


__all__ = ["ThroughputMonitor"]
