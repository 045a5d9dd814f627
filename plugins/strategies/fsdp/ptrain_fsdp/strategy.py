"""FSDPStrategy: how the model is sharded, and how its checkpoints are written and read."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy,
                                    fully_shard)

from ptrain import ConfigError, hookimpl
from ptrain.config import positive
from ptrain.distributed import ProcessGroupStrategy
from ptrain.meta_init import has_meta_tensors, materialize
from ptrain.options import to_bool, to_int, to_str_list
from ptrain_fsdp import checkpoint as sharded
from ptrain_fsdp.modules import modules_to_shard


def _replicas(value: Any) -> int | str:
    """``--fsdp-replicate``: a count >= 1, or ``"nodes"`` (one replica per node)."""
    if isinstance(value, str) and value.strip().lower() == "nodes":
        return "nodes"
    try:
        return positive(to_int)(value)
    except ValueError as exc:
        raise ValueError(f"{exc}; or nodes, for one replica per node") from None


#: the passes whose forwards no backward follows (see FSDPStrategy.on_epoch_metrics)
EVALUATION_STAGES = ("validate", "test", "predict")


class FSDPStrategy(ProcessGroupStrategy):
    """``--strategy fsdp``: FSDP2 sharding of parameters, gradients and optimizer state."""

    #: Whether a module's gathered parameters are freed after its forward (ZeRO-3) or kept until
    #: its backward is done (ZeRO-2: less communication, more memory); ``None``: the option.
    fixed_reshard_after_forward: bool | None = None

    def __init__(self, wrap_classes: list[str] | None = None, reshard_after_forward: bool = True,
                 cpu_offload: bool = False, empty_init: bool = True, replicate: int | str = 1,
                 **process_group_options):
        super().__init__(**process_group_options)
        self.empty_init = empty_init
        self.replicate = replicate
        self._mesh: Any = None  # the DeviceMesh laid out for _mesh_key (device type, shape)
        self._mesh_key: tuple | None = None
        self.wrap_classes = list(wrap_classes or ["auto"])
        self.reshard_after_forward = (reshard_after_forward
                                      if self.fixed_reshard_after_forward is None
                                      else self.fixed_reshard_after_forward)
        self.cpu_offload = cpu_offload
        self._writer_group: Any = None  # the background writer's collectives go over it

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
    def add_reshard_option(options) -> None:
        options.add("reshard_after_forward", to_bool, default=True,
                    help="free gathered parameters after each module's forward (ZeRO-3); off: "
                         "keep them until its backward (ZeRO-2, less communication)")

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        FSDPStrategy.add_reshard_option(options)
        options.add("replicate", _replicas, default=1,
                    help="hybrid sharding: N groups of processes each hold a whole sharded "
                         "copy, and gradients are averaged across the groups; nodes: one "
                         "copy per node (shard within a node, replicate across nodes); 1: "
                         "every process holds a shard of the one copy")
        FSDPStrategy.add_sharding_options(options)

    # -- the processes' mesh ---------------------------------------------------------------------

    def mesh_shape(self, trainer) -> dict[str, int]:
        """The sizes of the named dimensions of the job's mesh, outermost first; their product
        is the world size. Here ``dp_replicate`` x ``dp_shard``."""
        replicate = trainer.num_nodes if self.replicate == "nodes" else self.replicate
        if trainer.world_size % replicate:
            raise ConfigError(
                f"--{trainer.options['strategy']}-replicate {replicate} does not divide the "
                f"{trainer.world_size} processes of this job into equal groups; give a divisor "
                f"of {trainer.world_size}, or nodes (one copy per node).")
        return {"dp_replicate": replicate, "dp_shard": trainer.world_size // replicate}

    def data_parallel_mesh(self, mesh):
        """The dimensions of ``mesh`` that FSDP shards and replicates over: a 2-D mesh makes
        it hybrid (replicate x shard), a 1-D one plain."""
        return mesh["dp_replicate", "dp_shard"] if mesh["dp_replicate"].size() > 1 \
            else mesh["dp_shard"]

    @hookimpl
    def on_stage_start(self, trainer, stage: str) -> None:
        """Lays out the job's mesh as ``self._mesh``, which the strategy works on, and shows
        it to the module as ``trainer.device_mesh`` (a subclass may show another view)."""
        # laid out before the module's configure_model, which may apply a plan on it; once per
        # shape (each layout creates process groups, a collective of every rank)
        shape = self.mesh_shape(trainer)
        key = (trainer.device.type, tuple(shape.items()))
        if self._mesh_key != key:
            self._mesh = init_device_mesh(trainer.device.type, tuple(shape.values()),
                                          mesh_dim_names=tuple(shape))
            self._mesh_key = key
        trainer.device_mesh = self._mesh

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
        mesh = self.data_parallel_mesh(self._mesh)
        settings: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": self.reshard_after_forward}
        if policy.is_mixed:  # the precision plugin's formats, applied by FSDP itself
            settings["mp_policy"] = MixedPrecisionPolicy(param_dtype=policy.compute_dtype,
                                                         reduce_dtype=policy.reduce_dtype)
        if self.cpu_offload:
            settings["offload_policy"] = CPUOffloadPolicy(pin_memory=trainer.device.type == "cuda")
        if not has_meta_tensors(model):
            # built whole on every rank: rank 0's values, as DDP does (unseeded ranks differ)
            self.share_rank_zero_values(trainer, model)
        # fully_shard moves each unit to the mesh's device as it shards it: no rank's device
        # holds more than one unit whole
        for module in modules_to_shard(model, self.wrap_classes):
            fully_shard(module, **settings)
        fully_shard(model, **settings)  # the root: everything not in a unit above
        materialize(model, torch.device("cpu") if self.cpu_offload else trainer.device)
        return model

    @hookimpl(trylast=True)
    def on_epoch_metrics(self, trainer, stage: str) -> None:
        """Without resharding after forward (``zero2``, ``--no-fsdp-reshard-after-forward``) the
        backward reshards what a forward gathered, and an evaluation pass has none: once its
        batches and epoch-end hooks are done (last of this hook, before ``on_validation_end``,
        where a checkpoint may be saved), its gathered parameters are resharded, so that the
        module's parameters are the shards again (what checkpoints, the state check and the
        next optimizer step see; under fp8-mixed's float8 all-gather the gathered ones are
        float8 tensors) and the gathered copies' memory is freed."""
        if stage in EVALUATION_STAGES and not self.reshard_after_forward and trainer.model:
            for module in trainer.model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()

    def share_rank_zero_values(self, trainer, model: nn.Module) -> None:
        """Every parameter and buffer of ``model``, built whole on every rank, set to rank
        0's value, one :meth:`share_rank_zero_value` each."""
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                self.share_rank_zero_value(trainer, tensor)

    def share_rank_zero_value(self, trainer, tensor: torch.Tensor) -> None:
        """``tensor`` set to rank 0's value of it."""
        broadcast_into(tensor.data, trainer.device, src=0)

    # -- checkpoints ---------------------------------------------------------------------------

    @hookimpl
    def save_checkpoint(self, trainer, checkpoint: dict[str, Any], path: str) -> bool:
        sharded.save(trainer, checkpoint, path)
        return True

    @hookimpl
    def save_checkpoint_in_background(self, trainer, checkpoint: dict[str, Any],
                                      path: str) -> list[Callable[[], None]]:
        if self._writer_group is None:  # once per job, at a save every rank makes
            self._writer_group = dist.new_group(backend="gloo")
        return [sharded.save_in_background(trainer, checkpoint, path, self._writer_group)]

    @hookimpl
    def load_checkpoint(self, trainer, path: str) -> dict[str, Any]:
        return sharded.load(trainer, path)

    @hookimpl
    def verify_checkpoint(self, path: str) -> bool | None:
        if Path(path).is_file():  # a single-file checkpoint: fsdp resumes from its own folders
            return False
        return sharded.verify(path)


def broadcast_into(tensor: torch.Tensor, device: torch.device, src: int,
                   group: dist.ProcessGroup | None = None) -> None:
    """``tensor`` set in place to global rank ``src``'s value of it, sent over ``group``
    through ``device``, where the process group's backend can reach it."""
    on_device = tensor.to(device)
    dist.broadcast(on_device, src=src, group=group)
    if on_device is not tensor:
        tensor.copy_(on_device)
