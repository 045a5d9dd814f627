"""The ``ddp`` strategy: one process per device, each with a full replica of the model, gradients
averaged across processes by ``torch.nn.parallel.DistributedDataParallel``.

Launching, ranks, the process group, data sharding, metric reduction and barriers come from
:class:`ptrain.distributed.ProcessGroupStrategy`; this class adds the DDP wrapper and skips the
gradient all-reduce inside accumulation windows.

A module that optimizes manually runs its backward passes inside DDP's forward, where DDP cannot
see them coming. Its forward therefore runs with DDP's synchronisation off, and each backward
through the ``backward`` hook arms DDP's reducer itself when ``trainer.sync_gradients`` says so:
one bucketed all-reduce per synchronised backward, none otherwise. Such a module's backward
passes usually leave some parameters without gradients (those of the other optimizers), so
``find_unused_parameters`` defaults to on for it.
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from ptrain import hookimpl
from ptrain.distributed import ProcessGroupStrategy
from ptrain.meta_init import materialize
from ptrain.options import to_bool


class DDPStrategy(ProcessGroupStrategy):
    """``--strategy ddp``."""

    no_checkpoint_on_each_node = None  # every process holds the whole state

    def __init__(self, find_unused_parameters: bool | None = None,
                 gradient_as_bucket_view: bool = True, **process_group_options):
        super().__init__(**process_group_options)
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("find_unused_parameters", to_bool, default=None,
                    help="allow steps in which some parameters get no gradient (costs a graph "
                         "walk per backward). Default: on for a module that optimizes "
                         "manually, off otherwise")
        options.add("gradient_as_bucket_view", to_bool, default=True,
                    help="gradients are views into DDP's communication buckets (saves one "
                         "gradient-sized copy of memory)")
        ProcessGroupStrategy.add_process_group_options(options)

    def ddp_kwargs(self, trainer) -> dict:
        device = trainer.device
        find_unused = self.find_unused_parameters
        if find_unused is None:
            find_unused = not trainer.module.automatic_optimization
        return {"device_ids": [device] if device.type != "cpu" else None,
                "find_unused_parameters": find_unused,
                "gradient_as_bucket_view": self.gradient_as_bucket_view}

    @hookimpl
    def wrap_model(self, trainer, model: torch.nn.Module) -> torch.nn.Module:
        materialize(model, trainer.device)  # layers made on the meta device (init_module)
        model = model.to(trainer.device)
        if not any(p.requires_grad for p in model.parameters()):
            return model  # nothing to synchronise (e.g. validate-only on a frozen model)
        return DistributedDataParallel(model, **self.ddp_kwargs(trainer))

    @hookimpl(wrapper=True)
    def model_step(self, trainer, stage):
        model = trainer.model
        if stage != "train" or not isinstance(model, DistributedDataParallel):
            return (yield)
        if not trainer.module.automatic_optimization:
            # Left on, DDP would arm its reducer after this forward for a backward that never
            # comes, and the next unsynchronised backward would all-reduce. `backward` arms it.
            with model.no_sync():
                result = yield
            model.require_forward_param_sync = True  # broadcast buffers before the next forward
            return result
        # Inside an accumulation window the gradients stay local; the window's last batch
        # all-reduces the accumulated sum once. DDP decides in forward, so forward is wrapped.
        if trainer.sync_gradients:
            return (yield)
        with model.no_sync():
            return (yield)

    # tryfirst and no result, rather than a wrapper: it runs before whichever plugin does the
    # backward, and the per-step hook keeps its direct call (no pluggy wrapper machinery)
    @hookimpl(tryfirst=True)
    def backward(self, trainer, loss) -> None:
        model = trainer.model
        if (trainer.sync_gradients and not trainer.module.automatic_optimization
                and isinstance(model, DistributedDataParallel)):
            # what DDP's forward does for an automatic step, done for this one backward: the
            # graph from `loss` tells the reducer which parameters will get no gradient
            model.reducer.prepare_for_backward([loss] if model.find_unused_parameters else [])
