"""``LiveStorages``: exact accounting of the memory operators create, for testing and measuring
plugins that trade compute for memory (activation checkpointing, offloading)."""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveStorages(TorchDispatchMode):
    """A dispatch mode that records each tensor storage an operator creates while it is on.

    ``live()`` is the bytes of those storages still alive (after a forward pass under the mode:
    what autograd keeps for backward, the output included). With ``poll=True``, ``peak`` is the
    most bytes seen alive at once after any operator (slower: a sum per operator). Parameters,
    inputs and storages created before the mode are not counted; the count is device-agnostic.
    """

    def __init__(self, poll: bool = False):
        super().__init__()
        self.poll, self.peak = poll, 0
        self.storages: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                key = s.data_ptr()
                if key not in self.storages or self.storages[key][0].expired():
                    self.storages[key] = (StorageWeakRef(s), s.nbytes())
        if self.poll:
            self.peak = max(self.peak, self.live())
        return out

    def live(self) -> int:
        """Bytes of the recorded storages that are still alive."""
        return sum(n for ref, n in self.storages.values() if not ref.expired())
