"""ModelParallelStrategy: the job's processes as a named mesh, the module's tensor-parallel plan
on it, and FSDP2 over its data-parallel dimensions."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from ptrain import ConfigError, hookimpl
from ptrain.config import positive
from ptrain.meta_init import materialize
from ptrain.options import to_bool, to_int
from ptrain_fsdp import FSDPStrategy
from ptrain_fsdp.strategy import broadcast_into

#: the mesh's dimensions, outermost first: processes that differ in an outer one sit on other
#: nodes first (``auto`` keeps the tensor dimension inside a node, where links are fastest)
DIMENSIONS = ("dp_replicate", "dp_shard", "tp")
#: ``mesh_names`` -> the dimensions of the module's ``self.device_mesh``: ptrain's own mesh,
#: or the 2-D view Lightning's ModelParallelStrategy gives (``data_parallel`` is
#: ``dp_replicate x dp_shard`` flattened, ``tensor_parallel`` is ``tp``)
MODULE_MESHES = {"ptrain": DIMENSIONS, "lightning": ("data_parallel", "tensor_parallel")}


def _size_or_auto(value: Any) -> int | str:
    """``"auto"`` or a count >= 1."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return positive(to_int)(value)


class ModelParallelStrategy(FSDPStrategy):
    """``--strategy model-parallel``: tensor parallelism (the module's plan) x FSDP2.

    The processes form a mesh of three named dimensions, ``dp_replicate x dp_shard x tp``,
    laid out before the module's ``configure_model``, which sees it as ``self.device_mesh``
    and applies its tensor-parallel plan on ``self.device_mesh["tp"]`` with torch's
    ``parallelize_module``. The strategy then shards the model with FSDP2 over the
    data-parallel dimensions (hybrid when ``dp_replicate`` > 1), unless ``configure_model``
    already did. Processes of one tensor-parallel group read the same batches; metrics are
    averaged over the data-parallel replicas. With ``mesh_names="lightning"`` the module sees
    a 2-D view of the same mesh, ``data_parallel x tensor_parallel``, as under Lightning's
    ``ModelParallelStrategy``; the strategy itself always works on its own mesh, ``_mesh``.
    """

    def __init__(self, replicate: int = 1, shard: int | str = "auto", tensor: int | str = "auto",
                 loss_parallel: bool = False, mesh_names: str = "ptrain", **fsdp_options):
        super().__init__(replicate=replicate, **fsdp_options)
        self.shard = shard
        self.tensor = tensor
        self.loss_parallel = loss_parallel
        self.mesh_names = mesh_names
        self._data_group: tuple[Any, Any] | None = None  # (mesh, its data-parallel group)
        self._in_loss_parallel: Any = None  # the entered loss_parallel() context, in a stage
        self._lightning_view: tuple[Any, Any] | None = None  # (mesh, its 2-D view)

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("replicate", positive(to_int), default=1,
                    help="data-parallel replicas, each a whole sharded copy of the model "
                         "(hybrid sharding: the number of nodes, to shard within a node)")
        options.add("shard", _size_or_auto, default="auto",
                    help="processes each copy is sharded over by FSDP; auto: what replicate "
                         "and tensor leave")
        options.add("tensor", _size_or_auto, default="auto",
                    help="processes each layer's tensors are split over by the module's "
                         "tensor-parallel plan (self.device_mesh['tp']); auto: the processes of "
                         "one node (--devices)")
        options.add("loss_parallel", to_bool, default=False,
                    help="compute the loss and its backward inside torch's loss_parallel(), "
                         "for a model whose output layer leaves its logits sharded over the "
                         "tensor dimension (ColwiseParallel(use_local_output=False))")
        options.add("mesh_names", str, default="ptrain", choices=sorted(MODULE_MESHES),
                    help="the dimensions of the module's self.device_mesh: ptrain "
                         "(dp_replicate, dp_shard, tp) or lightning (data_parallel, "
                         "tensor_parallel, as Lightning's ModelParallelStrategy names them: a "
                         "view of the same mesh; ptrain.lightning's ModelParallelStrategy "
                         "sets it)")
        FSDPStrategy.add_reshard_option(options)
        FSDPStrategy.add_sharding_options(options)

    # -- the mesh --------------------------------------------------------------------------------

    def mesh_shape(self, trainer) -> dict[str, int]:
        """``dp_replicate x dp_shard x tp`` for this job (see :meth:`sizes`)."""
        return self.sizes(trainer, trainer.world_size)

    def sizes(self, trainer, world: int) -> dict[str, int]:
        """The mesh's sizes for a job of ``world`` processes; sizes whose product is not
        ``world`` are a :class:`ptrain.ConfigError` naming them and what would fit."""
        flag = f"--{trainer.options['strategy']}"
        tensor = world // trainer.num_nodes if self.tensor == "auto" else self.tensor
        if self.shard == "auto":
            if world % (self.replicate * tensor):
                raise ConfigError(
                    f"{flag}-replicate {self.replicate} x {flag}-tensor {tensor} does not divide "
                    f"the {world} processes of this job (--devices {trainer.devices} x "
                    f"--num-nodes {trainer.num_nodes}); choose sizes whose product divides "
                    f"{world}: the rest becomes {flag}-shard.")
            shard = world // (self.replicate * tensor)
        else:
            shard = self.shard
        if self.replicate * shard * tensor != world:
            raise ConfigError(
                f"the mesh {flag}-replicate {self.replicate} x {flag}-shard {shard} x "
                f"{flag}-tensor {tensor} has {self.replicate * shard * tensor} places, but this "
                f"job has {world} processes (--devices {trainer.devices} x --num-nodes "
                f"{trainer.num_nodes}); give sizes whose product is {world}, or leave "
                f"{flag}-shard at auto.")
        return dict(zip(DIMENSIONS, (self.replicate, shard, tensor)))

    @hookimpl
    def launch(self, trainer, function):
        # sizes that can't fit are said before any process starts
        self.sizes(trainer, self.processes_per_node(trainer) * trainer.num_nodes)
        return super().launch(trainer, function)

    def data_parallel(self, trainer) -> tuple[int, int, Any]:
        mesh = self._mesh
        replicate, shard, tensor = (mesh[name].size() for name in DIMENSIONS)
        if tensor == 1:
            return super().data_parallel(trainer)
        r, s, _ = mesh.get_coordinate()
        return r * shard + s, replicate * shard, self._data_parallel_group(mesh)

    def _data_parallel_group(self, mesh) -> Any:
        """The process group of the processes that share this one's tensor-parallel place,
        made with the mesh (see :meth:`on_stage_start`)."""
        assert self._data_group is not None and self._data_group[0] is mesh
        return self._data_group[1]

    @hookimpl
    def on_stage_start(self, trainer, stage: str) -> None:
        super().on_stage_start(trainer, stage)
        mesh = self._mesh
        # every process makes every group, in the same order: a collective, so here, where
        # every process passes, not when first needed
        if mesh["tp"].size() > 1 and (self._data_group is None or self._data_group[0] is not mesh):
            ranks = mesh.mesh.reshape(-1, mesh["tp"].size())
            group, _ = dist.new_subgroups_by_enumeration(
                [ranks[:, t].tolist() for t in range(ranks.shape[1])])
            self._data_group = (mesh, group)
        if self.mesh_names == "lightning":
            if self._lightning_view is None or self._lightning_view[0] is not mesh:
                # the same processes as data_parallel x tensor_parallel, made once per mesh
                # (new process groups: a collective). A view of the root mesh, as FSDP2 over
                # tensor parallelism needs (the module's DTensors and fully_shard meet there).
                dp, tp = mesh["dp_replicate"].size() * mesh["dp_shard"].size(), mesh["tp"].size()
                view = mesh._flatten("world")._unflatten(0, (dp, tp), MODULE_MESHES["lightning"])
                self._lightning_view = (mesh, view)
            trainer.device_mesh = self._lightning_view[1]

    # -- model -----------------------------------------------------------------------------------

    @hookimpl
    def module_init_context(self, trainer, empty_init: bool | None) -> Any:
        return _plan_keys_resolve(trainer, super().module_init_context(empty_init))

    @hookimpl
    def wrap_model(self, trainer, model: nn.Module) -> nn.Module:
        if any(isinstance(m, FSDPModule) for m in model.modules()):
            # configure_model sharded it itself: only what is still on the meta device is made
            materialize(model, trainer.device)
            trainer.inference_mode = False  # as under fsdp (see FSDPStrategy.wrap_model)
            return model
        _check_even_split(trainer, model, self._mesh["tp"].size())
        return super().wrap_model(trainer, model)

    def share_rank_zero_value(self, trainer, tensor: torch.Tensor) -> None:
        """As under fsdp, except for the tensor-parallel layers' DTensors: each process holds
        its own part of those, which it takes from the first data-parallel replica holding the
        same part (``distribute_tensor`` already made the parts agree within that replica)."""
        if not isinstance(tensor, DTensor):
            super().share_rank_zero_value(trainer, tensor)
            return
        mesh = self._mesh
        places = mesh.mesh.reshape(-1, mesh["tp"].size())
        _, _, group = self.data_parallel(trainer)
        source = int(places[0, mesh.get_coordinate()[-1]])
        broadcast_into(tensor.to_local(), trainer.device, src=source, group=group)

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        # the whole stage, not each step: a validation or test step computes its loss on
        # sharded logits too, and the context is torch's global dispatch switch, no per-step cost
        if self.loss_parallel and self._in_loss_parallel is None:
            from torch.distributed.tensor.parallel import loss_parallel

            self._in_loss_parallel = loss_parallel()
            self._in_loss_parallel.__enter__()

    @hookimpl
    def teardown(self, trainer, stage: str) -> None:
        if self._in_loss_parallel is not None:
            self._in_loss_parallel.__exit__(None, None, None)
            self._in_loss_parallel = None


@contextlib.contextmanager
def _plan_keys_resolve(trainer, device: torch.device | None) -> Iterator[None]:
    """``device`` as the default device (meta, for an empty init), and a plan key of torch's
    ``parallelize_module`` that names no submodule made an error: torch warns and skips the
    entry, which would leave that layer whole on every process, silently."""
    with contextlib.ExitStack() as stack:
        if device is not None:
            stack.enter_context(device)
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("error", message="Parallelize plan key", category=UserWarning)
        try:
            yield
        except UserWarning as warning:
            if "Parallelize plan key" not in str(warning):
                raise
            key = str(warning).split("'")[1]
            module = trainer.module
            where = (f"{type(module).__name__}.configure_model" if module is not None
                     else "the model's initialisation")
            names = [name for name, _ in module.named_modules() if name] if module else []
            known = (f"; its submodules are {', '.join(names[:12])}"
                     f"{', ...' if len(names) > 12 else ''}" if names else "")
            raise ConfigError(
                f"the tensor-parallel plan of {where} names {key!r}, which matches no "
                f"submodule (torch: {str(warning).splitlines()[0]}); torch would skip that "
                f"entry and leave the layer whole on every process. Name a submodule relative "
                f"to the module given to parallelize_module{known}.") from None


def _check_even_split(trainer, model: nn.Module, parts: int) -> None:
    """Every parameter the plan splits over the tensor dimension (into ``parts``) splits
    evenly: torch shards an uneven one too, and the layer's reshapes (attention heads) then
    fail or mix up the parts."""
    tensor_names = {names[-1] for names in MODULE_MESHES.values()}
    for name, param in model.named_parameters():
        mesh = getattr(param, "device_mesh", None)
        dims = [d for d, n in enumerate(mesh.mesh_dim_names or ()) if n in tensor_names] \
            if mesh is not None else []
        if not dims:
            continue
        placement = param.placements[dims[0]]
        if placement.is_shard() and param.shape[placement.dim] % parts:
            size = param.shape[placement.dim]
            raise ConfigError(
                f"the tensor-parallel plan splits {name.removeprefix('module.')} (shape "
                f"{tuple(param.shape)}) along dimension {placement.dim} into "
                f"--{trainer.options['strategy']}-tensor {parts} parts, but {size} does not "
                f"divide by {parts}; choose a tensor size that divides {size}, or layer "
                f"sizes that divide by {parts}.")
