"""Precisions that hold the whole model in one dtype: ``bf16-true``, ``16-true`` and ``64-true``.

The model's floating-point parameters and buffers are cast before the strategy wraps the model
(so the optimizer, built afterwards, keeps its state in the same dtype), and every floating-point
tensor of each batch is cast on its way to the device. Torch's default dtype is the precision's
while the module's layers are made (``configure_model``, ``Trainer.init_module``) and during
each step (``model_step``), so a tensor a module makes without a dtype (``torch.zeros(n)`` in
``forward``, a positional table built on first use) is in it too, as under Lightning; outside
them it is what it was. No autocast, no loss scaling.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ptrain import PrecisionPolicy, hookimpl
from ptrain.data import apply_to_tensors
from ptrain.tuning import precision_candidate


class TruePrecision:
    """Parameters, buffers, inputs and optimizer state all in :attr:`dtype`."""

    dtype: torch.dtype = torch.float32
    #: what a non-finite training loss adds to its message (see PrecisionPolicy)
    non_finite_hint: str = ""

    @hookimpl
    def precision_policy(self) -> PrecisionPolicy:
        return PrecisionPolicy(param_dtype=self.dtype, compute_dtype=self.dtype,
                               reduce_dtype=self.dtype, non_finite_hint=self.non_finite_hint)

    @hookimpl(wrapper=True)
    def wrap_model(self, model: torch.nn.Module):
        model.to(dtype=self.dtype)  # in place, before the strategy wraps or shards it
        return (yield)

    @hookimpl
    def module_init_context(self) -> contextlib.AbstractContextManager:
        return default_dtype(self.dtype)

    @hookimpl(wrapper=True)
    def model_step(self):
        with default_dtype(self.dtype):
            return (yield)

    @hookimpl(wrapper=True)
    def transfer_batch(self, batch: Any):
        moved = yield
        return apply_to_tensors(moved, self._cast)

    def _cast(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.dtype) if tensor.is_floating_point() else tensor


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Torch's default dtype set to ``dtype`` inside, and back to what it was after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class BF16TruePrecision(TruePrecision):
    """``bf16-true``: half the memory of float32 for weights, gradients and optimizer state;
    bfloat16 keeps float32's range, so no loss scaling is needed. ``ptrain tune`` measures it
    (16-true and 64-true it does not: the one risks overflow without loss scaling, the other
    is for numerical checks, never faster)."""

    dtype = torch.bfloat16

    @staticmethod
    @hookimpl
    def tune_candidates(trainer):
        return precision_candidate(trainer, "bf16-true")


class Float16TruePrecision(TruePrecision):
    """``16-true``: float16 everywhere. Its narrow range can overflow or underflow without loss
    scaling: prefer ``bf16-true`` where the hardware has bfloat16."""

    dtype = torch.float16
    non_finite_hint = (
        "Under 16-true, a NaN at the first steps often comes from the optimizer's eps "
        "underflowing in float16: Adam's and AdamW's default eps=1e-8 is 0 there, so a step "
        "divides by zero where a gradient's square underflows to 0. Train with --precision "
        "bf16-true (float32's range), or give the optimizer eps >= 1e-4 (e.g. "
        "torch.optim.AdamW(..., eps=1e-4)).")


class Float64TruePrecision(TruePrecision):
    """``64-true``: double precision, for numerical checks (gradient checks, reference runs)."""

    dtype = torch.float64
