"""The ``cpu`` accelerator: trains on the host's processor. Always available."""

from __future__ import annotations

import torch

from ptrain.errors import ConfigError
from ptrain.hookspecs import hookimpl


class CPUAccelerator:
    """Selected with ``--accelerator cpu``; ``auto`` falls back to it (lowest priority)."""

    priority = 0
    process_group_backend = "gloo"  # what multi-process strategies use on this device

    @staticmethod
    @hookimpl
    def check_available() -> None:
        return None

    @hookimpl
    def setup_device(self, trainer) -> torch.device:
        if isinstance(trainer.devices, list):  # as Lightning: the CPU has no device indices
            raise ConfigError(
                f"--devices {trainer.devices} names device indices, which the CPU does not have; "
                f"give a count of processes (--devices {len(trainer.devices)}), or a GPU "
                f"accelerator for indices.")
        return torch.device("cpu")

    @hookimpl
    def transfer_batch(self, trainer, batch):
        """Batches are used where the DataLoader made them: in host memory, already on the
        device (walking the batch to call ``.to("cpu")`` on each tensor would change nothing)."""
        return batch
