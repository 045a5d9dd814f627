"""DeepSpeed-style ZeRO stages on torch's own parts, so no other engine is needed.

- ``zero1``: DDP, with the optimizer state sharded by ``torch.distributed.optim.
  ZeroRedundancyOptimizer``: each rank keeps the state of, and updates, about 1/N of the
  parameters, then the updated parameters are broadcast. Gradients and parameters are whole on
  every rank.
- ``zero2``: FSDP2 with ``reshard_after_forward=False``: optimizer state and gradients sharded
  (gradients are reduce-scattered), and each unit's parameters, gathered for its forward, stay
  gathered until its backward is done, so the backward needs no second all-gather. Between
  steps the parameters are sharded too.
- ``zero3``: FSDP2 with ``reshard_after_forward=True``: parameters are freed after each unit's
  forward and gathered again in backward; the least memory, the most communication.

zero2 and zero3 take the ``fsdp`` strategy's options (units to shard, CPU offload, activation
checkpointing) and write the same sharded checkpoints; zero1 takes ``ddp``'s and writes single
files (the optimizer state is gathered on rank 0 for it).
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

from ptrain import hookimpl
from ptrain_ddp import DDPStrategy
from ptrain_fsdp import FSDPStrategy


class _GatheringZeroRedundancyOptimizer(ZeroRedundancyOptimizer):
    """``state_dict()`` gathers the whole state on rank 0 first (a collective: every rank calls
    it, as every rank takes part in writing a checkpoint). Rank 0 gets the whole state, in the
    format of the optimizer it replaced, so zero1 and ddp checkpoints are interchangeable; the
    other ranks get an empty dict, since only rank 0 writes."""

    def state_dict(self):
        self.consolidate_state_dict(to=0)
        return super().state_dict() if dist.get_rank() == 0 else {}


class ZeRO1Strategy(DDPStrategy):
    """``--strategy zero1``: DDP with the optimizer state sharded across ranks."""

    no_checkpoint_on_each_node = "it gathers the whole optimizer state on global rank 0 only"

    @hookimpl
    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        groups = [dict(group) for group in optimizer.param_groups]
        # defaults may hold keys the constructor does not take (AdamW's decoupled_weight_decay)
        accepted = inspect.signature(type(optimizer).__init__).parameters
        defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
        return _GatheringZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer),
                                                 **defaults)


class ZeRO2Strategy(FSDPStrategy):
    """``--strategy zero2``: optimizer state and gradients sharded (FSDP2, parameters kept
    gathered from each unit's forward to its backward)."""

    fixed_reshard_after_forward = False

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        FSDPStrategy.add_sharding_options(options)


class ZeRO3Strategy(FSDPStrategy):
    """``--strategy zero3``: optimizer state, gradients and parameters sharded (FSDP2)."""

    fixed_reshard_after_forward = True

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        FSDPStrategy.add_sharding_options(options)
