"""Helpers for batches and dataloaders that plugins share (one way to rebuild a loader)."""

from __future__ import annotations

import inspect
import math
import os
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset


def apply_to_tensors(batch: Any, function: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``batch`` with ``function`` applied to every tensor in it (tuples, lists, dicts nest)."""
    if isinstance(batch, torch.Tensor):
        return function(batch)
    if isinstance(batch, (list, tuple)):
        moved = [apply_to_tensors(item, function) for item in batch]
        if hasattr(batch, "_fields"):  # namedtuple
            return type(batch)(*moved)
        return type(batch)(moved)
    if isinstance(batch, dict):
        return type(batch)((key, apply_to_tensors(value, function)) for key, value in batch.items())
    return batch


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """``batch`` with every tensor on ``device``. A batch already on the CPU that trains on the
    CPU is returned as it is, without rebuilding it (a per-step path: a few µs saved)."""
    if device.type == "cpu" and _on_cpu(batch):
        return batch
    return apply_to_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


def _on_cpu(batch: Any) -> bool:
    """Whether every tensor in ``batch`` (tuples, lists and dicts nest) is on the CPU."""
    if isinstance(batch, torch.Tensor):
        return batch.is_cpu
    if isinstance(batch, (list, tuple, dict)):
        for item in batch.values() if isinstance(batch, dict) else batch:
            # a tensor is judged here: a flat batch costs one call
            if not (item.is_cpu if isinstance(item, torch.Tensor) else _on_cpu(item)):
                return False
    return True


_LOADER_ARGS = [
    p for p in inspect.signature(DataLoader.__init__).parameters if p not in ("self", "dataset")
]


def rebuild_dataloader(loader: DataLoader, **changes: Any) -> DataLoader:
    """A new DataLoader like ``loader`` with ``changes`` applied (``sampler=``, ``pin_memory=``,
    ``num_workers=``, ...). The way plugins change a dataloader in ``prepare_dataloader``.

    ``dataset=`` replaces the dataset; the loader's sampler is kept, so the new dataset must
    have the same length and indices (a copy of the old one, e.g. held in memory).

    Replacing the ``sampler`` keeps the batch size and ``drop_last`` of the loader's batch
    sampler; a loader with a custom ``batch_sampler`` can't take a new ``sampler`` (a ValueError
    says so).
    """
    dataset = changes.pop("dataset", loader.dataset)
    kwargs = {name: getattr(loader, name) for name in _LOADER_ARGS if hasattr(loader, name)}
    batch_sampler = kwargs.pop("batch_sampler", None)
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        if "sampler" in changes or "batch_size" in changes:
            raise ValueError(
                f"the dataloader uses a custom batch sampler ({type(batch_sampler).__name__}); "
                f"its sampler and batch size can't be replaced. Give the DataLoader a plain "
                f"sampler, or build the change into your batch sampler."
            )
        kwargs.update(batch_sampler=batch_sampler, batch_size=1, drop_last=False, sampler=None)
    if isinstance(dataset, IterableDataset):  # its loader's sampler is internal and refused
        kwargs["sampler"] = None
    kwargs.update(changes)
    if kwargs.get("num_workers", 0) == 0:  # DataLoader refuses these without workers
        kwargs.update(prefetch_factor=None, persistent_workers=False)
    return DataLoader(dataset, **kwargs)


def loader_batch_size(loader: Any) -> int | None:
    """The number of samples in each of ``loader``'s batches (its last may hold fewer): a
    DataLoader's ``batch_size``, or its batch sampler's; ``None`` when the loader does not say
    (a custom batch sampler without ``batch_size``, a plain iterable)."""
    size = getattr(loader, "batch_size", None)
    if size is None:
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return size if isinstance(size, int) else None


class DataLoaderWarning(UserWarning):
    """A dataloader setting that likely slows training down (issued by the ``dataloading``
    callback at start-up). Silence it with ``-p no:dataloading`` or a warnings filter
    (``-W ignore::ptrain.data.DataLoaderWarning``)."""


def available_cpus() -> int:
    """How many CPU cores this process may run on: the cores in its affinity mask
    (``os.sched_getaffinity``, else ``os.cpu_count()``), capped by a cgroup CPU quota when one is
    set (a container started with ``--cpus``). At least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, quota)
    return max(1, cores)


def _cgroup_cpu_quota() -> int | None:
    """The cgroup's CPU quota in whole cores (rounded up), or ``None`` when there is none."""
    try:  # cgroup v2: "max 100000" or "200000 100000"
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            return max(1, math.ceil(int(quota) / int(period)))
        return None
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        root = Path("/sys/fs/cgroup/cpu")
        quota = int((root / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu.cfs_period_us").read_text())
        return max(1, math.ceil(quota / period)) if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def suggested_num_workers(processes_per_node: int = 1, cpus: int | None = None) -> int:
    """The loader workers one training process can use without oversubscribing the machine:
    its share of the cores (``cpus``, default :func:`available_cpus`, divided by the training
    processes on this machine) minus one core for the process itself. 0 on a machine with one
    core per process."""
    cpus = available_cpus() if cpus is None else cpus
    return max(0, cpus // max(1, processes_per_node) - 1)


def stop_workers(loader: Any) -> None:
    """Shut down the persistent worker processes of ``loader`` (a DataLoader, or a list of
    them, else nothing happens); iterating it again starts new ones. The trainer calls this when a run ends: left
    alive, the workers linger until the loader is garbage-collected, and stopping them from
    inside a reference cycle costs torch its 5 s join timeout per worker."""
    if isinstance(loader, list):  # several evaluation dataloaders
        for each in loader:
            stop_workers(each)
    if isinstance(loader, DataLoader) and loader.persistent_workers:
        # DataLoader keeps its worker iterator in this private attribute and offers no public
        # way to stop it; dropping the last reference shuts the workers down in order
        loader._iterator = None
