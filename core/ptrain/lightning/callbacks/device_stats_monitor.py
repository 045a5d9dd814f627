"""``lightning.pytorch.callbacks.device_stats_monitor``: ``DeviceStatsMonitor``, the device's
statistics sent to the loggers during training and evaluation."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from ptrain.errors import ConfigError
from ptrain.hook_methods import Callback


def cpu_stats() -> dict[str, float]:
    """The machine's memory, CPU and swap use in percent (``psutil``), under Lightning's
    names."""
    import psutil

    return {"cpu_vm_percent": psutil.virtual_memory().percent,
            "cpu_percent": psutil.cpu_percent(),
            "cpu_swap_percent": psutil.swap_memory().percent}


def device_stats(device: torch.device) -> dict[str, float]:
    """What Lightning's accelerator reports for ``device``: CUDA's allocator statistics
    (``torch.cuda.memory_stats``), or on the CPU :func:`cpu_stats`."""
    if device.type == "cuda":
        return {k: float(v) for k, v in torch.cuda.memory_stats(device).items()}
    if device.type == "cpu":
        return cpu_stats()
    raise ConfigError(f"DeviceStatsMonitor has no statistics for a {device.type!r} device in "
                      f"ptrain; log what you need from a Callback with self.log.")


class DeviceStatsMonitor(Callback):
    """Lightning's ``DeviceStatsMonitor``: at the start and end of each training, validation
    and test batch that falls on a logging step (every ``log_every_n_steps``), the device's
    statistics go to the run's loggers as ``DeviceStatsMonitor.on_train_batch_start/<name>``
    (and so on), at the current step. ``cpu_stats``: ``None`` logs the CPU's when training on
    the CPU (``psutil`` needed, as in Lightning), ``True`` adds them to a GPU's, ``False`` logs
    nothing on the CPU. Without a logger it is refused, as in Lightning. The statistics are
    read on the host (no device sync); the loggers write rank 0's."""

    def __init__(self, cpu_stats: bool | None = None) -> None:
        self._cpu_stats = cpu_stats

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        if not trainer.loggers:
            raise ConfigError("DeviceStatsMonitor sends the statistics to the loggers, and this "
                              "run has none (logger=False); give it a logger or leave the "
                              "callback out.")
        if self._cpu_stats is not False and (trainer.device.type == "cpu" or self._cpu_stats) \
                and importlib.util.find_spec("psutil") is None:
            raise ConfigError("DeviceStatsMonitor reads the CPU's statistics with psutil, which "
                              "is not installed: pip install psutil, or pass cpu_stats=False.")

    def _log(self, trainer: Any, key: str, after_step: bool) -> None:
        steps = trainer.global_step + (0 if after_step else 1)
        if steps % trainer.log_every_n_steps != 0 or not trainer.loggers:
            return
        device = trainer.device
        if self._cpu_stats is False and device.type == "cpu":
            return
        stats = device_stats(device)
        if self._cpu_stats and device.type != "cpu":
            stats.update(cpu_stats())
        prefix = f"{type(self).__qualname__}.{key}/"
        trainer.hook.log_metrics(trainer=trainer, metrics={prefix + k: v for k, v in
                                                           stats.items()},
                                 step=trainer.global_step)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        self._log(trainer, "on_train_batch_start", after_step=False)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._log(trainer, "on_train_batch_end", after_step=True)

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        self._log(trainer, "on_validation_batch_start", after_step=True)

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        self._log(trainer, "on_validation_batch_end", after_step=True)

    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        self._log(trainer, "on_test_batch_start", after_step=True)

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self._log(trainer, "on_test_batch_end", after_step=True)


__all__ = ["DeviceStatsMonitor"]
