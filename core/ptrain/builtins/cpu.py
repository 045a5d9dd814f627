"""The ``cpu`` accelerator: trains on the host's processor. Always available."""

from __future__ import annotations

import torch

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
    def setup_device(self) -> torch.device:
        return torch.device("cpu")

    @hookimpl
    def transfer_batch(self, trainer, batch):
        """Batches are used where the DataLoader made them: in host memory, already on the
        device (walking the batch to call ``.to("cpu")`` on each tensor would change nothing)."""
        return batch
