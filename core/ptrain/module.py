"""The user's side of the contract: :class:`TrainModule` and :class:`DataModule`.

Shaped like Lightning's ``LightningModule`` and ``LightningDataModule`` so that a model is ported
by changing its imports.
"""

from __future__ import annotations

import inspect
import itertools
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ptrain.errors import ModelError
from ptrain.hook_methods import ModuleHookMethods
from ptrain.hyperparameters import HyperParametersMixin, restored_hyperparameters

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

    def __init__(self) -> None:
        super().__init__()
        self._trainer: Trainer | None = None

    def __getstate__(self) -> dict[str, Any]:
        # pickled for a worker process: the trainer it was last attached to stays behind
        return {**super().__getstate__(), "_trainer": None}

    @property
    def trainer(self) -> Trainer:
        if self._trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer; this is "
                               f"only available during fit() or validate().")
        return self._trainer

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

    def predict_step(self, batch: Any, batch_idx: int = 0) -> Any:
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
        yourself must be harmless: return early when the layers exist."""

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
    def load_from_checkpoint(cls, checkpoint_path: str, map_location: Any = None,
                             **overrides: Any) -> TrainModule:
        """A new module built from the hyperparameters saved in the checkpoint (``overrides``
        replace or add init arguments; those ``__init__`` does not take are left out unless it
        has ``**kwargs``), holding the checkpoint's weights, in eval mode."""
        from ptrain.checkpoint_io import safe_load

        checkpoint = safe_load(checkpoint_path)
        arguments = {**restored_hyperparameters(checkpoint.get("hyper_parameters")),
                     **overrides}
        params = inspect.signature(cls).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            # hyperparameters recorded by a base class's __init__ that this class does not take
            arguments = {k: v for k, v in arguments.items() if k in params}
        module = cls(**arguments)
        module.load_state_dict(checkpoint["model"])
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
        the batch when not given), ``"sum"``, ``"max"`` or ``"min"``. Every published value is
        reduced across processes, so ``sync_dist`` (either value) and ``sync_dist_group=None``
        are what ptrain always does; ``enable_graph=True``, another ``sync_dist_group`` and
        ``rank_zero_only=True`` are refused (ptrain's published values are detached and the
        same on every rank). ``metric_attribute`` is accepted for a Metric logged by name.
        Outside a stage (no trainer attached) the call records nothing; in ``predict_step``
        it is an error.
        """
        for argument, value_given, refused in (
                ("enable_graph", enable_graph, True), ("rank_zero_only", rank_zero_only, True)):
            if value_given is refused:
                raise ModelError(f"self.log({name!r}, ..., {argument}={refused}) is not supported:"
                                 f" ptrain publishes detached values reduced over every process, "
                                 f"the same on every rank. Remove {argument}.")
        if sync_dist_group is not None:
            raise ModelError(f"self.log({name!r}, ..., sync_dist_group=...) is not supported: "
                             f"values are reduced over all processes. Remove sync_dist_group.")
        if self._trainer is not None:
            self._trainer.metrics.log(name, value, prog_bar, on_step, on_epoch,
                                      logger=logger is not False, reduce_fx=reduce_fx,
                                      batch_size=batch_size)

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
        every method and attribute does nothing, so logging code needs no rank check."""
        if self._trainer is None:
            return []
        found = self._trainer.loggers
        return found if self.global_rank == 0 else [NoOpLogger() for _ in found]

    @property
    def logger(self) -> Any:
        """The first of :attr:`loggers` (``self.logger.experiment`` is TensorBoard's
        ``SummaryWriter`` with the ``tensorboard`` logger), or ``None`` without any."""
        loggers = self.loggers
        return loggers[0] if loggers else None

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Let only ``optimizer``'s parameters require gradients (manual optimization with
        several optimizers, as in a GAN); :meth:`untoggle_optimizer` restores every
        parameter's ``requires_grad``."""
        inner = getattr(optimizer, "optimizer", optimizer)
        own = {id(p) for group in inner.param_groups for p in group["params"]}
        if "_toggled" not in self.__dict__ or not self.__dict__["_toggled"]:
            self.__dict__["_toggled"] = {p: p.requires_grad for p in self.parameters()}
        for parameter in self.parameters():
            if id(parameter) not in own:
                parameter.requires_grad = False
            else:
                parameter.requires_grad = self.__dict__["_toggled"][parameter]

    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Undo :meth:`toggle_optimizer`: every parameter's ``requires_grad`` as before."""
        for parameter, requires_grad in self.__dict__.pop("_toggled", {}).items():
            parameter.requires_grad = requires_grad

    def optimizers(self) -> Any:
        """The optimizer (or list of them) for manual optimization; their ``step()`` runs the
        trainer's hooks (unscaling, clipping, the precision's step)."""
        wrapped = [ManualOptimizer(self.trainer, opt) for opt in self.trainer.optimizers]
        return wrapped[0] if len(wrapped) == 1 else wrapped

    def clip_gradients(self, optimizer: Any, gradient_clip_val: float | None = None,
                       gradient_clip_algorithm: str | None = None) -> None:
        """Clip ``optimizer``'s gradients now, by norm (default) or value, through the run's
        ``clip_gradients`` hook (so a sharding strategy clips its shards correctly);
        ``gradient_clip_val=None`` clips nothing. For ``configure_gradient_clipping`` and manual
        optimization."""
        if gradient_clip_val is None:
            return
        if gradient_clip_algorithm not in (None, "norm", "value"):
            raise ModelError(f"clip_gradients(gradient_clip_algorithm={gradient_clip_algorithm!r})"
                             f": valid choices are 'norm' and 'value'.")
        trainer = self.trainer
        saved = trainer.gradient_clip_val, trainer.gradient_clip_algorithm
        trainer.gradient_clip_val = gradient_clip_val
        trainer.gradient_clip_algorithm = gradient_clip_algorithm or "norm"
        try:
            trainer.step_hooks.clip_gradients(trainer=trainer,
                                              optimizer=getattr(optimizer, "optimizer", optimizer))
        finally:
            trainer.gradient_clip_val, trainer.gradient_clip_algorithm = saved

    def manual_backward(self, loss: torch.Tensor) -> None:
        """Backward through the active precision and strategy plugins (the ``backward`` hook).
        Under a multi-process strategy the gradients are synchronised unless
        ``trainer.sync_gradients`` is ``False`` (see ``ptrain_toggling.toggle_model``)."""
        self.trainer.run_backward(loss)


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

    def step(self) -> None:
        self.trainer.run_optimizer_step(self.optimizer)

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
