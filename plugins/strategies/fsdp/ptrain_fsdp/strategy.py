"""FSDPStrategy: how the model is sharded, and how its checkpoints are written and read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from ptrain import ConfigError, hookimpl
from ptrain.distributed import ProcessGroupStrategy
from ptrain.meta_init import has_meta_tensors, materialize
from ptrain.options import to_bool, to_str_list
from ptrain_fsdp import checkpoint as sharded
from ptrain_fsdp.modules import modules_to_shard


class FSDPStrategy(ProcessGroupStrategy):
    """``--strategy fsdp``: FSDP2 sharding of parameters, gradients and optimizer state."""

    #: Whether a module's gathered parameters are freed after its forward (ZeRO-3) or kept until
    #: its backward is done (ZeRO-2: less communication, more memory); ``None``: the option.
    fixed_reshard_after_forward: bool | None = None

    def __init__(self, wrap_classes: list[str] | None = None, reshard_after_forward: bool = True,
                 cpu_offload: bool = False, empty_init: bool = True, **process_group_options):
        super().__init__(**process_group_options)
        self.empty_init = empty_init
        self.wrap_classes = list(wrap_classes or ["auto"])
        self.reshard_after_forward = (reshard_after_forward
                                      if self.fixed_reshard_after_forward is None
                                      else self.fixed_reshard_after_forward)
        self.cpu_offload = cpu_offload

    @staticmethod
    def add_sharding_options(options) -> None:
        options.add("wrap_classes", to_str_list, default=["auto"],
                    help="module classes (names) to shard as units, e.g. TransformerBlock; "
                         "auto: the classes repeated in the model's nn.ModuleLists")
        options.add("empty_init", to_bool, default=True,
                    help="create the layers of the module's configure_model (and of "
                         "Trainer.init_module blocks) on the meta device, so that each rank "
                         "allocates only its shards; off: built whole on every rank, then "
                         "sharded")
        options.add("cpu_offload", to_bool, default=False,
                    help="keep parameter shards, gradients and optimizer state in host memory "
                         "(slower steps; for models that do not fit otherwise)")
        ProcessGroupStrategy.add_process_group_options(options)

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("reshard_after_forward", to_bool, default=True,
                    help="free gathered parameters after each module's forward (ZeRO-3); off: "
                         "keep them until its backward (ZeRO-2, less communication)")
        FSDPStrategy.add_sharding_options(options)

    # -- model ---------------------------------------------------------------------------------

    @hookimpl
    def module_init_context(self, empty_init: bool | None) -> Any:
        wanted = self.empty_init if empty_init is None else empty_init
        return torch.device("meta") if wanted else None

    @hookimpl
    def wrap_model(self, trainer, model: nn.Module) -> nn.Module:
        policy = trainer.precision_policy
        name = trainer.options["strategy"]
        if policy.loss_scaling:
            raise ConfigError(
                f"--precision {trainer.options['precision']} scales the loss, and its overflow "
                f"check would see only this rank's shard of the gradients under {name}; use "
                f"--precision bf16-mixed (no loss scaling), or --strategy ddp for float16.")
        if not trainer.module.automatic_optimization:
            # FSDP2 reduce-scatters the gradients from hooks that its forward registers on the
            # outputs; a backward run inside that forward (manual optimization) never reaches
            # them, and the sharded parameters would get no gradient at all.
            raise ConfigError(
                f"{type(trainer.module).__name__} optimizes manually, which {name} does not "
                f"support: FSDP finalizes gradients after the model's forward, and a manual "
                f"backward runs inside it. Use --strategy ddp or zero1 (optimizer state "
                f"sharded), or automatic optimization.")
        # FSDP keeps its all-gather buffers from one forward to the next: gathered under
        # inference mode (an evaluation pass) they'd be inference tensors, which the next
        # training forward can't write into. Evaluation runs under no_grad instead, as
        # Lightning's FSDP does (the inference_mode option's documented exception).
        trainer.inference_mode = False
        mesh = init_device_mesh(trainer.device.type, (trainer.world_size,))
        settings: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": self.reshard_after_forward}
        if policy.is_mixed:  # the precision plugin's formats, applied by FSDP itself
            settings["mp_policy"] = MixedPrecisionPolicy(param_dtype=policy.compute_dtype,
                                                         reduce_dtype=policy.reduce_dtype)
        if self.cpu_offload:
            settings["offload_policy"] = CPUOffloadPolicy(pin_memory=trainer.device.type == "cuda")
        if not has_meta_tensors(model):
            # built whole on every rank: rank 0's values, as DDP does (unseeded ranks differ)
            _broadcast_from_rank_zero(model, trainer.device)
        # fully_shard moves each unit to the mesh's device as it shards it: no rank's device
        # holds more than one unit whole
        for module in modules_to_shard(model, self.wrap_classes):
            fully_shard(module, **settings)
        fully_shard(model, **settings)  # the root: everything not in a unit above
        materialize(model, torch.device("cpu") if self.cpu_offload else trainer.device)
        return model

    # -- checkpoints ---------------------------------------------------------------------------

    @hookimpl
    def save_checkpoint(self, trainer, checkpoint: dict[str, Any], path: str) -> bool:
        sharded.save(trainer, checkpoint, path)
        return True

    @hookimpl
    def load_checkpoint(self, trainer, path: str) -> dict[str, Any]:
        return sharded.load(trainer, path)

    @hookimpl
    def verify_checkpoint(self, path: str) -> bool | None:
        if Path(path).is_file():  # a single-file checkpoint: fsdp resumes from its own folders
            return False
        return sharded.verify(path)


def _broadcast_from_rank_zero(model: nn.Module, device: torch.device) -> None:
    """Every parameter and buffer of ``model`` set to rank 0's value (through ``device``, where
    the process group's backend can reach it)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            on_device = tensor.data.to(device)
            dist.broadcast(on_device, src=0)
            if on_device is not tensor.data:
                tensor.data.copy_(on_device)
