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
from ptrain_model_parallel.context import SequenceSplit, no_ring_attention

#: the mesh's dimensions, outermost first: processes that differ in an outer one sit on other
#: nodes first (``auto`` keeps the tensor dimension inside a node, where links are fastest).
#: ``cp`` (context parallel) is a dimension of the mesh only when its size is above 1.
DIMENSIONS = ("dp_replicate", "dp_shard", "cp", "tp")
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
    and applies its tensor-parallel plan on ``self.device_mesh["tp"]`` with
    ``self.parallelize`` (torch's ``parallelize_module``, with the run's plugins taking part).
    The strategy then shards the model with FSDP2 over the
    data-parallel dimensions (hybrid when ``dp_replicate`` > 1), unless ``configure_model``
    already did. Processes of one tensor-parallel group read the same batches; metrics are
    averaged over the data-parallel replicas. With ``context`` > 1 the mesh has a fourth
    dimension, ``cp`` (before ``tp``), over which each batch's sequences are split for the
    step (:class:`~ptrain_model_parallel.context.SequenceSplit`); FSDP then shards over
    ``dp_shard x cp``. With ``mesh_names="lightning"`` the module sees
    a 2-D view of the same mesh, ``data_parallel x tensor_parallel``, as under Lightning's
    ``ModelParallelStrategy``; the strategy itself always works on its own mesh, ``_mesh``.
    """

    def __init__(self, replicate: int = 1, shard: int | str = "auto", tensor: int | str = "auto",
                 context: int = 1, context_dim: int = 1, loss_parallel: bool = False,
                 mesh_names: str = "ptrain", **fsdp_options):
        super().__init__(replicate=replicate, **fsdp_options)
        self.shard = shard
        self.tensor = tensor
        self.context, self.context_dim = context, context_dim
        self.loss_parallel = loss_parallel
        self.mesh_names = mesh_names
        self._data_group: tuple[Any, Any] | None = None  # (mesh, its data-parallel group)
        self._in_loss_parallel: Any = None  # the entered loss_parallel() context, in a stage
        self._lightning_view: tuple[Any, Any] | None = None  # (mesh, its 2-D view)
        self._shard_view: tuple[Any, Any] | None = None  # (mesh, dp_shard x cp as one dim)
        self._split: SequenceSplit | None = None  # the batches' sequences, under cp

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
        options.add("context", positive(to_int), default=1,
                    help="processes each sequence of a batch is split over (context "
                         "parallelism: attention by torch's ring attention, on CUDA GPUs)")
        options.add("context_dim", to_int, default=1,
                    help="the sequence dimension of the batch's tensors, which "
                         "--model-parallel-context splits (every tensor with more dimensions "
                         "than this is split)")
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
        context = self.context
        if context > 1 and self.mesh_names == "lightning":
            raise ConfigError(
                f"{flag}-context {context} splits sequences over a mesh dimension of its own, "
                f"which Lightning's 2-D mesh (data_parallel x tensor_parallel, "
                f"{flag}-mesh-names lightning) has no name for. Use ptrain's mesh names "
                f"(dp_replicate, dp_shard, cp, tp), or leave {flag}-context at 1.")
        if self.tensor == "auto":  # one node's processes, less those context parallel takes
            per_node = world // trainer.num_nodes
            tensor = per_node // context if per_node % context == 0 else 1
        else:
            tensor = self.tensor
        others = self.replicate * context * tensor
        named = f"{flag}-replicate {self.replicate} x " + \
            (f"{flag}-context {context} x " if context > 1 else "")
        if self.shard == "auto":
            if world % others:
                raise ConfigError(
                    f"{named}{flag}-tensor {tensor} does not divide the {world} processes of "
                    f"this job (--devices {trainer.devices} x --num-nodes {trainer.num_nodes}); "
                    f"choose sizes whose product divides {world}: the rest becomes "
                    f"{flag}-shard.")
            shard = world // others
        else:
            shard = self.shard
        if shard * others != world:
            raise ConfigError(
                f"the mesh {named}{flag}-shard {shard} x {flag}-tensor {tensor} has "
                f"{shard * others} places, but this job has {world} processes (--devices "
                f"{trainer.devices} x --num-nodes {trainer.num_nodes}); give sizes whose "
                f"product is {world}, or leave {flag}-shard at auto.")
        sizes = dict(zip(DIMENSIONS, (self.replicate, shard, context, tensor)))
        if context == 1:
            del sizes["cp"]  # the mesh of a run without context parallelism stays 3-D
        return sizes

    @hookimpl
    def launch(self, trainer, function):
        # sizes that can't fit are said before any process starts
        self.sizes(trainer, self.processes_per_node(trainer) * trainer.num_nodes)
        return super().launch(trainer, function)

    def data_parallel(self, trainer) -> tuple[int, int, Any]:
        """The data-parallel replicas (``dp_replicate x dp_shard``) read different batches;
        the processes of one replica (its ``cp x tp`` places) read the same. The group: the
        processes that share this one's tensor-parallel place."""
        mesh = self._mesh
        size = dict(zip(mesh.mesh_dim_names, mesh.shape))
        if size["tp"] == 1 and size.get("cp", 1) == 1:
            return super().data_parallel(trainer)
        place = dict(zip(mesh.mesh_dim_names, mesh.get_coordinate()))
        return (place["dp_replicate"] * size["dp_shard"] + place["dp_shard"],
                size["dp_replicate"] * size["dp_shard"], self._data_parallel_group(mesh))

    def metric_replicas(self, trainer) -> tuple[int, Any]:
        """Under context parallelism each process of a replica computed its metrics on a part
        of every sequence (parts of one length): they are averaged with the replicas'."""
        _, replicas, group = self.data_parallel(trainer)
        return replicas * self._context_size(), group

    def _context_size(self) -> int:
        mesh = self._mesh
        return mesh["cp"].size() if "cp" in mesh.mesh_dim_names else 1

    def _data_parallel_group(self, mesh) -> Any:
        """The process group of the processes that share this one's tensor-parallel place,
        made with the mesh (see :meth:`on_stage_start`); ``None`` (every process) without
        tensor parallelism."""
        if mesh["tp"].size() == 1:
            return None
        assert self._data_group is not None and self._data_group[0] is mesh
        return self._data_group[1]

    def data_parallel_mesh(self, mesh):
        """FSDP shards over ``dp_shard x cp``: the processes of a context-parallel group hold
        the same weights and average their gradients, as replicas would."""
        if "cp" not in mesh.mesh_dim_names:
            return super().data_parallel_mesh(mesh)
        assert self._shard_view is not None and self._shard_view[0] is mesh
        view = self._shard_view[1]
        return view["dp_replicate", "dp_shard_cp"] if mesh["dp_replicate"].size() > 1 \
            else view["dp_shard_cp"]

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
        if "cp" in mesh.mesh_dim_names and (self._shard_view is None
                                            or self._shard_view[0] is not mesh):
            # a view of the root mesh in which dp_shard and cp are one dimension (a view, not
            # a slice of a flattened dimension, which torch deprecates)
            size = dict(zip(mesh.mesh_dim_names, mesh.shape))
            view = mesh._flatten("world")._unflatten(
                0, (size["dp_replicate"], size["dp_shard"] * size["cp"], size["tp"]),
                ("dp_replicate", "dp_shard_cp", "tp"))
            self._shard_view = (mesh, view)
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
        flag = f"--{trainer.options['strategy']}-context"
        if self._context_size() > 1:
            if stage == "predict":
                raise ConfigError(
                    f"{flag} {self._context_size()} splits each sequence over processes, and "
                    f"predict would gather predictions made on parts of sequences as if they "
                    f"were whole. Predict with {flag} 1 (the checkpoint loads on any mesh).")
            self._split = SequenceSplit(self._mesh["cp"], self.context_dim, flag)
        # the whole stage, not each step: a validation or test step computes its loss on
        # sharded logits too, and the context is torch's global dispatch switch, no per-step cost
        if self.loss_parallel and self._in_loss_parallel is None:
            from torch.distributed.tensor.parallel import loss_parallel

            self._in_loss_parallel = loss_parallel()
            self._in_loss_parallel.__enter__()

    @hookimpl
    def unused_step_hooks(self) -> list[str]:
        return [] if self._context_size() > 1 else ["on_train_batch_end",
                                                     "on_evaluation_batch_end"]

    @hookimpl(wrapper=True)
    def transfer_batch(self):
        batch = yield
        return batch if self._split is None else self._split.enter(batch)

    @hookimpl
    def on_train_batch_end(self) -> None:
        if self._split is not None:
            self._split.leave()

    @hookimpl
    def on_evaluation_batch_end(self) -> None:
        if self._split is not None:
            self._split.leave()

    @hookimpl
    def report_error(self, trainer, exception: BaseException) -> BaseException | None:
        translated = no_ring_attention(exception, f"--{trainer.options['strategy']}-context",
                                       trainer.device) if self._split is not None else None
        return super().report_error(trainer, translated or exception) or translated

    @hookimpl
    def teardown(self, trainer, stage: str) -> None:
        if self._split is not None:
            self._split.leave()
            self._split = None
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
