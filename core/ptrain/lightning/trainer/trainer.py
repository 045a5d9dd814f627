"""``lightning.pytorch.trainer.trainer``: ``Trainer``, Lightning's signature over
:class:`ptrain.Trainer`."""

from __future__ import annotations

import collections.abc
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from ptrain.errors import CheckpointError, ConfigError
from ptrain.lightning._common import refuse
from ptrain.lightning._selection import select
from ptrain.module import DataModule
from ptrain.trainer import Trainer as _Trainer

class Trainer(_Trainer):
    """Lightning's ``Trainer(...)``: each argument keeps its Lightning meaning and becomes a
    ptrain option, callback selection or plugin; a value ptrain can't honour is refused with a
    :class:`ConfigError` naming it and what to do. ``plugin_options`` and ``seed`` are ptrain's
    own extras. The run folder is Lightning's: ``default_root_dir/lightning_logs/version_N``, or
    the first logger's ``save_dir/name/version_N``.

    Also Lightning's attribute names: ``lightning_module``, ``logger``,
    ``logged_metrics``, ``progress_bar_metrics``, ``checkpoint_callback``,
    ``early_stopping_callback``, ``training``/``validating``/``testing``/``predicting``, and
    Lightning's objects for the run's ``accelerator``, ``strategy`` and ``profiler``.
    """

    def __init__(self, *, accelerator: Any = "auto", strategy: Any = "auto",
                 devices: Any = "auto", num_nodes: int = 1, precision: Any = None,
                 logger: Any = None, callbacks: Any = None, fast_dev_run: int | bool = False,
                 max_epochs: int | None = None, min_epochs: int | None = None,
                 max_steps: int = -1, min_steps: int | None = None, max_time: Any = None,
                 limit_train_batches: int | float | None = None,
                 limit_val_batches: int | float | None = None,
                 limit_test_batches: int | float | None = None,
                 limit_predict_batches: int | float | None = None,
                 overfit_batches: int | float = 0.0,
                 val_check_interval: int | float | None = None,
                 check_val_every_n_epoch: int | None = 1,
                 num_sanity_val_steps: int | None = None, log_every_n_steps: int | None = None,
                 enable_checkpointing: bool | None = None,
                 enable_progress_bar: bool | None = None,
                 enable_model_summary: bool | None = None, accumulate_grad_batches: int = 1,
                 gradient_clip_val: int | float | None = None,
                 gradient_clip_algorithm: str | None = None, deterministic: Any = None,
                 benchmark: bool | None = None, inference_mode: bool = True,
                 use_distributed_sampler: bool = True, profiler: Any = None,
                 detect_anomaly: bool = False, barebones: bool = False, plugins: Any = None,
                 sync_batchnorm: bool = False, reload_dataloaders_every_n_epochs: int = 0,
                 default_root_dir: Any = None, enable_autolog_hparams: bool = True,
                 model_registry: str | None = None,
                 plugin_options: dict[str, dict[str, Any]] | None = None,
                 seed: int | None = None):
        given = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        options, loggers, implied_options = _translate(given)
        if implied_options:  # what Lightning's objects and names imply, per plugin
            plugin_options = dict(plugin_options or {})
            for name, implied in implied_options.items():
                plugin_options[name] = {**implied, **plugin_options.get(name, {})}
        super().__init__(plugin_options=plugin_options, **options)
        self._init_kwargs = given  # a worker rebuilds this trainer from Lightning's arguments
        self._given_loggers = loggers
        if benchmark is not None:  # Lightning sets it for the process, as here
            torch.backends.cudnn.benchmark = benchmark

    # -- Lightning's stage signatures ---------------------------------------------------------

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super()._run(*args, **kwargs)
        finally:  # the loggers' log_dir, also where the stage ran in worker processes
            for logger in self._given_loggers:
                if hasattr(logger, "_run_dir") and self._own_log_dir is not None:
                    logger._run_dir = str(self._own_log_dir)

    def fit(self, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None,
            datamodule: Any = None, ckpt_path: str | None = None,
            weights_only: bool | None = None) -> None:
        if isinstance(train_dataloaders, DataModule):  # fit(model, datamodule) positionally
            train_dataloaders, datamodule = None, train_dataloaders
        ckpt_path = self._checkpoint_argument(ckpt_path, weights_only)
        super().fit(model, datamodule, ckpt_path, train_dataloaders=train_dataloaders,
                    val_dataloaders=val_dataloaders)

    def validate(self, model: Any = None, dataloaders: Any = None, ckpt_path: str | None = None,
                 verbose: bool = True, datamodule: Any = None,
                 weights_only: bool | None = None) -> list[dict[str, float]]:
        model, dataloaders, datamodule = self._stage_arguments(model, dataloaders, datamodule)
        ckpt_path = self._checkpoint_argument(ckpt_path, weights_only)
        return super().validate(model, datamodule, ckpt_path, dataloaders=dataloaders)

    def test(self, model: Any = None, dataloaders: Any = None, ckpt_path: str | None = None,
             verbose: bool = True, datamodule: Any = None,
             weights_only: bool | None = None) -> list[dict[str, float]]:
        model, dataloaders, datamodule = self._stage_arguments(model, dataloaders, datamodule)
        ckpt_path = self._checkpoint_argument(ckpt_path, weights_only)
        return super().test(model, datamodule, ckpt_path, dataloaders=dataloaders)

    def predict(self, model: Any = None, dataloaders: Any = None, datamodule: Any = None,
                return_predictions: bool | None = None, ckpt_path: str | None = None,
                weights_only: bool | None = None) -> list[Any] | None:
        model, dataloaders, datamodule = self._stage_arguments(model, dataloaders, datamodule)
        ckpt_path = self._checkpoint_argument(ckpt_path, weights_only)
        return super().predict(model, datamodule, ckpt_path,
                               return_predictions=return_predictions is not False,
                               dataloaders=dataloaders)

    def _checkpoint_argument(self, ckpt_path: Any, weights_only: bool | None) -> str | None:
        """Lightning's meanings: ``ckpt_path="last"`` with no last checkpoint to find starts
        from scratch with a warning (ptrain's own ``"last"`` is an error then);
        ``weights_only=False`` allows nothing more, since ptrain's checkpoints always load
        with torch's weights-only loader (said once)."""
        if weights_only is False:
            warnings.warn("weights_only=False: ptrain's checkpoints hold only tensors and plain "
                          "values and always load with torch's weights-only loader; there is "
                          "nothing more to allow.", stacklevel=3)
        if ckpt_path is None:
            return None
        ckpt_path = os.fspath(ckpt_path)
        if ckpt_path == "last":
            try:
                self.resolve_ckpt_path("last")
            except CheckpointError as exc:
                warnings.warn(f"ckpt_path='last' found no checkpoint to resume, so fit starts "
                              f"from scratch, as in Lightning: {exc}", stacklevel=3)
                return None
        return ckpt_path

    def _stage_arguments(self, model: Any, dataloaders: Any, datamodule: Any) -> tuple:
        if isinstance(dataloaders, DataModule):
            dataloaders, datamodule = None, dataloaders
        if model is None:  # Lightning: the model of the last fit
            if self.module is None:
                raise ConfigError("no model was given and this trainer has not run fit(); pass "
                                  "the model: trainer.test(model, ...).")
            model = self.module
        return model, dataloaders, datamodule

    # -- Lightning's attribute names ----------------------------------------------------------

    @property
    def lightning_module(self) -> Any:
        return self.module

    @property
    def logger(self) -> Any:
        loggers = self.loggers
        return loggers[0] if loggers else None

    @property
    def logged_metrics(self) -> dict[str, float]:
        return self.metrics.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        return self.metrics.progress_values()

    @property
    def checkpoint_callback(self) -> Any:
        """The first of :attr:`checkpoint_callbacks`, or ``None``."""
        return next(iter(self.checkpoint_callbacks), None)

    @property
    def checkpoint_callbacks(self) -> list[Any]:
        """The run's checkpoint callbacks (``ModelCheckpoint`` and its kind), in order."""
        from ptrain.builtins.checkpoint import ModelCheckpoint

        return [p for p in self.plugins.values() if isinstance(p, ModelCheckpoint)]

    @property
    def early_stopping_callback(self) -> Any:
        """The first of :attr:`early_stopping_callbacks`, or ``None``."""
        return next(iter(self.early_stopping_callbacks), None)

    @property
    def early_stopping_callbacks(self) -> list[Any]:
        """The run's ``EarlyStopping`` callbacks, in order."""
        try:
            from ptrain_early_stopping import EarlyStopping
        except ImportError:  # the distribution is not installed: there can be none
            return []
        return [p for p in self.plugins.values() if isinstance(p, EarlyStopping)]

    @property
    def training(self) -> bool:
        return self.stage == "train"

    @property
    def validating(self) -> bool:
        return self.stage == "validate" and not self.sanity_checking

    @property
    def testing(self) -> bool:
        return self.stage == "test"

    @property
    def predicting(self) -> bool:
        return self.stage == "predict"

    # Lightning's objects for the run's plugins (ptrain's option values stay in self.options)

    @property
    def accelerator(self) -> Any:
        """The run's accelerator as Lightning's :class:`~ptrain.lightning.accelerators.
        Accelerator` (``CPUAccelerator``, ...)."""
        from ptrain.lightning.accelerators import lightning_accelerator

        return lightning_accelerator(self)

    @accelerator.setter
    def accelerator(self, value: Any) -> None:  # the native Trainer sets its option value
        pass

    @property
    def strategy(self) -> Any:
        """The run's strategy as Lightning's :class:`~ptrain.lightning.strategies.Strategy`,
        answering for this trainer (``world_size``, ``barrier()``, ``reduce()``, ...)."""
        if getattr(self, "_lightning_strategy", None) is None:
            from ptrain.lightning.strategies import bound_strategy

            self._lightning_strategy = bound_strategy(self, self._init_kwargs.get("strategy"))
        return self._lightning_strategy

    @strategy.setter
    def strategy(self, value: Any) -> None:  # the native Trainer sets its option value
        self._lightning_strategy = None

    @property
    def profiler(self) -> Any:
        """The run's profiler (``PassThroughProfiler`` without one): ``with
        trainer.profiler.profile("name"):`` times a block of your code in its report."""
        profiler = self._init_kwargs.get("profiler")
        if profiler is None:
            from ptrain.lightning.profilers import PassThroughProfiler

            profiler = self._init_kwargs["profiler"] = PassThroughProfiler()
        return profiler


def _as_list(value: Any) -> list[Any]:
    """``callbacks=``/``logger=`` as a list: ``None`` is none, a sequence (a list, a tuple,
    Hydra's ``ListConfig``) its items, anything else the one object."""
    if value is None:
        return []
    if isinstance(value, collections.abc.Sequence) and not isinstance(value, (str, bytes)):
        return list(value)
    return [value]


def _translate(given: dict[str, Any]
               ) -> tuple[dict[str, Any], list[Any], dict[str, dict[str, Any]]]:
    """Lightning's arguments -> ptrain's Trainer options, the logger objects, and the options
    Lightning's objects and names imply for the plugins they select (plugin name -> options;
    see :mod:`ptrain.lightning._selection` for ``accelerator``, ``strategy``, ``plugins`` and
    ``profiler``)."""
    g = given
    for argument, accepted, instead in (
        ("use_distributed_sampler", True, "ptrain's multi-process strategies always shard the "
                                          "data; give your own sampler in the dataloader and "
                                          "leave this out"),
        ("sync_batchnorm", False, "convert the model yourself with "
                                  "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)"),
        ("reload_dataloaders_every_n_epochs", 0, "build a dataloader whose dataset changes "
                                                 "per epoch instead"),
        ("enable_autolog_hparams", True, "leave out save_hyperparameters() to log none"),
        ("model_registry", None, "push the checkpoint to your registry after fit()"),
    ):
        if g[argument] != accepted:
            raise refuse("Trainer", argument, g[argument], instead)
    callbacks = _as_list(g["callbacks"])
    if g["enable_progress_bar"] is False:
        from ptrain.lightning.callbacks.progress import ProgressBar

        bars = [type(c).__name__ for c in callbacks if isinstance(c, ProgressBar)]
        if bars:
            raise ConfigError(f"Trainer(enable_progress_bar=False) contradicts the {bars[0]} in "
                              f"callbacks: remove one of them (as Lightning refuses too).")
    for argument, name in (("enable_checkpointing", "checkpoint"),
                           ("enable_progress_bar", "progress-bar"),
                           ("enable_model_summary", "model-summary")):
        if g[argument] is False or (g["barebones"] and g[argument] is None):
            callbacks.append(f"no:{name}")
    logger = g["logger"]
    loggers = [] if logger is None or isinstance(logger, bool) else _as_list(logger)
    if logger is False or g["barebones"] or (loggers and not any(
            getattr(x, "name", None) == "tensorboard" for x in loggers)):
        callbacks.append("no:tensorboard")
    callbacks.extend(loggers)
    chosen = select(g)
    callbacks.extend(chosen.callbacks)
    root = g["default_root_dir"]
    logger_root = getattr(loggers[0], "root_dir", None) if loggers else None
    if logger_root is not None:
        root = logger_root
    else:
        root = str(Path(root if root is not None else ".") / "lightning_logs")
    strategy, devices = chosen.strategy, chosen.devices
    if strategy == "auto":
        many = (isinstance(devices, int) and (devices > 1 or devices == -1)) or (
            isinstance(devices, (list, tuple)) and len(devices) > 1)
        strategy = "ddp" if many else "single-device"
    if devices == -1:
        devices = "auto"
    if g["deterministic"] and g["benchmark"]:
        raise ConfigError("Trainer(deterministic=True, benchmark=True) contradict each other: "
                          "cuDNN's autotuner picks algorithms that may not be deterministic. "
                          "Choose one.")
    options: dict[str, Any] = {
        "accelerator": chosen.accelerator, "strategy": strategy, "devices": devices,
        "num_nodes": g["num_nodes"], "callbacks": callbacks, "default_root_dir": root,
        "fast_dev_run": g["fast_dev_run"], "overfit_batches": g["overfit_batches"] or 0,
        "check_val_every_n_epoch": g["check_val_every_n_epoch"] or 1,
        "accumulate_grad_batches": g["accumulate_grad_batches"],
        "detect_anomaly": g["detect_anomaly"], "inference_mode": g["inference_mode"],
        "deterministic": bool(g["deterministic"])
        if g["deterministic"] != "warn" else "warn",
    }
    if chosen.precision is not None or g["precision"] is not None:
        options["precision"] = chosen.precision if chosen.precision is not None \
            else g["precision"]
    for argument in ("max_epochs", "min_epochs", "min_steps", "max_time", "limit_train_batches",
                     "limit_val_batches", "limit_test_batches", "limit_predict_batches",
                     "val_check_interval", "num_sanity_val_steps", "log_every_n_steps",
                     "gradient_clip_algorithm", "seed"):
        if g[argument] is not None:
            options[argument] = g[argument]
    if g["max_steps"] != -1:
        options["max_steps"] = g["max_steps"]
    if g["gradient_clip_val"]:  # Lightning: 0 or None is no clipping
        options["gradient_clip_val"] = g["gradient_clip_val"]
    if isinstance(options.get("max_time"), dict):  # Lightning allows {"hours": 1, ...}
        t = options["max_time"]
        options["max_time"] = ((t.get("days", 0) * 24 + t.get("hours", 0)) * 60
                               + t.get("minutes", 0)) * 60 + t.get("seconds", 0)
    if hasattr(options.get("max_time"), "total_seconds"):
        options["max_time"] = options["max_time"].total_seconds()
    return options, loggers, chosen.implied
