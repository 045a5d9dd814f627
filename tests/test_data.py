"""ptrain.data: the one way plugins move batches and rebuild dataloaders."""

from collections import namedtuple

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler, \
    TensorDataset

from ptrain.data import apply_to_tensors, rebuild_dataloader

DATA = TensorDataset(torch.arange(10.0))


def test_rebuild_keeps_what_is_not_changed():
    loader = DataLoader(DATA, batch_size=3, shuffle=True, drop_last=True)
    rebuilt = rebuild_dataloader(loader, batch_size=2)
    assert (rebuilt.batch_size, rebuilt.drop_last, len(rebuilt)) == (2, True, 5)
    assert rebuilt.sampler is loader.sampler  # the same shuffling (and generator)


def test_rebuild_turning_workers_off_drops_worker_only_settings():
    loader = DataLoader(DATA, batch_size=4, num_workers=2, persistent_workers=True)
    rebuilt = rebuild_dataloader(loader, num_workers=0)
    assert rebuilt.num_workers == 0 and not rebuilt.persistent_workers
    assert [b[0].tolist() for b in rebuilt] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_rebuild_with_a_custom_batch_sampler():
    class EveryFive(BatchSampler):
        pass

    loader = DataLoader(DATA, batch_sampler=EveryFive(SequentialSampler(DATA), 5, False))
    assert [len(b[0]) for b in rebuild_dataloader(loader, pin_memory=False)] == [5, 5]
    with pytest.raises(ValueError, match="custom batch sampler"):
        rebuild_dataloader(loader, sampler=SequentialSampler(DATA))


def test_apply_to_tensors_keeps_structure():
    Pair = namedtuple("Pair", "x y")
    batch = {"a": [torch.ones(1), (torch.zeros(1), "text")], "b": Pair(torch.ones(2), 3)}
    doubled = apply_to_tensors(batch, lambda t: t * 2)
    assert isinstance(doubled["b"], Pair) and doubled["b"].y == 3
    assert doubled["a"][0].item() == 2 and doubled["a"][1][1] == "text"
    assert torch.equal(doubled["b"].x, torch.full((2,), 2.0))


def test_rebuild_dataloader_keeps_an_iterable_dataset_loader():
    """Its loader's sampler is DataLoader's internal one, which DataLoader refuses to be given."""
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.arange(10))

    rebuilt = rebuild_dataloader(DataLoader(Stream(), batch_size=4), batch_size=5)
    assert [b.tolist() for b in rebuilt] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
