"""The ``cpu`` accelerator: trains on the host's processor. Always available."""

from __future__ import annotations

import os

import torch

from ptrain.data import available_cpus
from ptrain.errors import ConfigError
from ptrain.hookspecs import hookimpl


def _share_the_cores(trainer) -> None:
    """One of several training processes on this machine, without ``OMP_NUM_THREADS`` set:
    each takes its share of the cores for its intra-op threads. Left at torch's default, each
    would take every core, and the processes would contend for them (a 2-process ddp run on 2
    cores took 3 to 12 times as long)."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    processes = int(local) if local else (trainer.devices if trainer.world_size > 1
                                          and isinstance(trainer.devices, int) else 1)
    if processes > 1 and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, available_cpus() // processes))


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
        _share_the_cores(trainer)
        return torch.device("cpu")

    @hookimpl
    def transfer_batch(self, trainer, batch):
        """Batches are used where the DataLoader made them: in host memory, already on the
        device (walking the batch to call ``.to("cpu")`` on each tensor would change nothing)."""
        return batch
