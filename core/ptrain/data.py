"""Helpers for batches and dataloaders that plugins share (one way to rebuild a loader)."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch.utils.data import BatchSampler, DataLoader


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
    return apply_to_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


_LOADER_ARGS = [
    p for p in inspect.signature(DataLoader.__init__).parameters if p not in ("self", "dataset")
]


def rebuild_dataloader(loader: DataLoader, **changes: Any) -> DataLoader:
    """A new DataLoader like ``loader`` with ``changes`` applied (``sampler=``, ``pin_memory=``,
    ``num_workers=``, ...). The way plugins change a dataloader in ``prepare_dataloader``.

    Replacing the ``sampler`` keeps the batch size and ``drop_last`` of the loader's batch
    sampler; a loader with a custom ``batch_sampler`` can't take a new ``sampler`` (a ValueError
    says so).
    """
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
    kwargs.update(changes)
    if kwargs.get("num_workers", 0) == 0:  # DataLoader refuses these without workers
        kwargs.update(prefetch_factor=None, persistent_workers=False)
    return DataLoader(loader.dataset, **kwargs)
