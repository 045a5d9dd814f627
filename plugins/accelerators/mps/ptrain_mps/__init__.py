"""The ``mps`` accelerator: the GPU of Apple silicon Macs, through torch's Metal backend.

One device per machine, so one process; batches are copied to it as they come. Device memory
figures (what torch's MPS allocator holds) are logged at the end of every epoch.
"""

from __future__ import annotations

import platform
from typing import Any

import torch

from ptrain import ConfigError, PluginError, hookimpl
from ptrain.data import move_to_device

_GIB = 1024**3


class MPSAccelerator:
    """``--accelerator mps``; ``auto`` prefers it to the CPU on a Mac with Apple silicon."""

    priority = 50

    @staticmethod
    @hookimpl
    def check_available() -> str | None:
        if platform.system() != "Darwin":
            return f"MPS is the GPU of Apple silicon Macs; this is {platform.system()}"
        if not torch.backends.mps.is_built():
            return f"this torch {torch.__version__} was built without MPS: install the macOS wheel"
        if not torch.backends.mps.is_available():
            return "torch has MPS support but sees no MPS device (macOS 12.3+ on Apple silicon)"
        return None

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @hookimpl
    def setup_device(self, trainer) -> torch.device:
        problem = self.check_available()
        if problem is not None:
            raise PluginError(f"--accelerator mps can't run here: {problem}. Use --accelerator "
                              f"cpu, or auto to take the best available.")
        if trainer.world_size > 1 or trainer.devices not in (1, "auto", [0]):
            raise ConfigError(f"a Mac has one MPS device; --devices {trainer.devices} asks for "
                              f"more. Use --devices 1.")
        return torch.device("mps")

    @hookimpl
    def transfer_batch(self, trainer, batch: Any) -> Any:
        return move_to_device(batch, trainer.device)

    @hookimpl
    def on_epoch_end(self, trainer) -> None:
        trainer.hook.log_metrics(
            trainer=trainer, step=trainer.global_step,
            metrics={"mps_memory_allocated_gib": torch.mps.current_allocated_memory() / _GIB,
                     "mps_memory_driver_gib": torch.mps.driver_allocated_memory() / _GIB})
