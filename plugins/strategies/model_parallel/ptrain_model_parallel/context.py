"""Context parallelism: each sequence of a batch split over the processes of the ``cp`` mesh
dimension for one step, with torch's ``context_parallel`` (whose ring attention computes
``scaled_dot_product_attention`` over the whole sequence from the parts)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from ptrain import ConfigError
from ptrain.data import apply_to_tensors

#: the part of torch's message when an attention kernel has no ring attention (the CPU's)
NO_RING_ATTENTION = "_scaled_dot_product"


class SequenceSplit:
    """Splits the sequence tensors of each batch over ``mesh`` (the 1-D ``cp`` mesh) along
    dimension ``dim``, from :meth:`enter` (the batch is on the device) to :meth:`leave` (its
    step is done).

    Every tensor of the batch with more than ``dim`` dimensions is a sequence tensor, of which
    each process keeps its part: the batch :meth:`enter` returns holds copies of those parts
    (torch splits the tensors it is given in place, and the batch's may share memory with the
    dataset's). torch balances the parts for causal attention: process ``i`` of ``n`` holds
    chunks ``i`` and ``2n-1-i`` of ``2n``, so a sequence's length must divide by ``2n``, and a
    model that needs token positions must take them from the batch (they are split alike), not
    count them."""

    def __init__(self, mesh: Any, dim: int, flag: str):
        self.mesh, self.dim, self.flag = mesh, dim, flag
        self._entered: contextlib.ExitStack | None = None

    def enter(self, batch: Any) -> Any:
        """``batch`` with this process's parts of its sequences, and torch's ring attention
        on until :meth:`leave`."""
        from torch.distributed.tensor.experimental import context_parallel

        self.leave()  # a step that failed left it entered
        tensors: list[torch.Tensor] = []
        copies: dict[int, torch.Tensor] = {}  # id of a sequence tensor -> its copy

        def copy_sequence(tensor: torch.Tensor) -> torch.Tensor:
            tensors.append(tensor)
            if tensor.dim() <= self.dim:
                return tensor
            if id(tensor) not in copies:  # a tensor the batch holds twice is copied once
                copies[id(tensor)] = tensor.clone()
            return copies[id(tensor)]

        # the batch walked as the device transfer walks it (tuples, lists, dicts nest)
        split = apply_to_tensors(batch, copy_sequence)
        parts = list(copies.values())
        self._check(tensors, parts)
        stack = contextlib.ExitStack()
        stack.enter_context(context_parallel(  # splits ``parts`` in place
            self.mesh, buffers=parts, buffer_seq_dims=[self.dim] * len(parts),
            no_restore_buffers=set(parts)))
        self._entered = stack
        return split

    def leave(self) -> None:
        if self._entered is not None:
            stack, self._entered = self._entered, None
            stack.close()

    def _check(self, tensors: list[torch.Tensor], sequences: list[torch.Tensor]) -> None:
        """A batch without a sequence tensor, or a length that can't be split in ``2 x`` the
        processes' parts, is a :class:`ptrain.ConfigError`."""
        parts = 2 * self.mesh.size()
        if not sequences:
            shapes = ", ".join(str(tuple(t.shape)) for t in tensors) or "no tensor"
            raise ConfigError(
                f"{self.flag} splits each sequence of a batch along dimension {self.dim}, and "
                f"this batch has no tensor with that many dimensions ({shapes}). Give the "
                f"sequence dimension with {self.flag}-dim.")
        for tensor in sequences:
            if tensor.shape[self.dim] % parts:
                raise ConfigError(
                    f"{self.flag} {self.mesh.size()} splits each sequence into {parts} chunks "
                    f"(two per process, balanced for causal attention), and a batch tensor of "
                    f"shape {tuple(tensor.shape)} has {tensor.shape[self.dim]} along dimension "
                    f"{self.dim}, which does not divide by {parts}. Pad the sequences to a "
                    f"multiple of {parts}, or choose another {self.flag}.")


def no_ring_attention(error: BaseException, flag: str, device: torch.device) -> ConfigError | None:
    """``error`` said as a usage error when it is torch's for an attention kernel that context
    parallel can't split (every kernel of the CPU's); else ``None``."""
    if not isinstance(error, NotImplementedError) or NO_RING_ATTENTION not in str(error):
        return None
    return ConfigError(
        f"{flag} splits attention over the sequence with torch's ring attention, which covers "
        f"the CUDA kernels of scaled_dot_product_attention (flash, memory-efficient, cuDNN), "
        f"and this model's attention ran on the {device.type!r} device (torch: "
        f"{str(error).splitlines()[0]}). Leave {flag} at 1 here, or train on CUDA GPUs.")
