"""The ``ddp`` strategy: one process per device, each with a full replica of the model, gradients
averaged across processes by ``torch.nn.parallel.DistributedDataParallel``.

Launching, ranks, the process group, data sharding, metric reduction and barriers come from
:class:`ptrain.distributed.ProcessGroupStrategy`; this class adds the DDP wrapper and skips the
gradient all-reduce inside accumulation windows.
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from ptrain import hookimpl
from ptrain.distributed import ProcessGroupStrategy
from ptrain.options import to_bool


class DDPStrategy(ProcessGroupStrategy):
    """``--strategy ddp``."""

    def __init__(self, find_unused_parameters: bool = False, gradient_as_bucket_view: bool = True,
                 **process_group_options):
        super().__init__(**process_group_options)
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("find_unused_parameters", to_bool, default=False,
                    help="allow steps in which some parameters get no gradient (costs a graph "
                         "walk per step; turn on only when DDP says it is needed)")
        options.add("gradient_as_bucket_view", to_bool, default=True,
                    help="gradients are views into DDP's communication buckets (saves one "
                         "gradient-sized copy of memory)")
        ProcessGroupStrategy.add_process_group_options(options)

    def ddp_kwargs(self, trainer) -> dict:
        device = trainer.device
        return {"device_ids": [device] if device.type != "cpu" else None,
                "find_unused_parameters": self.find_unused_parameters,
                "gradient_as_bucket_view": self.gradient_as_bucket_view}

    @hookimpl
    def wrap_model(self, trainer, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(trainer.device)
        if not any(p.requires_grad for p in model.parameters()):
            return model  # nothing to synchronise (e.g. validate-only on a frozen model)
        return DistributedDataParallel(model, **self.ddp_kwargs(trainer))

    @hookimpl(wrapper=True)
    def model_step(self, trainer, stage):
        # Inside an accumulation window the gradients stay local; the window's last batch
        # all-reduces the accumulated sum once. DDP decides in forward, so only forward is wrapped.
        if stage != "train" or trainer.sync_gradients or not isinstance(
                trainer.model, DistributedDataParallel):
            return (yield)
        with trainer.model.no_sync():
            return (yield)
