"""The user's side of the contract: :class:`TrainModule` and :class:`DataModule`.

Shaped like Lightning's ``LightningModule`` and ``LightningDataModule`` so that a model is ported
by changing its imports.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import itertools
import os
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch import nn

from ptrain.errors import ConfigError, ModelError
from ptrain.hook_methods import ModuleHookMethods, overridden_method
from ptrain.hyperparameters import HyperParametersMixin

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from ptrain.trainer import Trainer


def class_path(obj: Any) -> str:
    """``MODULE:QUALNAME`` of ``obj``'s class: what ``--model`` takes and checkpoints record."""
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


class TrainModule(ModuleHookMethods, HyperParametersMixin, nn.Module):
    """A model plus how to train it.

    Override ``training_step`` (return the loss tensor, or a dict with ``"loss"``),
    ``configure_optimizers`` and optionally ``validation_step``, ``test_step``, ``predict_step``
    and the dataloaders of the stages (``train_dataloader``, ``val_dataloader``,
    ``test_dataloader``, ``predict_dataloader``; or pass a :class:`DataModule`). Set
    ``automatic_optimization = False`` to call backward and the optimizer steps yourself
    (through :meth:`manual_backward` and the optimizers of :meth:`optimizers`, so that
    precision and strategy plugins still apply). The hook methods (``on_train_epoch_end``,
    ``on_validation_batch_start``, ``setup``, ``configure_callbacks``, ...; see
    :class:`~ptrain.hook_methods.ModuleHookMethods`) run where Lightning runs them; one not
    overridden costs nothing.
    """

    automatic_optimization: bool = True
    #: where a checkpoint holds what :meth:`save_hyperparameters` recorded (Lightning's names)
    CHECKPOINT_HYPER_PARAMS_KEY = "hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "hparams_type"
    # what torch.jit.script leaves alone: properties that read the run, not the model
    __jit_unused_properties__ = ["trainer", "fabric", "current_epoch", "global_step",
                                 "global_rank", "local_rank", "logger", "loggers", "device",
                                 "dtype", "example_input_array", "on_gpu", "hparams",
                                 "hparams_initial", "logs_hyperparameters",
                                 "_param_requires_grad_state"]
    _fabric: Any = None
    _example_input_array: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: Trainer | None = None

    def __getstate__(self) -> dict[str, Any]:
        # pickled for a worker process: the trainer it was last attached to stays behind
        return {**super().__getstate__(), "_trainer": None, "_fabric": None}

    @property
    def trainer(self) -> Trainer:
        """The trainer running this module (during a stage, and after it until the next);
        a :class:`RuntimeError` when none is attached."""
        if self._trainer is None and not _SCRIPTING[0]:
            raise RuntimeError(f"{type(self).__qualname__} is not attached to a `Trainer`: the "
                               f"trainer is there while fit(), validate(), test() or predict() "
                               f"runs it, or once set with module.trainer = trainer.")
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        # modules nested in this one read the same run (Lightning's ensembles)
        for child in self.children():
            if isinstance(child, TrainModule):
                child.trainer = trainer
        self._trainer = trainer

    @property
    def fabric(self) -> Any:
        """The ``lightning.fabric.Fabric`` that set this module up (``fabric.setup(module)``),
        else ``None``: then :attr:`logger`, :attr:`loggers`, :meth:`optimizers` and
        :meth:`clip_gradients` are Fabric's."""
        return self._fabric

    @fabric.setter
    def fabric(self, fabric: Any) -> None:
        for child in self.children():
            if isinstance(child, TrainModule):
                child.fabric = fabric
        if fabric is not None and not isinstance(fabric, weakref.ProxyTypes):
            fabric = weakref.proxy(fabric)  # the module does not keep its Fabric alive
        self._fabric = fabric

    @property
    def example_input_array(self) -> Any:
        """An input ``forward`` takes (a tensor; a tuple of positional arguments; a dict of
        keyword arguments), for exports (:meth:`to_onnx`, :meth:`to_torchscript`) and model
        summaries; ``None`` until set."""
        return self._example_input_array

    @example_input_array.setter
    def example_input_array(self, example: Any) -> None:
        self._example_input_array = example

    @property
    def on_gpu(self) -> bool:
        """Whether the parameters are on a CUDA device."""
        return self.device.type == "cuda"

    # The run's state, as Lightning's module exposes it. Without a trainer: Lightning's values
    # (epoch and step 0, rank 0).

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return self._trainer.global_step if self._trainer is not None else 0

    @property
    def global_rank(self) -> int:
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        return self._trainer.local_rank if self._trainer is not None else 0

    @property
    def device_mesh(self) -> Any:
        """The strategy's ``DeviceMesh`` of the job's processes (``trainer.device_mesh``), for
        ``configure_model`` to apply a tensor-parallel plan on (``self.device_mesh["tp"]`` under
        ``model-parallel``); ``None`` without a trainer or under a strategy that lays out none."""
        return self._trainer.device_mesh if self._trainer is not None else None

    @property
    def device(self) -> torch.device:
        """Where the module's parameters are (the CPU for a module without any)."""
        for tensor in itertools.chain(self.parameters(), self.buffers()):
            return tensor.device
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the module's first floating-point parameter (float32 without one)."""
        for parameter in self.parameters():
            if parameter.is_floating_point():
                return parameter.dtype
        return torch.float32

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        if self.global_rank == 0:
            print(*args, **kwargs)

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        """Every process's ``data`` (a tensor, a number or NumPy array, or a dict, list or tuple
        of them, rebuilt alike): each tensor in it becomes the stack of every process's,
        ``(world_size, *shape)`` in rank order, numbers and arrays becoming tensors on the
        module's device first (as Lightning's: a bool as uint8, an int as int32, a float as
        float32). With one process each tensor comes back as it is.
        ``sync_grads=True`` lets gradients flow back through the gather. A collective: every
        process of ``group`` (the whole world by default) calls it, with tensors of the same
        shapes. Under Fabric, Fabric's ``all_gather``."""
        if self._fabric is not None:
            return self._fabric.all_gather(data, group=group, sync_grads=sync_grads)
        import numpy as np

        from ptrain.distributed import all_gather_tensor

        def gather(value: Any) -> Any:
            if isinstance(value, dict):
                items = [(key, gather(item)) for key, item in value.items()]
                if isinstance(value, collections.defaultdict):
                    return type(value)(value.default_factory, items)
                return type(value)(items)
            if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
                return type(value)(*(gather(item) for item in value))
            if isinstance(value, (list, tuple)):
                return type(value)(gather(item) for item in value)
            if isinstance(value, np.ndarray):
                value = torch.from_numpy(value)
            elif isinstance(value, (bool, int, float)):  # bool as uint8: NCCL has no bool
                dtype = (torch.uint8 if isinstance(value, bool) else  # bool is an int too
                         torch.int32 if isinstance(value, int) else torch.float32)
                value = torch.tensor(value, dtype=dtype)
            if isinstance(value, torch.Tensor):
                return all_gather_tensor(value.to(self.device), group=group,
                                         sync_grads=sync_grads)
            return value

        return gather(data)

    def freeze(self) -> TrainModule:
        """Stop every parameter from requiring gradients and put the module in eval mode."""
        for parameter in self.parameters():
            parameter.requires_grad = False
        return self.eval()

    def unfreeze(self) -> TrainModule:
        """Let every parameter require gradients again and put the module in training mode."""
        for parameter in self.parameters():
            parameter.requires_grad = True
        return self.train()

    def _example_inputs(self, given: Any, what: str) -> Any:
        example = given if given is not None else self.example_input_array
        if example is None:
            raise ModelError(f"{what} needs an example input: pass one, or set "
                             f"self.example_input_array (a tensor, a tuple of positional "
                             f"arguments or a dict of keyword arguments for forward).")
        return export_inputs(example, self.device)

    @torch.no_grad()
    def to_torchscript(self, file_path: Any = None, method: str = "script",
                       example_inputs: Any = None, **kwargs: Any) -> Any:
        """This module as TorchScript, in eval mode (its mode is restored after):
        ``method="script"`` compiles it (``torch.jit.script``); ``"trace"`` records a forward
        pass on ``example_inputs`` (default :attr:`example_input_array`). With ``file_path``
        the result is also saved there (``torch.jit.save``)."""
        if method not in ("script", "trace"):
            raise ConfigError(f"to_torchscript(method={method!r}): valid choices are 'script' "
                              f"and 'trace'.")
        training = self.training
        self.eval()
        try:
            if method == "script":
                with jit_scripting():
                    compiled = torch.jit.script(self, **kwargs)
            else:
                inputs = self._example_inputs(example_inputs, "to_torchscript(method='trace')")
                compiled = torch.jit.trace(self, example_inputs=inputs, **kwargs)
        finally:
            self.train(training)
        if file_path is not None:
            torch.jit.save(compiled, str(file_path))
        return compiled

    @torch.no_grad()
    def to_onnx(self, file_path: Any, input_sample: Any = None, **kwargs: Any) -> Any:
        """Export this module to ONNX at ``file_path`` (``torch.onnx.export``, which needs the
        ``onnx`` package) from a forward pass on ``input_sample`` (default
        :attr:`example_input_array`); ``kwargs`` go to ``torch.onnx.export``."""
        inputs = self._example_inputs(input_sample, "to_onnx")
        training = self.training
        self.eval()
        try:
            return torch.onnx.export(self, inputs, str(file_path), **kwargs)
        finally:
            self.train(training)

    def lr_schedulers(self) -> Any:
        """The LR schedulers ``configure_optimizers`` returned (one, a list, or ``None``), for
        manual optimization."""
        schedulers = [entry["scheduler"] for entry in self.trainer.lr_schedulers]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    # -- to override -------------------------------------------------------------------------

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | dict[str, Any]:
        """One training batch: return the loss (a tensor, or a dict with ``"loss"``). Like every
        step method it may be written without ``batch_idx``: ``training_step(self, batch)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement training_step")

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        """One validation batch: log the metrics to watch (``self.log``). Without it (or with
        ``model.validation_step = None``) ``fit`` runs no validation and ``validate`` is an
        error, as in Lightning."""
        return None

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        """One test batch: log the metrics to report (``self.log``); ``Trainer.test`` returns
        them averaged over the test set."""
        raise NotImplementedError(f"{type(self).__name__} must implement test_step")

    def predict_step(self, batch: Any, batch_idx: int = 0, dataloader_idx: int = 0) -> Any:
        """One prediction batch: return the predictions (under several processes, a tensor or
        a dict/list/tuple of tensors whose first dimension is the batch, so they can be
        gathered in dataset order). The default returns ``self(batch)``, as Lightning's does."""
        return self(batch)

    def configure_model(self) -> None:
        """Create the layers here rather than in ``__init__`` when the model may be too large
        for one process: ptrain calls it in every process, once per module (the first stage
        that runs it; later stages find it done), after ``setup`` and before the model is
        wrapped, inside the strategy's init context (:meth:`ptrain.Trainer.init_module`). Under
        ``fsdp``/``zero3`` the layers are then created on the meta device and each rank gets
        only its shards, initialised by each module's ``reset_parameters()`` to the values the
        model built whole would have had (see :mod:`ptrain.meta_init`). Calling it again
        yourself must be harmless: return early when the layers exist.

        A tensor-parallel plan goes here too, applied with :meth:`parallelize`."""

    def parallelize(self, module: nn.Module, device_mesh: Any, parallelize_plan: Any,
                    **kwargs: Any) -> nn.Module:
        """torch's ``parallelize_module(module, device_mesh, parallelize_plan, **kwargs)``, with
        the run's plugins taking part: call it from :meth:`configure_model` with the arguments
        you would give torch's function (``device_mesh``: the 1-D tensor-parallel mesh, e.g.
        ``self.device_mesh["tp"]``; ``parallelize_plan``: a ``ParallelStyle`` or a dict of
        them by submodule path). First each plugin may adapt the plan and the layers it names
        (the ``modify_parallel_plan`` hook: ``fp8-mixed`` converts the layers it chose to
        float8 and gives them torchao's float8 styles); then torch applies it. Returns
        ``module``, as torch does. Without a trainer it is torch's function alone."""
        from torch.distributed.tensor.parallel import parallelize_module

        plan = (dict(parallelize_plan) if isinstance(parallelize_plan, dict)
                else {"": parallelize_plan})
        if self._trainer is not None:
            self._trainer.hook.modify_parallel_plan(trainer=self._trainer, module=module,
                                                    mesh=device_mesh, plan=plan)
        return parallelize_module(module, device_mesh, plan, **kwargs)

    def configure_optimizers(self) -> Any:
        """Return an optimizer; or a dict ``{"optimizer": opt, "lr_scheduler": sched}`` where the
        scheduler may be a dict ``{"scheduler": s, "interval": "step" | "epoch", "frequency":
        n, "monitor": "val_loss", "strict": True}`` (with ``monitor`` the scheduler steps on
        that logged metric, as ``ReduceLROnPlateau`` needs); or a pair of lists
        ``([optimizers], [schedulers])``; or a list of such dicts."""
        raise NotImplementedError(f"{type(self).__name__} must implement configure_optimizers")

    def train_dataloader(self) -> DataLoader | None:
        return None

    def val_dataloader(self) -> DataLoader | None:
        return None

    def test_dataloader(self) -> DataLoader | None:
        return None

    def predict_dataloader(self) -> DataLoader | None:
        return None

    def prepare_data(self) -> None:
        """Download or write data, once per machine before ``setup`` (see :class:`DataModule`)."""

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None,
                             hparams_file: Any = None, strict: bool | None = None,
                             weights_only: bool | None = None, **overrides: Any) -> TrainModule:
        """A new module built from the hyperparameters saved in the checkpoint, holding the
        checkpoint's weights, in eval mode. ``overrides`` replace or add init arguments (those
        ``__init__`` does not take are left out unless it has ``**kwargs``); ``hparams_file``
        (a ``hparams.yaml`` or ptrain's ``hparams.toml``) replaces the saved hyperparameters.
        As in Lightning, ``configure_model()`` runs before the weights load and
        ``on_load_checkpoint(checkpoint)`` right before them (it may adapt
        ``checkpoint["state_dict"]``). ``strict=False`` tolerates missing and unexpected
        weights. A checkpoint Lightning's Trainer wrote loads too. The file is read with
        torch's weights-only loader unless ``weights_only=False`` says to trust it whole (a
        file of Lightning's whose hyperparameters hold other objects, such as an
        ``argparse.Namespace``), as Lightning reads it then."""
        from ptrain.checkpoint_io import module_weights, safe_load
        from ptrain.hook_methods import loaded_checkpoint_view
        from ptrain.hyperparameters import MODULE_KEYS, loading_arguments, unset_arguments

        checkpoint = safe_load(checkpoint_path, trusted=weights_only is False)
        arguments = loading_arguments(cls, checkpoint, MODULE_KEYS, overrides, hparams_file)
        module = cls(**arguments)
        if type(module).configure_model is not TrainModule.configure_model:
            module.configure_model()
            module._model_configured = True
        weights = module_weights(checkpoint, checkpoint_path)
        if overridden_method(module, "on_load_checkpoint"):
            view = loaded_checkpoint_view(checkpoint, None)
            module.on_load_checkpoint(view)
            weights = view["state_dict"]
        try:
            module.load_state_dict(weights, strict=True if strict is None else strict)
        except RuntimeError as error:
            unsaved = unset_arguments(cls, arguments, required=False)
            if not unsaved:
                raise
            # a value that could not be saved (an object of a class torch's weights-only
            # loader does not know) took its default, and the layers it sizes differ
            raise RuntimeError(
                f"{error}\nThe checkpoint holds no value for {', '.join(unsaved)}, so "
                f"{cls.__qualname__} was built with the default; a hyperparameter checkpoints "
                f"can't hold is left out of them. Pass it again: "
                f"{cls.__qualname__}.load_from_checkpoint(path, {unsaved[0]}=...).") from None
        if map_location is not None:
            module.to(map_location)
        return module.eval()

    # -- to call -----------------------------------------------------------------------------

    def log(self, name: str, value: Any, prog_bar: bool = False, logger: bool | None = None,
            on_step: bool | None = None, on_epoch: bool | None = None,
            reduce_fx: Any = "mean", enable_graph: bool = False, sync_dist: bool = False,
            sync_dist_group: Any = None, add_dataloader_idx: bool = True,
            batch_size: int | None = None, metric_attribute: str | None = None,
            rank_zero_only: bool = False) -> None:
        """Record a metric, with Lightning's arguments and meaning (see :mod:`ptrain.metrics`
        for the names published and the defaults of ``on_step``/``on_epoch``). The value (a
        number, a one-element tensor or a ``torchmetrics.Metric``) stays on the device until
        it is published: no host sync here.

        ``logger=False``: in ``callback_metrics`` and the progress bar, not sent to the loggers.
        ``reduce_fx``: the epoch aggregate, ``"mean"`` (weighted by ``batch_size``, read from
        the batch when not given), ``"sum"``, ``"max"`` or ``"min"`` (also as ``torch.mean``,
        ``max``, ...); values reduced across processes are reduced with it too. Every published
        value is reduced across processes, so ``sync_dist`` (either value) and
        ``sync_dist_group=None`` are what ptrain always does; ``rank_zero_only=True`` leaves the
        value unreduced (for a value logged on rank 0 alone; callbacks on the other processes
        don't see it, as in Lightning). ``add_dataloader_idx``: under several evaluation
        dataloaders the name gets ``/dataloader_idx_N`` (``False``: name them yourself).
        Refused: ``enable_graph=True`` (published values are detached) and another
        ``sync_dist_group``. A ``torchmetrics.Metric`` must be an attribute of the module
        (its state moves and is saved with it), or be named with ``metric_attribute``, as in
        Lightning. Outside a stage (no trainer attached) the call records nothing and warns;
        in ``predict_step`` it is an error.
        """
        if enable_graph:
            raise ConfigError(f"self.log({name!r}, ..., enable_graph=True) is not supported: "
                              f"ptrain publishes detached values. Remove enable_graph, and "
                              f"keep the tensor yourself where a graph through it is needed.")
        if sync_dist_group is not None:
            raise ConfigError(f"self.log({name!r}, ..., sync_dist_group=...) is not supported: "
                              f"values are reduced over all processes. Remove sync_dist_group.")
        if self._trainer is None:
            warnings.warn(f"self.log({name!r}, ...) records nothing: {type(self).__qualname__} "
                          f"is not attached to a Trainer (it is while fit, validate or test "
                          f"runs it).", stacklevel=2)
            return
        if metric_attribute is None and isinstance(value, nn.Module):
            self._check_metric_attribute(name, value)
        self._trainer.metrics.log(name, value, prog_bar, on_step, on_epoch,
                                  logger=logger is not False, reduce_fx=reduce_fx,
                                  batch_size=batch_size, add_dataloader_idx=add_dataloader_idx,
                                  reduced=not rank_zero_only)

    def _check_metric_attribute(self, name: str, metric: nn.Module) -> None:
        """A metric object logged must be one of this module's submodules, as Lightning
        requires: else it is not moved with the module, nor saved with it."""
        known = self.__dict__.get("_metric_ids")  # found once; again when one is missing
        if known is not None and id(metric) in known:
            return
        named = {n: m for n, m in self.named_modules()
                 if all(callable(getattr(m, a, None)) for a in ("update", "compute", "reset"))}
        self.__dict__["_metric_ids"] = {id(m) for m in named.values()}
        if id(metric) in self.__dict__["_metric_ids"]:
            return
        found = [n for n in named if n]
        if not found:
            raise ConfigError(f"self.log({name!r}, metric): the metric is not an attribute of "
                              f"{type(self).__qualname__}, so it would neither move to the "
                              f"device with the module nor be saved with it. Make it one "
                              f"(self.NAME = Metric(...) in __init__) and log that one.")
        raise ConfigError(f"self.log({name!r}, metric): the metric is not an attribute of "
                          f"{type(self).__qualname__}; log the one the module holds, or name "
                          f"it: self.log({name!r}, ..., metric_attribute=NAME) with NAME one "
                          f"of {found}.")

    def log_dict(self, dictionary: dict[str, Any], prog_bar: bool = False,
                 logger: bool | None = None, on_step: bool | None = None,
                 on_epoch: bool | None = None, reduce_fx: Any = "mean",
                 enable_graph: bool = False, sync_dist: bool = False,
                 sync_dist_group: Any = None, add_dataloader_idx: bool = True,
                 batch_size: int | None = None, rank_zero_only: bool = False) -> None:
        """:meth:`log` for each entry of ``dictionary``, with the same arguments."""
        for name, value in dictionary.items():
            self.log(name, value, prog_bar=prog_bar, logger=logger, on_step=on_step,
                     on_epoch=on_epoch, reduce_fx=reduce_fx, enable_graph=enable_graph,
                     sync_dist=sync_dist, sync_dist_group=sync_dist_group,
                     add_dataloader_idx=add_dataloader_idx, batch_size=batch_size,
                     rank_zero_only=rank_zero_only)

    @property
    def loggers(self) -> list[Any]:
        """The run's logger plugins (those implementing ``log_metrics`` or
        ``log_hyperparams``); on processes other than global rank 0, a stand-in for each whose
        every method and attribute does nothing, so logging code needs no rank check, but for
        a logger with the attribute ``serves_every_rank = True``, whose own methods act on rank
        0 only (Lightning's loggers: their ``log_dir`` and ``version`` answer on every rank)."""
        if self._fabric is not None:
            return self._fabric.loggers
        if self._trainer is None:
            return []
        found = self._trainer.loggers
        if self.global_rank == 0:
            return found
        return [logger if getattr(logger, "serves_every_rank", False) else NoOpLogger()
                for logger in found]

    @property
    def logger(self) -> Any:
        """The first of :attr:`loggers` (``self.logger.experiment`` is TensorBoard's
        ``SummaryWriter`` with the ``tensorboard`` logger), or ``None`` without any."""
        if self._fabric is not None:
            return self._fabric.logger  # Fabric's own rule (an IndexError without loggers)
        loggers = self.loggers
        return loggers[0] if loggers else None

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Leave gradients on for ``optimizer``'s parameters only, among the parameters of the
        run's optimizers (manual optimization with several optimizers, as in a GAN): those of
        the other optimizers stop requiring gradients, a parameter no optimizer holds keeps its
        setting, and one that was frozen stays frozen. :meth:`untoggle_optimizer` (or leaving
        :meth:`toggled_optimizer`) puts every setting back."""
        state = self._param_requires_grad_state
        for other in self._run_optimizers():
            for group in getattr(other, "optimizer", other).param_groups:
                for parameter in group["params"]:
                    if parameter not in state:
                        state[parameter] = parameter.requires_grad
                    parameter.requires_grad = False
        for group in getattr(optimizer, "optimizer", optimizer).param_groups:
            for parameter in group["params"]:
                parameter.requires_grad = state.get(parameter, parameter.requires_grad)

    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Undo :meth:`toggle_optimizer`: every parameter's ``requires_grad`` as before."""
        state = self._param_requires_grad_state
        for parameter, requires_grad in state.items():
            parameter.requires_grad = requires_grad
        state.clear()

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Any) -> Iterator[None]:
        """:meth:`toggle_optimizer` for the ``with`` block, then :meth:`untoggle_optimizer`."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    @property
    def _param_requires_grad_state(self) -> dict[Any, bool]:
        """Parameter -> its ``requires_grad`` before :meth:`toggle_optimizer` (empty when
        nothing is toggled)."""
        return self.__dict__.setdefault("_toggled", {})

    def _run_optimizers(self) -> list[Any]:
        if self._fabric is not None:
            return list(self.__dict__.get("_fabric_optimizers", []))
        return list(self.trainer.optimizers)

    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        """The optimizer (or list of them) for manual optimization; their ``step()`` runs the
        trainer's hooks (unscaling, clipping, the precision's step). ``use_pl_optimizer=False``
        gives the optimizers themselves (stepping one then bypasses the run's precision and
        strategy). Under Fabric, Fabric's optimizers."""
        if self._fabric is not None:
            found = list(self.__dict__.get("_fabric_optimizers", []))
        elif use_pl_optimizer:
            found = [ManualOptimizer(self.trainer, opt) for opt in self.trainer.optimizers]
        else:
            found = list(self.trainer.optimizers)
        return found[0] if len(found) == 1 else found

    def clip_gradients(self, optimizer: Any, gradient_clip_val: float | None = None,
                       gradient_clip_algorithm: str | None = None) -> None:
        """Clip ``optimizer``'s gradients now, by norm or by value, through the run's
        ``clip_gradients`` hook (so a sharding strategy clips its shards correctly). For
        ``configure_gradient_clipping`` and manual optimization. A value left ``None`` is the
        trainer's (``gradient_clip_val`` unset or 0: nothing is clipped; the algorithm defaults
        to ``"norm"``). A value that contradicts one the trainer was given is a
        :class:`ConfigError`, as in Lightning: the trainer's setting would silently not
        apply."""
        if gradient_clip_algorithm is not None:
            gradient_clip_algorithm = getattr(gradient_clip_algorithm, "value",
                                              gradient_clip_algorithm)  # Lightning's enum
            if gradient_clip_algorithm not in ("norm", "value"):
                raise ConfigError(f"clip_gradients(gradient_clip_algorithm="
                                  f"{gradient_clip_algorithm!r}): valid choices are 'norm' "
                                  f"and 'value'.")
        if self._fabric is not None:
            self._fabric.clip_gradients(
                self, optimizer,
                clip_val=gradient_clip_val if gradient_clip_algorithm == "value" else None,
                max_norm=gradient_clip_val if gradient_clip_algorithm != "value" else None)
            return
        trainer = self.trainer
        given_val, given_algorithm = trainer.gradient_clip_val, trainer.gradient_clip_algorithm
        if gradient_clip_val is None:
            gradient_clip_val = given_val
        elif given_val is not None and given_val != gradient_clip_val:
            raise ConfigError(
                f"clip_gradients(gradient_clip_val={gradient_clip_val}) contradicts the "
                f"trainer's gradient_clip_val={given_val}: one of them would silently not "
                f"apply. Give the value in one place: remove gradient_clip_val from the "
                f"trainer, or call clip_gradients(optimizer) to clip with the trainer's.")
        if gradient_clip_algorithm is None:
            gradient_clip_algorithm = given_algorithm or "norm"
        elif given_val is not None and given_algorithm not in (None, gradient_clip_algorithm):
            raise ConfigError(
                f"clip_gradients(gradient_clip_algorithm={gradient_clip_algorithm!r}) "
                f"contradicts the trainer's gradient_clip_algorithm={given_algorithm!r}: give "
                f"the algorithm in one place.")
        if not gradient_clip_val:
            return
        trainer.gradient_clip_val = gradient_clip_val
        trainer.gradient_clip_algorithm = gradient_clip_algorithm
        try:
            trainer.step_hooks.clip_gradients(trainer=trainer,
                                              optimizer=getattr(optimizer, "optimizer", optimizer))
        finally:
            trainer.gradient_clip_val, trainer.gradient_clip_algorithm = given_val, \
                given_algorithm

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward through the active precision and strategy plugins (the ``backward`` hook).
        Under a multi-process strategy the gradients are synchronised unless
        ``trainer.sync_gradients`` is ``False`` (see ``ptrain_toggling.toggle_model``).
        ``args``/``kwargs`` (``retain_graph=True``...) go to ``loss.backward``, through the
        module's :meth:`backward`."""
        if not (args or kwargs):
            self.trainer.run_backward(loss)
            return
        pending = self.__dict__["_backward_arguments"] = [args, kwargs]
        try:
            self.trainer.run_backward(loss)
        finally:
            self.__dict__["_backward_arguments"] = None
        if pending[0] is not None:  # nobody took them: another plugin did the backward
            given = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
            raise ModelError(
                f"manual_backward(loss, {given}): a plugin of this run (the precision's loss "
                f"scaling, a sharding engine) did the backward pass itself and could not take "
                f"these arguments, so they were dropped. Call manual_backward(loss) alone "
                f"under this plugin.")


_SCRIPTING = [False]


@contextlib.contextmanager
def jit_scripting() -> Iterator[None]:
    """While ``torch.jit.script`` compiles a module: :attr:`TrainModule.trainer` answers
    ``None`` instead of raising (the compiler reads every attribute)."""
    _SCRIPTING[0] = True
    try:
        yield
    finally:
        _SCRIPTING[0] = False


def export_inputs(example: Any, device: torch.device) -> Any:
    """``example`` (a tensor, a tuple or a dict of them) on ``device``, as the exporters take
    it: a tuple of positional arguments (a dict of keyword arguments goes last, in the tuple)."""
    from ptrain.data import move_to_device

    example = move_to_device(example, device)
    if isinstance(example, dict):
        return (example,)
    return example if isinstance(example, tuple) else (example,)


class NoOpLogger:
    """What :attr:`TrainModule.loggers` holds on processes other than global rank 0: every
    attribute is this object again and calling it does nothing (``experiment.add_image(...)``
    included)."""

    def __getattr__(self, name: str) -> NoOpLogger:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> NoOpLogger:
        return self


class ManualOptimizer:
    """An optimizer as a manually-optimizing module sees it: ``step()`` goes through the trainer's
    ``on_before_optimizer_step``, ``clip_gradients`` and ``optimizer_step`` hooks and counts
    towards ``trainer.global_step``; everything else is the optimizer's own. ``optimizer`` is the
    one in ``trainer.optimizers``."""

    def __init__(self, trainer: Trainer, optimizer: torch.optim.Optimizer):
        self.trainer = trainer
        self.optimizer = optimizer

    def step(self, closure: Any = None, **kwargs: Any) -> Any:
        """Step the optimizer through the run's hooks. ``closure`` (a function computing the
        loss and calling ``manual_backward``) runs first, once, as Lightning runs it before
        ``on_before_optimizer_step``; its result is returned."""
        if kwargs:
            raise ModelError(
                f"optimizer.step({', '.join(f'{k}=...' for k in kwargs)}): ptrain steps the "
                f"optimizer through the run's optimizer_step hook (the precision's scaler, the "
                f"strategy), which passes no arguments to the optimizer's step, so these would "
                f"be silently dropped. Call optimizer.step() or optimizer.step(closure).")
        result = closure() if closure is not None else None
        self.trainer.run_optimizer_step(self.optimizer)
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


class DataModule(HyperParametersMixin):
    """Data kept apart from the model: the dataloaders of the stages (``train_dataloader()``,
    ``val_dataloader()``, ``test_dataloader()``, ``predict_dataloader()``).

    In each stage: ``prepare_data()`` once per machine (in the process of local rank 0, the
    others waiting; download or write to disk there, assign no state, since the other processes
    do not run it), then ``setup(stage)`` in every process before the dataloaders are requested
    (``stage`` is ``"fit"``, ``"validate"``, ``"test"`` or ``"predict"``; split or assign state
    there), and ``teardown(stage)`` at the end, also after an error. ``state_dict()`` (if not
    empty) is saved in every checkpoint and handed to ``load_state_dict`` on resume.
    """

    #: where a checkpoint holds what :meth:`save_hyperparameters` recorded (Lightning's names)
    CHECKPOINT_HYPER_PARAMS_KEY = "datamodule_hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "datamodule_hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "datamodule_hparams_type"

    @classmethod
    def from_datasets(cls, train_dataset: Any = None, val_dataset: Any = None,
                      test_dataset: Any = None, predict_dataset: Any = None,
                      batch_size: int = 1, num_workers: int = 0,
                      **datamodule_kwargs: Any) -> DataModule:
        """A datamodule whose dataloaders read the given datasets (each a dataset, or a list
        or dict of them for several dataloaders): batches of ``batch_size``, loaded by
        ``num_workers`` processes, the training data shuffled (unless iterable). ``cls`` is
        built with ``datamodule_kwargs``, and with ``batch_size``/``num_workers`` where its
        ``__init__`` takes them (or ``**kwargs``)."""
        from torch.utils.data import DataLoader, IterableDataset

        def loaders(datasets: Any, shuffle: bool) -> Any:
            def one(dataset: Any) -> DataLoader:
                return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                                  shuffle=shuffle and not isinstance(dataset, IterableDataset),
                                  pin_memory=torch.cuda.is_available())

            if isinstance(datasets, dict):
                return {name: one(d) for name, d in datasets.items()}
            if isinstance(datasets, (list, tuple)):
                return [one(d) for d in datasets]
            return one(datasets)

        params = ({} if cls.__init__ is object.__init__
                  else inspect.signature(cls.__init__).parameters)
        takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
        special = {k: v for k, v in (("batch_size", batch_size), ("num_workers", num_workers))
                   if takes_all or k in params}
        datamodule = cls(**datamodule_kwargs, **special)
        for name, datasets, shuffle in (("train_dataloader", train_dataset, True),
                                        ("val_dataloader", val_dataset, False),
                                        ("test_dataloader", test_dataset, False),
                                        ("predict_dataloader", predict_dataset, False)):
            if datasets is not None:
                setattr(datamodule, name, lambda d=datasets, s=shuffle: loaders(d, s))
        return datamodule

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None,
                             hparams_file: Any = None, weights_only: bool | None = None,
                             **overrides: Any) -> DataModule:
        """A new datamodule built from the hyperparameters a checkpoint saved for it
        (``overrides`` and ``hparams_file`` as in :meth:`TrainModule.load_from_checkpoint`),
        holding the state its ``state_dict()`` saved; ``weights_only`` as there."""
        from ptrain.checkpoint_io import safe_load
        from ptrain.hyperparameters import DATAMODULE_KEYS, loading_arguments

        checkpoint = safe_load(checkpoint_path, trusted=weights_only is False)
        datamodule = cls(**loading_arguments(cls, checkpoint, DATAMODULE_KEYS, overrides,
                                             hparams_file))
        if checkpoint.get("datamodule_state"):
            datamodule.load_state_dict(checkpoint["datamodule_state"])
        return datamodule

    def __str__(self) -> str:
        """The size of each stage's dataset (``size=NA`` without a length; ``None`` where the
        stage has no dataloader, or asking for it fails), one line per stage, as Lightning
        prints a datamodule."""
        lines = []
        for label, method in (("Train", "train_dataloader"), ("Validation", "val_dataloader"),
                              ("Test", "test_dataloader"), ("Predict", "predict_dataloader")):
            try:
                loader = getattr(self, method)()
            except Exception:  # a dataloader that needs setup first: not available yet
                loader = None
            lines.append(f"{{{label} dataloader: {_loader_sizes(loader)}}}")
        return os.linesep.join(lines)

    @property
    def trainer(self) -> Trainer | None:
        """The trainer running a stage with this datamodule (the last one, after it), else
        ``None``, as in Lightning."""
        return self.__dict__.get("_trainer")

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        self.__dict__["_trainer"] = trainer

    def __getstate__(self) -> dict[str, Any]:
        # pickled for a worker process: the trainer it was last attached to stays behind
        return {k: v for k, v in self.__dict__.items() if k != "_trainer"}

    def prepare_data(self) -> None:
        pass

    def setup(self, stage: str) -> None:
        pass

    def teardown(self, stage: str) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def train_dataloader(self) -> DataLoader | None:
        return None

    def val_dataloader(self) -> DataLoader | None:
        return None

    def test_dataloader(self) -> DataLoader | None:
        return None

    def predict_dataloader(self) -> DataLoader | None:
        return None


def _loader_sizes(loader: Any) -> str:
    """``size=N`` of a dataloader's dataset (``size=NA`` without a length), numbered for
    several; ``None`` for none."""
    def size(one: Any) -> str:
        dataset = getattr(one, "dataset", None)
        try:
            return f"size={len(dataset)}"
        except TypeError:
            return "size=NA"

    if loader is None:
        return "None"
    if isinstance(loader, dict):
        loader = list(loader.values())
    if isinstance(loader, (list, tuple)):
        return " ; ".join(f"{i}. {size(one)}" for i, one in enumerate(loader, 1))
    return size(loader)
