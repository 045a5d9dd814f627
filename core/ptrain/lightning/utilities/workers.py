"""``suggested_max_num_workers``: how many DataLoader workers a training process can use."""

from __future__ import annotations

from ptrain.data import available_cpus


def suggested_max_num_workers(local_world_size: int) -> int:
    """An upper bound for ``DataLoader(num_workers=...)``: this machine's cores shared among its
    ``local_world_size`` training processes, one core left to each process itself, at least 1.
    The cores are those this process may run on, within a container's CPU quota where one is
    set (``ptrain.data.available_cpus``; Lightning counts the affinity mask only)."""
    if local_world_size < 1:
        raise ValueError(f"`local_world_size` should be >= 1, got {local_world_size}.")
    return max(1, available_cpus() // local_world_size - 1)
