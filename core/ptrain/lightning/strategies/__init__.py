"""``lightning.pytorch.strategies``' names over ptrain's strategy plugins.

A Lightning strategy object given to the Trainer selects the ptrain strategy plugin of the same
meaning, with its arguments as that plugin's options: ``DDPStrategy`` -> ``ddp``,
``FSDPStrategy`` -> ``fsdp`` (``SHARD_GRAD_OP`` -> ``zero2``), ``DeepSpeedStrategy(stage=N)`` ->
``zeroN`` (ptrain's ZeRO stages on torch's own parts), ``SingleDeviceStrategy`` ->
``single-device``. Each argument either becomes an option or is refused, when the object is
made, with a :class:`ptrain.ConfigError` that names it and says what to do.

During a stage, ``trainer.strategy`` answers Lightning's questions (``world_size``,
``global_rank``, ``is_global_zero``, ``root_device``) and runs its collectives (``barrier``,
``broadcast``, ``reduce``, ``all_gather``, ``reduce_boolean_decision``) over the run's
process group. ``StrategyRegistry`` lists the strategy names ``Trainer(strategy=...)`` takes
with the installed plugins: Lightning's (``ddp_spawn``, ``deepspeed_stage_2``, ...) and ptrain's
own (``zero1``, ...). Each class also imports from the submodule Lightning defines it in
(``strategies.ddp``, ``strategies.fsdp``, ``strategies.strategy``, ...).
"""

from __future__ import annotations

import datetime
import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ptrain.errors import ConfigError
from ptrain.lightning._common import refuse
from ptrain.lightning._registries import Registry

__all__ = ["DDPStrategy", "DeepSpeedStrategy", "FSDPStrategy", "ModelParallelStrategy",
           "ParallelStrategy", "SingleDeviceStrategy", "Strategy", "StrategyRegistry"]

_NO_ENVIRONMENT = ("ptrain reads the cluster from the environment itself (torchrun's RANK/"
                   "WORLD_SIZE, SLURM); give one of ptrain.lightning.plugins.environments' "
                   "objects or leave cluster_environment out")
_NO_PARALLEL_DEVICES = "leave parallel_devices out and pass Trainer(devices=...) instead"


@dataclass
class StrategyChoice:
    """What a Lightning strategy object selects in ptrain: the strategy plugin and its options,
    and what the object carries besides (an accelerator, a precision or checkpoint plugin,
    devices, callbacks with their options)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    accelerator: Any = None
    precision_plugin: Any = None
    checkpoint_io: Any = None
    devices: Any = None
    callbacks: list[Any] = field(default_factory=list)
    callback_options: dict[str, dict[str, Any]] = field(default_factory=dict)


def _seconds(timeout: Any) -> float:
    return timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)


class Strategy:
    """The base of Lightning's strategies. The subclasses below stand for ptrain's strategy
    plugins. A program's own subclass of ``Strategy`` (Lightning's API of ``setup``,
    ``model_to_device``, ``reduce``...) can't drive ptrain's loop: the Trainer refuses it and
    says how to write a ptrain strategy plugin instead.

    Bound to a trainer (``trainer.strategy``), it answers for the running stage: see the
    properties and collectives below. Unbound, it answers for one process."""

    #: the ptrain strategy plugin this class selects (None: a program's own strategy)
    ptrain_name: str | None = None

    def __init__(self, accelerator: Any = None, checkpoint_io: Any = None,
                 precision_plugin: Any = None) -> None:
        self._accelerator = accelerator
        self._checkpoint_io = checkpoint_io
        self._precision_plugin = precision_plugin
        self._trainer: Any = None
        self._options: dict[str, Any] = {}
        self._callbacks: list[Any] = []  # callback plugins the object adds, and their options
        self._callback_options: dict[str, dict[str, Any]] = {}

    def ptrain_choice(self) -> StrategyChoice:
        """What this object selects in ptrain (see :class:`StrategyChoice`)."""
        if self.ptrain_name is None:
            raise ConfigError(
                f"{type(self).__name__} is a strategy written against Lightning's Strategy API, "
                f"which ptrain's loop does not call (its steps run through ptrain's hooks: "
                f"setup_device, wrap_model, backward, optimizer_step, ...). Choose one of "
                f"ptrain's strategies (`ptrain plugins` lists them: ddp, fsdp, zero1-3, ...), or "
                f"write your strategy as a ptrain plugin (docs/plugins.md, `ptrain new-plugin`). "
                f"See \"Coming from Lightning\" in ptrain's documentation.")
        return StrategyChoice(self.ptrain_name, dict(self._options), self._accelerator,
                              self._precision_plugin, self._checkpoint_io,
                              callbacks=list(self._callbacks),
                              callback_options=dict(self._callback_options))

    # -- Lightning's view of the running stage ------------------------------------------------

    def _bind(self, trainer: Any) -> Strategy:
        self._trainer = trainer
        return self

    def _read(self, attribute: str, default: Any) -> Any:
        return getattr(self._trainer, attribute, default) if self._trainer is not None \
            else default

    @property
    def world_size(self) -> int:
        return self._read("world_size", 1)

    @property
    def global_rank(self) -> int:
        return self._read("global_rank", 0)

    @property
    def local_rank(self) -> int:
        return self._read("local_rank", 0)

    @property
    def node_rank(self) -> int:
        processes = max(1, self.world_size // max(1, self._read("num_nodes", 1)))
        return self.global_rank // processes

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def root_device(self) -> torch.device:
        return self._read("device", torch.device("cpu"))

    @property
    def lightning_module(self) -> Any:
        return self._read("module", None)

    @property
    def model(self) -> Any:
        return self._read("model", None)

    @property
    def accelerator(self) -> Any:
        return self._accelerator

    @property
    def precision_plugin(self) -> Any:
        return self._precision_plugin

    @property
    def checkpoint_io(self) -> Any:
        return self._checkpoint_io

    def load_checkpoint(self, checkpoint_path: Any,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint file at ``checkpoint_path`` as a dict, read as the run reads its
        checkpoints: by the program's own ``CheckpointIO`` (this strategy's ``checkpoint_io``,
        else the Trainer's), else by torch's weights-only loader whatever ``weights_only``
        says (see ``TorchCheckpointIO``). It only reads: ptrain's loop restores a run without
        calling it, so a program that replaces it around a stage (pytorch-forecasting's
        ``Tuner`` does, around ``lr_find``) changes no restore."""
        from ptrain.lightning.plugins.io import TorchCheckpointIO

        io = self.checkpoint_io
        if io is None and self._trainer is not None:
            io = getattr(self._trainer.pm.get_plugin("checkpoint-io"), "io", None)
        io = TorchCheckpointIO() if io is None else io
        return io.load_checkpoint(checkpoint_path, weights_only=weights_only)

    @staticmethod
    def _distributed() -> bool:
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def barrier(self, name: str | None = None) -> None:
        """Wait until every process gets here (nothing with one process)."""
        if self._distributed():
            dist.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Process ``src``'s ``obj``, on every process."""
        if not self._distributed():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src)
        return box[0]

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """``tensor`` summed (``"sum"``), averaged (``"mean"``/``"avg"``, the default), or
        reduced by a ``torch.distributed.ReduceOp`` over every process; anything but a tensor is
        returned as it is."""
        if not isinstance(tensor, torch.Tensor) or not self._distributed():
            return tensor
        op = str(reduce_op).lower() if isinstance(reduce_op, str) else reduce_op
        mean = op in ("mean", "avg")
        if isinstance(op, str) and not mean and op != "sum":
            raise ValueError(f"reduce_op {reduce_op!r}: use 'mean', 'sum' or a "
                             f"torch.distributed.ReduceOp")
        reduced = tensor.float() if mean and not tensor.is_floating_point() else tensor.clone()
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM if isinstance(op, str) else op,
                        group=group)
        return reduced / dist.get_world_size(group) if mean else reduced

    def all_gather(self, tensor: torch.Tensor, group: Any = None,
                   sync_grads: bool = False) -> torch.Tensor:
        """Every process's ``tensor`` (of the same shape), stacked along a new first
        dimension (one process: ``tensor`` itself)."""
        from ptrain.distributed import all_gather_tensor

        return all_gather_tensor(tensor, group=group, sync_grads=sync_grads)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """``decision`` agreed by every process: all of them (``all=True``) or any of them."""
        if not self._distributed():
            return decision
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, bool(decision))
        return builtins_all(everyone) if all else any(everyone)


builtins_all = all


class ParallelStrategy(Strategy):
    """The base of the strategies that train in several processes."""

    def __init__(self, accelerator: Any = None, parallel_devices: Any = None,
                 cluster_environment: Any = None, checkpoint_io: Any = None,
                 precision_plugin: Any = None) -> None:
        super().__init__(accelerator, checkpoint_io, precision_plugin)
        if parallel_devices is not None:
            raise refuse(type(self).__name__, "parallel_devices", parallel_devices,
                         _NO_PARALLEL_DEVICES)
        if cluster_environment is not None:
            from ptrain.lightning.plugins.environments import ClusterEnvironment

            if not isinstance(cluster_environment, ClusterEnvironment):
                raise refuse(type(self).__name__, "cluster_environment", cluster_environment,
                             _NO_ENVIRONMENT)
            self._callback_options.update(cluster_environment.ptrain_options)

    def _process_group_options(self, process_group_backend: Any, timeout: Any) -> None:
        if process_group_backend is not None:
            self._options["process_group_backend"] = process_group_backend
        if timeout is not None:
            self._options["timeout"] = _seconds(timeout)


class SingleDeviceStrategy(Strategy):
    """ptrain's ``single-device`` strategy on ``device`` (``"cpu"``, ``"cuda:1"``, an index of
    a GPU, a ``torch.device``): its type selects the accelerator unless the Trainer's
    ``accelerator`` is set, its index the device."""

    ptrain_name = "single-device"

    def __init__(self, device: Any = "cpu", accelerator: Any = None, checkpoint_io: Any = None,
                 precision_plugin: Any = None) -> None:
        super().__init__(accelerator, checkpoint_io, precision_plugin)
        self.device = torch.device("cuda", device) if isinstance(device, int) \
            else torch.device(device)

    def ptrain_choice(self) -> StrategyChoice:
        choice = super().ptrain_choice()
        if choice.accelerator is None:
            choice.accelerator = self.device.type if self.device.type != "xla" else "tpu"
        if self.device.index is not None:
            choice.devices = [self.device.index]
        return choice


#: Lightning's start methods -> ptrain's launcher: popen runs the script again (ptrain's
#: ``script`` launcher, chosen by ``auto`` where there is a script); the others start workers
_LAUNCHERS = {"popen": None, "spawn": "spawn", "fork": "spawn", "forkserver": "spawn"}
#: DistributedDataParallel's keyword arguments that ptrain's ddp plugin takes as options
_DDP_OPTIONS = ("find_unused_parameters", "gradient_as_bucket_view")


class DDPStrategy(ParallelStrategy):
    """ptrain's ``ddp`` strategy. ``timeout``, ``process_group_backend``,
    ``find_unused_parameters`` and ``gradient_as_bucket_view`` become its options;
    ``start_method="spawn"`` (or ``fork``/``forkserver``) its spawn launcher, which starts
    worker processes per stage and pickles the module to them (Lightning forks for ``fork``:
    ptrain's workers always start fresh)."""

    ptrain_name = "ddp"

    def __init__(self, accelerator: Any = None, parallel_devices: Any = None,
                 cluster_environment: Any = None, checkpoint_io: Any = None,
                 precision_plugin: Any = None, ddp_comm_state: Any = None,
                 ddp_comm_hook: Any = None, ddp_comm_wrapper: Any = None,
                 model_averaging_period: int | None = None,
                 process_group_backend: str | None = None,
                 timeout: Any = datetime.timedelta(seconds=1800),
                 start_method: str = "popen", **kwargs: Any) -> None:
        super().__init__(accelerator, parallel_devices, cluster_environment, checkpoint_io,
                         precision_plugin)
        owner = type(self).__name__
        for argument, value in (("ddp_comm_state", ddp_comm_state),
                                ("ddp_comm_hook", ddp_comm_hook),
                                ("ddp_comm_wrapper", ddp_comm_wrapper)):
            if value is not None:
                raise refuse(owner, argument, value,
                             "ptrain's ddp registers no communication hook; register yours on "
                             "the DistributedDataParallel module in a callback's setup "
                             "(trainer.model.register_comm_hook(...)), or leave it out")
        if model_averaging_period is not None:
            raise refuse(owner, "model_averaging_period", model_averaging_period,
                         "ptrain has no post-local SGD; leave it out")
        if start_method not in _LAUNCHERS:
            raise refuse(owner, "start_method", start_method,
                         f"choose one of {', '.join(_LAUNCHERS)}")
        self.start_method = start_method
        self._process_group_options(process_group_backend, timeout)
        if _LAUNCHERS[start_method] is not None:
            self._options["launcher"] = _LAUNCHERS[start_method]
        for argument, value in kwargs.items():
            if argument not in _DDP_OPTIONS:
                raise refuse(owner, argument, value,
                             f"ptrain's ddp takes {', '.join(_DDP_OPTIONS)} of "
                             f"DistributedDataParallel's arguments; leave the others out")
            self._options[argument] = value



def _wrap_classes(policy: Any, owner: str, argument: str, what: str) -> list[str]:
    """A set or list of module classes (Lightning's policy shorthand) -> their names."""
    classes = [policy] if inspect.isclass(policy) else policy
    if not isinstance(classes, (set, list, tuple, frozenset)) or not all(
            inspect.isclass(c) and issubclass(c, torch.nn.Module) for c in classes):
        raise refuse(owner, argument, policy,
                     f"give the module classes {what} as a set ({{Block}}); ptrain takes "
                     f"classes, not a policy function")
    return sorted({f"{c.__module__}.{c.__qualname__}" for c in classes})


#: Lightning's FSDP sharding strategies that ptrain has: the strategy plugin they select
#: Lightning's sharding_strategy -> (ptrain's strategy, its options)
_SHARDING = {"FULL_SHARD": ("fsdp", {}), "SHARD_GRAD_OP": ("zero2", {}),
             "HYBRID_SHARD": ("fsdp", {"replicate": "nodes"})}


class FSDPStrategy(ParallelStrategy):
    """ptrain's ``fsdp`` strategy (FSDP2): ``auto_wrap_policy={Block}`` -> ``wrap_classes``,
    ``cpu_offload`` -> ``cpu_offload``, ``activation_checkpointing_policy={Block}`` -> the
    ``activation-checkpointing`` callback on those classes, ``sharding_strategy=
    "SHARD_GRAD_OP"`` -> ``zero2``, ``"HYBRID_SHARD"`` -> ``fsdp`` with one replica per node
    (``--fsdp-replicate nodes``: sharded within a node, replicated across nodes). ptrain writes sharded checkpoints (a folder of shards per
    checkpoint) whatever ``state_dict_type`` says; ``trainer.save_full_weights(path)`` or
    ``ptrain export`` make one file of the whole weights."""

    ptrain_name = "fsdp"

    def __init__(self, accelerator: Any = None, parallel_devices: Any = None,
                 cluster_environment: Any = None, checkpoint_io: Any = None,
                 precision_plugin: Any = None, process_group_backend: str | None = None,
                 timeout: Any = datetime.timedelta(seconds=1800), cpu_offload: Any = None,
                 mixed_precision: Any = None, auto_wrap_policy: Any = None,
                 activation_checkpointing: Any = None,
                 activation_checkpointing_policy: Any = None,
                 sharding_strategy: Any = "FULL_SHARD", state_dict_type: str = "full",
                 device_mesh: Any = None, **kwargs: Any) -> None:
        super().__init__(accelerator, parallel_devices, cluster_environment, checkpoint_io,
                         precision_plugin)
        owner = type(self).__name__
        self._process_group_options(process_group_backend, timeout)
        if cpu_offload is not None:
            offload = getattr(cpu_offload, "offload_params", cpu_offload)
            if not isinstance(offload, bool):
                raise refuse(owner, "cpu_offload", cpu_offload, "pass True or False")
            self._options["cpu_offload"] = offload
        if mixed_precision is not None:
            raise refuse(owner, "mixed_precision", mixed_precision,
                         "choose the precision with Trainer(precision='bf16-mixed'); ptrain's "
                         "fsdp applies the precision plugin's formats itself")
        if auto_wrap_policy is not None:
            self._options["wrap_classes"] = _wrap_classes(auto_wrap_policy, owner,
                                                          "auto_wrap_policy", "to shard as units")
        for argument, policy in (("activation_checkpointing", activation_checkpointing),
                                 ("activation_checkpointing_policy",
                                  activation_checkpointing_policy)):
            if policy is not None:
                classes = _wrap_classes(policy, owner, argument, "to checkpoint")
                self._callbacks = ["activation-checkpointing"]
                self._callback_options["activation-checkpointing"] = {"classes": classes}
        name = str(getattr(sharding_strategy, "name", sharding_strategy)).upper()
        if name not in _SHARDING:
            raise refuse(owner, "sharding_strategy", sharding_strategy,
                         "ptrain has FULL_SHARD (fsdp), SHARD_GRAD_OP (zero2) and HYBRID_SHARD "
                         "(fsdp with one replica per node); for NO_SHARD use DDPStrategy")
        self.ptrain_name, options = _SHARDING[name]
        self._options.update(options)
        if state_dict_type not in ("full", "sharded"):
            raise refuse(owner, "state_dict_type", state_dict_type, "pass 'full' or 'sharded'")
        self.state_dict_type = state_dict_type
        if device_mesh is not None:
            raise refuse(owner, "device_mesh", device_mesh,
                         "ptrain's fsdp lays out its own mesh: pass sharding_strategy="
                         "'HYBRID_SHARD' for one replica per node, or give the number of "
                         "replicas as ptrain's fsdp option replicate (--fsdp-replicate R); "
                         "for tensor parallelism use ModelParallelStrategy")
        for argument, value in kwargs.items():
            if argument == "use_orig_params" and value is True:
                continue  # FSDP2 always keeps the original parameters
            raise refuse(owner, argument, value,
                         "ptrain's fsdp is FSDP2 (torch's fully_shard), which does not take "
                         "this FSDP1 argument; leave it out")


#: DeepSpeedStrategy's arguments that only tune DeepSpeed's own engine, with their defaults
_DEEPSPEED_ENGINE = {
    "remote_device": None, "offload_params_device": "cpu", "nvme_path": "/local_nvme",
    "params_buffer_count": 5, "params_buffer_size": 100_000_000, "max_in_cpu": 1_000_000_000,
    "offload_optimizer_device": "cpu", "optimizer_buffer_count": 4, "block_size": 1048576,
    "queue_depth": 8, "single_submit": False, "overlap_events": True, "thread_count": 1,
    "pin_memory": False, "sub_group_size": 1_000_000_000_000, "contiguous_gradients": True,
    "overlap_comm": True, "allgather_partitions": True, "reduce_scatter": True,
    "allgather_bucket_size": 200_000_000, "reduce_bucket_size": 200_000_000,
    "zero_allow_untested_optimizer": True, "logging_batch_size_per_gpu": "auto", "config": None,
    "logging_level": 30, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
    "hysteresis": 2, "min_loss_scale": 1, "partition_activations": False,
    "cpu_checkpointing": False, "contiguous_memory_optimization": False,
    "synchronize_checkpoint_boundary": False, "load_full_weights": False,
    "exclude_frozen_parameters": False,
}


class DeepSpeedStrategy(ParallelStrategy):
    """ptrain's ``zero1``/``zero2``/``zero3`` for ``stage=1/2/3``: DeepSpeed's ZeRO stages built
    on torch's own parts (ZeroRedundancyOptimizer, FSDP2), so DeepSpeed is not needed.
    ``offload_optimizer=True, offload_parameters=True`` at stage 3 -> ``cpu_offload``. The
    arguments that tune DeepSpeed's own engine (buffers, NVMe, its loss scaler, ``config``) are
    refused unless left at their defaults: ptrain does not run that engine."""

    def __init__(self, accelerator: Any = None, zero_optimization: bool = True, stage: int = 2,
                 offload_optimizer: bool = False, offload_parameters: bool = False,
                 parallel_devices: Any = None, cluster_environment: Any = None,
                 precision_plugin: Any = None, process_group_backend: str | None = None,
                 timeout: Any = datetime.timedelta(seconds=1800), **engine: Any) -> None:
        super().__init__(accelerator, parallel_devices, cluster_environment, None,
                         precision_plugin)
        owner = type(self).__name__
        if zero_optimization is not True:
            raise refuse(owner, "zero_optimization", zero_optimization,
                         "without ZeRO this is data parallelism: use DDPStrategy")
        if stage not in (1, 2, 3):
            raise refuse(owner, "stage", stage, "choose ZeRO stage 1, 2 or 3")
        self.stage = stage
        self.ptrain_name = f"zero{stage}"
        if offload_optimizer or offload_parameters:
            if not (offload_optimizer and offload_parameters and stage == 3):
                raise refuse(owner, "offload_optimizer" if not offload_parameters
                             else "offload_parameters", True,
                             "ptrain's offload (FSDP2's) moves parameters, gradients and the "
                             "optimizer step to the host together: use stage=3 with both "
                             "offload_optimizer=True and offload_parameters=True "
                             "('deepspeed_stage_3_offload'), or neither")
            self._options["cpu_offload"] = True
        self._process_group_options(process_group_backend, timeout)
        for argument, value in engine.items():
            if argument not in _DEEPSPEED_ENGINE:
                raise TypeError(f"{owner}() got an unexpected keyword argument {argument!r}")
            default = _DEEPSPEED_ENGINE[argument]
            if value != default or type(value) is not type(default):
                raise refuse(owner, argument, value,
                             "it tunes DeepSpeed's own engine, which ptrain's ZeRO stages "
                             "(built on torch's ZeroRedundancyOptimizer and FSDP2) do not run; "
                             "leave it out")


class ModelParallelStrategy(ParallelStrategy):
    """Lightning's 2-D strategy: ptrain's ``model-parallel`` (ptrain-model-parallel), whose
    module sees Lightning's mesh: ``self.device_mesh`` has the dimensions ``data_parallel``
    and ``tensor_parallel``, a view of ptrain's ``dp_replicate x dp_shard x tp`` mesh.

    ``data_parallel_size`` and ``tensor_parallel_size`` keep Lightning's meaning of ``"auto"``:
    the number of nodes, and the processes of one node. As in Lightning, ``configure_model``
    applies the plan and ``fully_shard``; a module that applies no ``fully_shard`` of its own is
    sharded by ptrain over ``data_parallel`` (where Lightning would leave its replicas
    unsynchronised)."""

    ptrain_name = "model-parallel"

    def __init__(self, data_parallel_size: Any = "auto", tensor_parallel_size: Any = "auto",
                 save_distributed_checkpoint: bool = True,
                 process_group_backend: str | None = None,
                 timeout: Any = datetime.timedelta(seconds=1800)) -> None:
        super().__init__()
        owner = type(self).__name__
        for argument, value in (("data_parallel_size", data_parallel_size),
                                ("tensor_parallel_size", tensor_parallel_size)):
            if value != "auto" and (isinstance(value, bool) or not isinstance(value, int)
                                    or value < 1):
                raise refuse(owner, argument, value, "give a number of processes (1 or more), "
                             "or 'auto'")
        if save_distributed_checkpoint is not True:
            raise refuse(owner, "save_distributed_checkpoint", save_distributed_checkpoint,
                         "ptrain's model-parallel writes sharded checkpoints; "
                         "trainer.save_full_weights(path) or `ptrain export` make one file of "
                         "the whole weights")
        self._options.update(replicate=1, shard=data_parallel_size,
                             tensor=tensor_parallel_size, mesh_names="lightning")
        self._process_group_options(process_group_backend, timeout)


# -- the registry --------------------------------------------------------------------------------


def _lightning_names() -> dict[str, tuple[type, dict[str, Any], str, str]]:
    """Lightning's strategy names -> (class, arguments, description, ptrain plugin needed)."""
    names: dict[str, tuple[type, dict[str, Any], str, str]] = {}
    for name, method in (("ddp", "popen"), ("ddp_spawn", "spawn"), ("ddp_fork", "fork"),
                         ("ddp_notebook", "fork")):
        names[name] = (DDPStrategy, {"start_method": method},
                       f"ptrain's ddp, started as {method!r}", "ddp")
        for flag in (False, True):
            names[f"{name}_find_unused_parameters_{str(flag).lower()}"] = (
                DDPStrategy, {"find_unused_parameters": flag, "start_method": method},
                f"ptrain's ddp with find_unused_parameters={flag}", "ddp")
    names["fsdp"] = (FSDPStrategy, {}, "ptrain's fsdp (FSDP2)", "fsdp")
    names["fsdp_cpu_offload"] = (FSDPStrategy, {"cpu_offload": True},
                                 "ptrain's fsdp with cpu_offload", "fsdp")
    names["deepspeed"] = (DeepSpeedStrategy, {}, "ptrain's zero2", "zero2")
    for stage in (1, 2, 3):
        names[f"deepspeed_stage_{stage}"] = (DeepSpeedStrategy, {"stage": stage},
                                             f"ptrain's zero{stage}", f"zero{stage}")
    names["deepspeed_stage_3_offload"] = (
        DeepSpeedStrategy, {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
        "ptrain's zero3 with cpu_offload", "zero3")
    names["single_device"] = (SingleDeviceStrategy, {}, "ptrain's single-device",
                              "single-device")
    return names


class _NamedStrategy(Strategy):
    """An installed ptrain strategy under its own name (``zero1``, ``xla``, a third party's)."""

    def __init__(self, ptrain_name: str):
        super().__init__()
        self.ptrain_name = ptrain_name


def _fill(registry: Registry) -> None:
    from ptrain.catalog import Catalog

    catalog = Catalog.discover()
    installed = set(catalog.names("strategy"))
    for name, (cls, init_params, description, needs) in _lightning_names().items():
        if needs in installed:
            registry[name] = {"description": description, "init_params": init_params,
                              "strategy": cls, "strategy_name": name}
    for name in sorted(installed):
        if name not in registry:
            info = catalog.get("strategy", name)
            registry[name] = {"description": f"ptrain's {name!r} ({info.distribution})",
                              "init_params": {"ptrain_name": name},
                              "strategy": _NamedStrategy, "strategy_name": name}


class _StrategyRegistry(Registry):
    value_key, name_key, what = "strategy", "strategy_name", "strategy"

    def available_strategies(self) -> list[str]:
        """The names ``Trainer(strategy=...)`` takes besides ``"auto"``."""
        return list(self.keys())


#: name -> the strategy it selects: Lightning's names whose ptrain plugin is installed, ptrain's
#: own strategy names, and what a program registers
StrategyRegistry = _StrategyRegistry(_fill)


def lightning_strategy(value: Any) -> Strategy | None:
    """The Lightning strategy object ``Trainer(strategy=value)`` means: ``value`` itself, or
    the registered object a Lightning name stands for; ``None`` for a name that is ptrain's
    own or unknown (ptrain judges those)."""
    if isinstance(value, Strategy):
        return value
    if isinstance(value, str) and value in StrategyRegistry.user_registered:
        return StrategyRegistry.get(value)
    known = _lightning_names()
    if isinstance(value, str) and value in known:
        cls, arguments, _, _ = known[value]
        return cls(**arguments)
    return None


#: ptrain's strategy names -> the Lightning class that stands for each
_BY_PTRAIN_NAME = {"ddp": (DDPStrategy, {}), "fsdp": (FSDPStrategy, {}),
                   "zero1": (DeepSpeedStrategy, {"stage": 1}),
                   "zero2": (DeepSpeedStrategy, {"stage": 2}),
                   "zero3": (DeepSpeedStrategy, {"stage": 3})}


def bound_strategy(trainer: Any, given: Any) -> Strategy:
    """Lightning's ``trainer.strategy``: the strategy object ``given`` (the Trainer's argument)
    stands for, or for ptrain's names the Lightning class of the strategy that runs, answering
    for ``trainer``."""
    strategy = lightning_strategy(given)
    if strategy is None:
        name = trainer.options["strategy"]
        if name == "single-device":
            strategy = SingleDeviceStrategy(trainer.device)
        elif name in _BY_PTRAIN_NAME:
            cls, arguments = _BY_PTRAIN_NAME[name]
            strategy = cls(**arguments)
        else:
            strategy = _NamedStrategy(name)
    return strategy._bind(trainer)
