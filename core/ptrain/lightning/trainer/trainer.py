"""``lightning.pytorch.trainer.trainer``: ``Trainer``, Lightning's signature over
:class:`ptrain.Trainer`."""

from __future__ import annotations

import ast
import collections.abc
import contextlib
import functools
import inspect
import math
import os
import signal
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import torch

from ptrain import run_folder
from ptrain.distributed import detect_environment
from ptrain.errors import ConfigError, ModelError, NoCheckpointYetError
from ptrain.evaluation_loop import stage_batches
from ptrain.lightning._common import refuse
from ptrain.lightning._selection import select
from ptrain.lightning.trainer.states import BoundTrainerState
from ptrain.module import DataModule, TrainModule
from ptrain.trainer import Trainer as _Trainer
from ptrain.trainer import no_limit

#: Lightning reads a default for each Trainer argument from ``PL_TRAINER_<ARGUMENT>``
ENV_PREFIX = "PL_TRAINER_"


def _defaults_from_environment(init: Any) -> Any:
    """``__init__`` taking, for each argument not passed, the value of the environment variable
    ``PL_TRAINER_<NAME>`` when it is set (read as a Python literal where it is one:
    ``PL_TRAINER_MAX_STEPS=7``, ``PL_TRAINER_LOGGER=False``), as Lightning's Trainer does."""
    names = [name for name in inspect.signature(init).parameters if name != "self"]

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        for name in names:
            text = os.environ.get(f"{ENV_PREFIX}{name.upper()}")
            if text is not None and name not in kwargs:
                try:
                    kwargs[name] = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    kwargs[name] = text
        init(self, *args, **kwargs)

    return wrapper


class Trainer(_Trainer):
    """Lightning's ``Trainer(...)``: each argument keeps its Lightning meaning and becomes a
    ptrain option, callback selection or plugin; a value ptrain can't honour is refused with a
    :class:`ConfigError` naming it and what to do. ``plugin_options`` is ptrain's own extra
    (no ``seed``: a program that passes its config's entries that the signature names, as
    PyTorch Tabular does, would seed again here where Lightning does not; seed with
    ``seed_everything``). The run folder is Lightning's:
    ``default_root_dir/lightning_logs/version_N``, or the first logger's
    ``save_dir/name/version_N`` (or the folder its ``version`` names).

    Also Lightning's attribute names: ``lightning_module``, ``logger``, ``callbacks``,
    ``logged_metrics``, ``progress_bar_metrics``, ``checkpoint_callback``,
    ``early_stopping_callback``, ``training``/``validating``/``testing``/``predicting``,
    ``state`` (``fn``, ``stage``, ``status``), ``interrupted``, the dataloaders of the stages
    (``train_dataloader``, ``val_dataloaders``, ...) and their batch counts
    (``num_training_batches``, ``num_val_batches``, ...), ``lr_scheduler_configs``,
    ``estimated_stepping_batches``, ``log_dir`` and ``default_root_dir`` with Lightning's
    meanings, the limits as Lightning shows them (``max_steps`` ``-1`` for none, ``max_epochs``
    decided when ``fit`` starts), and Lightning's objects for the run's ``accelerator``,
    ``strategy`` and ``profiler``. Arguments not passed are read from ``PL_TRAINER_<NAME>``
    environment variables where set, as in Lightning.
    """

    # Lightning's tutorials step an optimizer over parameters their loss never reaches (the
    # CIFAR-10 baseline's SWA part): a warning here, as ptrain's own Trainer stops
    stops_on_unreached_optimizer = False
    # Lightning 2 runs a program whose module or callbacks keep a hook of Lightning 1.x
    # (the UvA course's energy-model callbacks define on_epoch_end), never calling it
    stops_on_removed_lightning_hooks = False
    # Lightning keeps a step's gradients until the next window's backward: a gradient-norm
    # callback reads them in on_train_batch_end
    clears_gradients_before_backward = True
    # Lightning makes the first epoch's training iterator before on_train_start (scvi-tools'
    # SubSampleLabels swaps a loader in on_train_epoch_start: the first epoch keeps the old)
    iterates_training_data_before_train_start = True
    # Lightning makes an iterator of a reloaded training loader when it sets it up, and its
    # epoch makes another (pykeen's sLCWA loader: each draws a base seed, and the negatives
    # sampled after them depend on it)
    iterates_reloaded_training_data_twice = True
    # Lightning's fit skips validation, and its validate and test run nothing (returning
    # []), with a warning, when the loader is empty
    stops_on_empty_evaluation = False
    # Lightning's hparams.yaml is its loggers' file: logger=False writes none, and darts
    # makes a Trainer without loggers for each prediction
    writes_hparams_without_loggers = False
    # Lightning steps only plateau schedulers on their monitor; pytorch-tabular gives StepLR
    # one (its value, passed to step, would be taken for the epoch)
    monitors_only_plateau_schedulers = True

    @_defaults_from_environment
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
                 plugin_options: dict[str, dict[str, Any]] | None = None):
        given = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        _check_barebones(given)
        options, loggers, implied_options = _translate(given)
        if implied_options:  # what Lightning's objects and names imply, per plugin
            plugin_options = dict(plugin_options or {})
            for name, implied in implied_options.items():
                plugin_options[name] = {**implied, **plugin_options.get(name, {})}
        super().__init__(plugin_options=plugin_options, **options)
        self._callbacks_chosen = True  # trainer.callbacks is read-only from here
        self._init_kwargs = given  # a worker rebuilds this trainer from Lightning's arguments
        self._given_loggers = loggers
        self._lightning_root = os.path.normpath(os.path.expanduser(os.fspath(
            default_root_dir if default_root_dir is not None else os.getcwd())))
        self.barebones = barebones
        if self.num_sanity_val_steps == -1:  # Lightning's "all of them"
            self.num_sanity_val_steps = math.inf
        if use_distributed_sampler:
            self._shuffle_training_shards()
        else:
            self._keep_samplers()
        if benchmark is not None:  # Lightning sets it for the process, as here
            torch.backends.cudnn.benchmark = benchmark
        self._take_launched_ranks()

    def _take_launched_ranks(self) -> None:
        """Before its first stage, the trainer answers ``world_size``, ``global_rank`` and
        ``local_rank`` (so ``is_global_zero``, ``node_rank`` and ``print``) as Lightning's does
        once made: under a strategy of several processes, the world size its devices and nodes
        make, and in a process a launcher started (a copy of the script, torchrun, SLURM) that
        process's ranks; elsewhere rank 0. The stage sets the same values again."""
        strategy = self.plugins.get(self.options["strategy"])
        if not callable(getattr(strategy, "processes_per_node", None)):
            return  # one process
        self.world_size = self.num_devices * self.num_nodes
        environment = detect_environment()
        if environment is not None:
            self.global_rank = environment.global_rank
            self.local_rank = environment.local_rank

    def _shuffle_training_shards(self) -> None:
        """Lightning's sampler rule: the ``DistributedSampler`` put in a training dataloader
        shuffles, whether or not the dataloader did (the strategy's ``train_shuffle`` option
        ``always``; ptrain's own default follows the dataloader)."""
        self._set_strategy_option("train_shuffle", "always")

    def _keep_samplers(self) -> None:
        """``use_distributed_sampler=False``: the run's strategy leaves the dataloaders as they
        are (its ``distributed_sampler`` option off); a single-process strategy never changes
        them."""
        self._set_strategy_option("distributed_sampler", False)

    def _set_strategy_option(self, option: str, value: Any) -> None:
        """Set the run's strategy's ``option`` (in its plugin and the run's config) where the
        strategy has one; a user's explicit ``plugin_options`` value wins."""
        name = self.options["strategy"]
        strategy = self.plugins.get(name)
        users = (self._init_kwargs.get("plugin_options") or {}).get(name, {})
        if hasattr(strategy, option) and option not in users:
            setattr(strategy, option, value)
            self.config["plugins"].setdefault(name, {})[option] = value

    # -- Lightning's stage signatures ---------------------------------------------------------

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        self._continue_in_the_loggers_folder()
        if self._own_log_dir is not None and not self.fast_dev_run:
            self._own_log_dir.mkdir(parents=True, exist_ok=True)  # a logger's version names it
        try:
            return super()._run(*args, **kwargs)
        finally:  # the loggers' log_dir, also where the stage ran in worker processes
            for logger in self._given_loggers:  # (a logger with a folder of its own keeps it)
                if hasattr(logger, "_run_dir") and self._own_log_dir is not None and \
                        logger._holds(self._own_log_dir):
                    logger._run_dir = str(self._own_log_dir)

    def _continue_in_the_loggers_folder(self) -> None:
        """A file logger an earlier trainer ran with keeps its run folder, as Lightning's logger
        keeps the version it took: before its first stage, this trainer takes that folder as
        its own, so every trainer given the logger writes there (neuralforecast makes a
        trainer for each fit and predict with the logger of the model's ``trainer_kwargs``).
        A first logger given a ``version`` names the folder itself, as Lightning's."""
        first = self._given_loggers[0] if self._given_loggers else None
        folder = getattr(first, "_run_dir", None)
        if self._own_log_dir is None and folder is not None and Path(folder).is_dir():
            self._own_log_dir = Path(folder)
        named = getattr(first, "_named_folder", None)  # TensorBoardLogger(version="exp")
        if self._own_log_dir is None and named is not None:  # made when a stage starts
            self._own_log_dir = named

    def fit(self, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None,
            datamodule: Any = None, ckpt_path: str | None = None,
            weights_only: bool | None = None) -> None:
        _check_model(model, "fit")
        if self.max_epochs is None and no_limit(self.max_steps) and self.max_time is None:
            from ptrain.lightning.utilities.warnings import PossibleUserWarning

            warnings.warn("max_epochs is not set, so fit trains for 1000 epochs, as in "
                          "Lightning; give max_epochs (-1 for no limit) to choose.",
                          PossibleUserWarning, stacklevel=2)
        if isinstance(train_dataloaders, DataModule):  # fit(model, datamodule) positionally
            train_dataloaders, datamodule = None, train_dataloaders
        ckpt_path = self._checkpoint_argument(ckpt_path, weights_only)
        super().fit(model, datamodule, ckpt_path, train_dataloaders=train_dataloaders,
                    val_dataloaders=val_dataloaders)

    def validate(self, model: Any = None, dataloaders: Any = None, ckpt_path: str | None = None,
                 verbose: bool = True, datamodule: Any = None,
                 weights_only: bool | None = None) -> list[dict[str, float]]:
        model, dataloaders, datamodule, ckpt_path = self._stage_arguments(
            "validate", model, dataloaders, datamodule, ckpt_path)
        ckpt_path = self._checkpoint_argument(ckpt_path, weights_only)
        with self._results_shown(verbose):
            return super().validate(model, datamodule, ckpt_path, dataloaders=dataloaders)

    def test(self, model: Any = None, dataloaders: Any = None, ckpt_path: str | None = None,
             verbose: bool = True, datamodule: Any = None,
             weights_only: bool | None = None) -> list[dict[str, float]]:
        model, dataloaders, datamodule, ckpt_path = self._stage_arguments(
            "test", model, dataloaders, datamodule, ckpt_path)
        ckpt_path = self._checkpoint_argument(ckpt_path, weights_only)
        with self._results_shown(verbose):
            return super().test(model, datamodule, ckpt_path, dataloaders=dataloaders)

    def predict(self, model: Any = None, dataloaders: Any = None, datamodule: Any = None,
                return_predictions: bool | None = None, ckpt_path: str | None = None,
                weights_only: bool | None = None) -> list[Any] | None:
        model, dataloaders, datamodule, ckpt_path = self._stage_arguments(
            "predict", model, dataloaders, datamodule, ckpt_path)
        ckpt_path = self._checkpoint_argument(ckpt_path, weights_only)
        return super().predict(model, datamodule, ckpt_path,
                               return_predictions=return_predictions is not False,
                               dataloaders=dataloaders)

    @contextlib.contextmanager
    def _results_shown(self, verbose: bool) -> Iterator[None]:
        """``verbose=False``: the ``results`` callback prints nothing for this stage (it prints
        in the process that runs the stage, so under the ``spawn`` launcher, whose workers build
        their own callbacks, the results still print)."""
        results = self.plugins.get("results")
        if verbose or results is None:
            yield
            return
        results.verbose = False
        try:
            yield
        finally:
            results.verbose = True

    def _checkpoint_argument(self, ckpt_path: Any, weights_only: bool | None) -> str | None:
        """Lightning's meanings: ``ckpt_path="last"`` with no last checkpoint to find starts
        from scratch with a warning (ptrain's own ``"last"`` is an error then);
        ``weights_only=False`` allows nothing more: the stages read with torch's weights-only
        loader (said once; ``load_from_checkpoint`` takes ``weights_only=False``)."""
        if weights_only is False:
            warnings.warn("weights_only=False: the trainer's stages read checkpoints with "
                          "torch's weights-only loader whatever it says (ptrain's hold tensors "
                          "and plain values); for a file you trust that holds other objects, "
                          "load it with Model.load_from_checkpoint(path, weights_only=False) "
                          "and pass that model.", stacklevel=3)
        if ckpt_path is None:
            return None
        ckpt_path = os.fspath(ckpt_path)
        if ckpt_path == "last":
            try:
                self.resolve_ckpt_path("last")
            except NoCheckpointYetError as exc:
                warnings.warn(f"ckpt_path='last' found no checkpoint to resume, so fit starts "
                              f"from scratch, as in Lightning: {exc}", stacklevel=3)
                return None
        return ckpt_path

    def _unloadable_reason(self, value: Any) -> tuple[str | None, str]:
        # a program's CheckpointIO reads the run's checkpoints: what it reads back decides
        from ptrain.lightning.plugins.io import _CheckpointIOPlugin

        plugin = self.pm.get_plugin(_CheckpointIOPlugin.name)
        if not isinstance(plugin, _CheckpointIOPlugin):
            return super()._unloadable_reason(value)
        return (plugin.unloadable_reason(value),
                f"the program's {type(plugin.io).__qualname__}.load_checkpoint")

    def _stage_arguments(self, stage: str, model: Any, dataloaders: Any, datamodule: Any,
                         ckpt_path: Any) -> tuple:
        if isinstance(dataloaders, DataModule):
            dataloaders, datamodule = None, dataloaders
        if model is None:  # Lightning: the model of the last stage
            if self.module is None:
                raise _ModelTypeError(f"trainer.{stage}() needs a LightningModule: no model "
                                      f"was given and this trainer has run no stage with one; "
                                      f"pass it: trainer.{stage}(model, ...).")
            model = self.module
            if ckpt_path is None:
                ckpt_path = self._best_of_last_fit(stage)
        _check_model(model, stage)
        if datamodule is None and dataloaders is not None:
            # Lightning's trainer.datamodule stays the last one given: the stage runs its
            # prepare_data, setup and teardown again, and takes its data from the dataloaders
            datamodule = self.datamodule
        return model, dataloaders, datamodule, ckpt_path

    def _best_of_last_fit(self, stage: str) -> str | None:
        """Lightning's rule for an evaluation stage given neither a model nor ``ckpt_path``: it
        loads the best checkpoint the checkpoint callback recorded in this trainer's ``fit``
        (the newest file when it monitors nothing), and says so. Without one (no checkpoint
        callback, or no ``fit`` that saved), Lightning stops with a ``ValueError``; here the
        module's current weights are evaluated, and that is said instead."""
        callback = self.checkpoint_callback
        best = getattr(callback, "best_model_path", "") if callback is not None else ""
        if best:
            warnings.warn(f"trainer.{stage}() was given no model and no ckpt_path, so it "
                          f"evaluates the best checkpoint of this trainer's fit, {best!r}, as "
                          f"Lightning does (its weights are loaded into the module). Pass "
                          f"ckpt_path='best', 'last' or a path to choose and silence this.",
                          stacklevel=4)
            return best
        warnings.warn(f"trainer.{stage}() was given no model and no ckpt_path, and this "
                      f"trainer's checkpoint callback recorded no best checkpoint, so it "
                      f"evaluates the module's current weights (Lightning stops with a "
                      f"ValueError here). Pass the model or a ckpt_path to silence this.",
                      stacklevel=4)
        return None

    # -- Lightning's attribute names ----------------------------------------------------------

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print(*args, **kwargs)`` in the first process of each machine (local rank 0), as
        Lightning's ``Trainer.print``."""
        if self.local_rank == 0:
            print(*args, **kwargs)

    @property
    def lightning_module(self) -> Any:
        return self.module

    @property
    def loggers(self) -> list[Any]:
        """The run's loggers; under ``fast_dev_run``, which turns them off, one
        ``DummyLogger`` standing for them (Lightning's), so code that uses ``self.logger``
        runs unchanged and records nothing."""
        if self.fast_dev_run and self._given_loggers:
            if getattr(self, "_dummy_logger", None) is None:
                from ptrain.lightning.loggers.logger import DummyLogger

                self._dummy_logger = DummyLogger()
            return [self._dummy_logger]
        return super().loggers

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
    def callbacks(self) -> list[Any]:
        """Lightning's ``trainer.callbacks``: the run's callback objects, as given (a
        :class:`Callback` subclass, one of ``ptrain.lightning.callbacks``' classes) and those
        this trainer made for Lightning's defaults (progress bar, checkpoint), with those its
        stage's module added (``configure_callbacks``) while the stage runs; the checkpoint
        callbacks last, as Lightning orders them; ptrain's model summary is no such object.
        (pytorch-forecasting's ``predict_step``
        finds its prediction writer here.)"""
        from ptrain.lightning import callbacks as lightning_callbacks

        kinds = tuple(getattr(lightning_callbacks, name) for name in lightning_callbacks.__all__)
        found: list[Any] = []
        for _, plugin in self.pm.list_name_plugin():
            inner = getattr(plugin, "lightning_callbacks", None)
            for callback in inner if inner is not None else [plugin]:
                if isinstance(callback, kinds) and not any(c is callback for c in found):
                    found.append(callback)
        given = _as_list(self._init_kwargs.get("callbacks"))

        def place(callback: Any) -> tuple[bool, int]:  # the given order, the defaults after
            return (isinstance(callback, lightning_callbacks.Checkpoint),
                    next((i for i, c in enumerate(given) if c is callback), len(given)))

        return _CallbackList(sorted(found, key=place))

    @callbacks.setter
    def callbacks(self, names: list[str]) -> None:
        """ptrain's own ``callbacks`` option (plugin names), which ``Trainer.__init__`` sets as
        an attribute: kept in :attr:`options` only. A later assignment is refused: the run's
        plugins are chosen when the trainer is made."""
        if self.__dict__.get("_callbacks_chosen"):
            raise ConfigError(_CALLBACKS_CHOSEN.format(what="replaced"))

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

    @property
    def evaluating(self) -> bool:
        return self.stage in ("validate", "test")

    @property
    def state(self) -> BoundTrainerState:
        """Lightning's ``TrainerState`` of this trainer: ``fn`` (the stage method running or
        run last), ``stage`` (the loop running), ``status``; setting a field sets the
        trainer's."""
        return BoundTrainerState(self)

    @property
    def interrupted(self) -> bool:
        """Whether the last stage ended with an error (``KeyboardInterrupt`` included)."""
        return self.status == "interrupted"

    @property
    def received_sigterm(self) -> bool:
        """Whether the ``stop-signals`` callback received SIGTERM during this ``fit``."""
        watcher = self.plugins.get("stop-signals")
        return getattr(watcher, "received", None) == signal.SIGTERM

    # -- folders, with Lightning's meanings -------------------------------------------------

    @property
    def default_root_dir(self) -> str:
        """The folder given as ``default_root_dir`` (the working directory without one), with
        ``~`` expanded; the run folders go under ``lightning_logs`` in it (or under the first
        logger's folder), which is :attr:`run_root`."""
        return self._lightning_root if hasattr(self, "_lightning_root") else self.run_root

    @default_root_dir.setter
    def default_root_dir(self, value: Any) -> None:  # the native Trainer sets its option value
        self.run_root = os.fspath(value)

    @property
    def log_dir(self) -> str | None:
        """Lightning's ``trainer.log_dir``: the first logger's folder (a file logger's run
        folder, ``save_dir/name/version_N``; another logger's ``save_dir``), or
        ``default_root_dir`` with no logger. Known before the first stage: the run folder the
        first stage will take (the next free ``version_N``). ptrain writes its own files
        (checkpoints, ``hparams.toml``) to :attr:`run_dir`, the same folder whenever a file
        logger (or the default TensorBoard one) takes part."""
        from ptrain.lightning.loggers._run_folder import RunFolder

        loggers = self.loggers
        if not loggers:
            return self.default_root_dir
        first = loggers[0]
        if not isinstance(first, RunFolder) and hasattr(first, "save_dir"):
            return first.save_dir
        self._continue_in_the_loggers_folder()
        folder = self._own_log_dir
        if folder is None:  # the same answer until a stage takes a folder, as Lightning's
            predicted = getattr(self, "_predicted_log_dir", None)
            if predicted is None or predicted[0] != self.run_root:
                predicted = self._predicted_log_dir = (
                    self.run_root, run_folder.next_free(Path(self.run_root)))
            folder = predicted[1]
        return str(folder)

    @log_dir.setter
    def log_dir(self, value: Path | None) -> None:  # the native Trainer sets its run folder
        self.run_dir = value

    # -- the stages' data, as Lightning names it ----------------------------------------------

    @property
    def val_dataloaders(self) -> Any:
        """The validation dataloader(s) of the last ``fit`` or ``validate``."""
        return self.val_dataloader

    @property
    def test_dataloaders(self) -> Any:
        """The test dataloader(s) of the last ``test``."""
        return self.test_dataloader

    @property
    def predict_dataloaders(self) -> Any:
        """The prediction dataloader(s) of the last ``predict``."""
        return self.predict_dataloader

    @property
    def num_val_batches(self) -> list[int | float]:
        """Per validation dataloader, the batches a validation pass runs (after
        ``limit_val_batches``; ``inf`` for a loader without a length)."""
        return self._batches_per_loader("validate", self.val_dataloader)

    @property
    def num_sanity_val_batches(self) -> list[int | float]:
        """Per validation dataloader, the batches the sanity check runs."""
        return [min(self.num_sanity_val_steps, n) for n in self.num_val_batches]

    @property
    def num_test_batches(self) -> list[int | float]:
        return self._batches_per_loader("test", self.test_dataloader)

    @property
    def num_predict_batches(self) -> list[int | float]:
        return self._batches_per_loader("predict", self.predict_dataloader)

    def _batches_per_loader(self, stage: str, loaders: Any) -> list[int | float]:
        return [stage_batches(self, stage, loader) for loader in _loader_list(loaders)]

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        """The schedulers ``configure_optimizers`` gave, as Lightning's ``LRSchedulerConfig``
        (``scheduler``, ``interval``, ``frequency``, ``monitor``, ``strict``, ``name``)."""
        from ptrain.lightning.utilities.types import LRSchedulerConfig

        return [LRSchedulerConfig(
            scheduler=entry["scheduler"], name=entry.get("name"), interval=entry["interval"],
            frequency=entry["frequency"],
            monitor=entry.get("monitor") or entry.get("ignored_monitor"),
            strict=entry.get("strict", True),
            reduce_on_plateau=isinstance(entry["scheduler"],
                                         torch.optim.lr_scheduler.ReduceLROnPlateau))
            for entry in self.lr_schedulers]

    @property
    def estimated_stepping_batches(self) -> int | float:
        """The optimizer steps ``fit`` will take, from the limits, the training batches per
        epoch and ``accumulate_grad_batches``, as Lightning estimates them (``inf`` without a
        limit). Before the loop starts (in ``configure_optimizers``) or outside ``fit`` the
        training dataloader is asked for, to count its batches; as in Lightning, the count is
        then ``num_training_batches`` too (a schedule sized per epoch reads it next)."""
        epochs = self.max_epochs
        if epochs is None:  # what fit will decide
            epochs = 1000 if no_limit(self.max_steps) and self.max_time is None else -1
        steps = -1 if no_limit(self.max_steps) else self.max_steps
        if epochs == -1:
            return math.inf if steps == -1 else steps
        batches = self._count_training_batches()
        if math.isinf(batches):
            return steps if steps != -1 else math.inf
        estimate = math.ceil(batches / self.accumulate_grad_batches) * max(epochs, 1)
        return min(estimate, steps) if steps != -1 else estimate

    def _count_training_batches(self) -> int | float:
        from ptrain.evaluation_loop import limit_batches, loader_length

        loader = next((x for x in (self.train_dataloader, self.given_dataloaders.get("train"),
                                   self._asked_early.get("train")) if x is not None), None)
        if loader is None:
            source = self.datamodule if self.datamodule is not None else self.module
            if source is None:
                raise ConfigError("estimated_stepping_batches counts the training batches, "
                                  "and this trainer has no model yet; read it inside a stage "
                                  "(configure_optimizers, a hook).")
            # the stage takes this loader rather than asking again (see Trainer._dataloader)
            loader = self._asked_early["train"] = source.train_dataloader()
        self.num_training_batches = limit_batches(loader_length(loader), self.limit_train_batches)
        return self.num_training_batches

    # -- devices -----------------------------------------------------------------------------

    @property
    def num_devices(self) -> int:
        """The devices (processes) per machine the run uses."""
        strategy = self.plugins.get(self.options["strategy"])
        per_node = getattr(strategy, "processes_per_node", None)
        return per_node(self) if callable(per_node) else 1

    @property
    def device_ids(self) -> list[int]:
        """The indices of the devices this machine's processes use."""
        if isinstance(self.devices, list):
            return list(self.devices)
        return list(range(self.num_devices))

    @property
    def node_rank(self) -> int:
        return self.global_rank // max(1, self.num_devices)

    @property
    def progress_bar_callback(self) -> Any:
        """The run's ``ProgressBar`` (a ``TQDMProgressBar`` unless one was given), or
        ``None``."""
        return self.plugins.get("progress-bar")

    @property
    def enable_validation(self) -> bool:
        """Whether ``fit`` validates: the module has a ``validation_step`` and validation data,
        and ``limit_val_batches`` is not 0."""
        return self.val_dataloader is not None and self.limit_val_batches != 0

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
    def _accelerator_connector(self) -> Any:
        """What integrations read of Lightning's private connector (optuna's pruning callback:
        ``is_distributed``; ``use_distributed_sampler``): whether the run's strategy runs
        several processes (any but ``single-device``), and the Trainer's argument."""
        return SimpleNamespace(
            is_distributed=self.options["strategy"] != "single-device",
            use_distributed_sampler=self._init_kwargs.get("use_distributed_sampler", True))

    @property
    def profiler(self) -> Any:
        """The run's profiler (``PassThroughProfiler`` without one): ``with
        trainer.profiler.profile("name"):`` times a block of your code in its report."""
        profiler = self._init_kwargs.get("profiler")
        if profiler is None:
            from ptrain.lightning.profilers import PassThroughProfiler

            profiler = self._init_kwargs["profiler"] = PassThroughProfiler()
        return profiler


class _ModelTypeError(ModelError, TypeError):
    """What the stages raise for a model that is not a ``LightningModule`` (a ``TypeError``, as
    Lightning's)."""


def _check_model(model: Any, stage: str) -> None:
    if model is None:
        raise _ModelTypeError(f"trainer.{stage}() needs a LightningModule: pass it as the first "
                              f"argument.")
    if not isinstance(model, TrainModule):
        raise _ModelTypeError(f"the model given to trainer.{stage}() must be a LightningModule "
                              f"(ptrain.TrainModule), got {type(model).__qualname__}; subclass "
                              f"LightningModule (training_step, configure_optimizers).")


def _loader_list(loaders: Any) -> list[Any]:
    """The dataloaders of one stage as a list: ``None`` is none, several (a list, tuple, or the
    values of a dict) each, one itself."""
    if loaders is None:
        return []
    if isinstance(loaders, dict):
        return list(loaders.values())
    if isinstance(loaders, (list, tuple)):
        return list(loaders)
    return [loaders]


#: under barebones=True: argument -> (what it becomes, the values that may be passed)
_BAREBONES = {"enable_checkpointing": (False, (None, False)),
              "logger": (False, (None, False)),
              "enable_progress_bar": (False, (None, False)),
              "enable_model_summary": (False, (None, False)),
              "num_sanity_val_steps": (0, (None, 0)),
              "fast_dev_run": (False, (False, 0)),
              "detect_anomaly": (False, (False,)),
              "profiler": (None, (None,))}


def _check_barebones(given: dict[str, Any]) -> None:
    """``barebones=True`` turns off everything that costs speed (checkpoints, loggers, the
    progress bar, the model summary, the sanity check) and refuses an argument that asks for
    one of them, as Lightning does. ptrain still checks the loss for NaN at its usual points
    (every ``log_every_n_steps`` steps), so ``log_every_n_steps`` keeps its value."""
    if not given["barebones"]:
        return
    for argument, (off, allowed) in _BAREBONES.items():
        value = given[argument]
        if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
            raise ConfigError(f"Trainer(barebones=True, {argument}={value!r}) contradict each "
                              f"other: barebones turns off {argument.replace('_', ' ')} to "
                              f"measure the trainer's own speed. Leave {argument} out, or "
                              f"barebones.")
        given[argument] = off


def _default_logger(root: Any) -> Any:
    """The logger of a Trainer given none (or ``logger=True``), as Lightning's:
    ``TensorBoardLogger(save_dir=default_root_dir)``, a ``CSVLogger`` there without the
    ``tensorboard`` package."""
    import importlib.util

    from ptrain.lightning.loggers import CSVLogger, TensorBoardLogger

    save_dir = os.path.expanduser(root) if root is not None else os.getcwd()  # Lightning's
    if importlib.util.find_spec("tensorboard") is None:
        return CSVLogger(save_dir=save_dir)
    return TensorBoardLogger(save_dir=save_dir)


_CALLBACKS_CHOSEN = (
    "trainer.callbacks can't be {what} once the trainer is made: its callbacks are chosen "
    "then. Pass them to Trainer(callbacks=[...]), or return them from the module's "
    "configure_callbacks().")


class _CallbackList(list):
    """What ``trainer.callbacks`` answers: a list of the run's callbacks that refuses to be
    changed, where a plain copy would take an ``append`` and drop it unsaid (Lightning's is
    the list its hooks run over)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise ConfigError(_CALLBACKS_CHOSEN.format(what="changed"))

    append = extend = insert = remove = pop = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse


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
        ("enable_autolog_hparams", True, "leave out save_hyperparameters() to log none"),
        ("model_registry", None, "push the checkpoint to your registry after fit()"),
    ):
        if g[argument] != accepted:
            raise refuse("Trainer", argument, g[argument], instead)
    callbacks = _as_list(g["callbacks"])
    from ptrain.lightning.callbacks.progress import ProgressBar, TQDMProgressBar

    bars = [type(c).__name__ for c in callbacks if isinstance(c, ProgressBar)]
    if g["enable_progress_bar"] is False and bars:
        raise ConfigError(f"Trainer(enable_progress_bar=False) contradicts the {bars[0]} in "
                          f"callbacks: remove one of them (as Lightning refuses too).")
    if g["enable_progress_bar"] is not False and not bars:
        # Lightning's default display, drawn by ptrain's progress-bar (trainer.
        # progress_bar_callback answers as Lightning's: total_train_batches, ...)
        callbacks.append(TQDMProgressBar())
    for argument, name in (("enable_checkpointing", "checkpoint"),
                           ("enable_progress_bar", "progress-bar"),
                           ("enable_model_summary", "model-summary")):
        if g[argument] is False or (g["barebones"] and g[argument] is None):
            callbacks.append(f"no:{name}")
    logger = g["logger"]
    loggers = [] if logger is None or isinstance(logger, bool) else _as_list(logger)
    if logger in (None, True) and not g["barebones"]:  # Lightning's default logger, as its
        loggers = [_default_logger(g["default_root_dir"])]  # object (trainer.logger.log_dir...)
    if logger is False or g["barebones"] or not loggers or not any(
            getattr(x, "name", None) == "tensorboard" for x in loggers):
        callbacks.append("no:tensorboard")
    callbacks.extend(loggers)
    chosen = select(g)
    callbacks.extend(chosen.callbacks)
    if g["sync_batchnorm"]:
        from ptrain.lightning.plugins import LayerSync, TorchSyncBatchNorm

        if not any(isinstance(c, LayerSync) for c in chosen.callbacks):  # plugins= gave one
            callbacks.append(TorchSyncBatchNorm())
    root = g["default_root_dir"]
    logger_root = getattr(loggers[0], "root_dir", None) if loggers else None
    if logger_root is not None:
        root = os.path.expanduser(logger_root)
    else:
        # without default_root_dir Lightning's is the working directory, so paths are absolute
        root = str(Path(os.path.expanduser(root) if root is not None else os.getcwd())
                   / "lightning_logs")
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
        "check_val_every_n_epoch": g["check_val_every_n_epoch"],
        "reload_dataloaders_every_n_epochs": g["reload_dataloaders_every_n_epochs"],
        "max_steps": g["max_steps"],
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
                     "gradient_clip_algorithm"):
        if g[argument] is not None:
            options[argument] = g[argument]
    if g["gradient_clip_val"]:  # Lightning: 0 or None is no clipping
        options["gradient_clip_val"] = g["gradient_clip_val"]
    if isinstance(options.get("max_time"), dict):  # Lightning allows {"hours": 1, ...}
        t = options["max_time"]
        options["max_time"] = ((t.get("days", 0) * 24 + t.get("hours", 0)) * 60
                               + t.get("minutes", 0)) * 60 + t.get("seconds", 0)
    if hasattr(options.get("max_time"), "total_seconds"):
        options["max_time"] = options["max_time"].total_seconds()
    return options, loggers, chosen.implied
