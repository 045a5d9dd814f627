"""The Trainer: assembles the plugins of a run, holds the state they read, and runs a stage."""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import re
import reprlib
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterator

import pluggy
import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

from ptrain import checkpoint_io, replaced_files, run_folder
from ptrain._version import __version__
from ptrain.background_write import (BackgroundWrite, DeferredCopies, HostBuffers, WriteAgreement,
                                     host_copy)
from ptrain.builtins.loop_defaults import LoopDefaults
from ptrain.catalog import EXCLUSIVE_KINDS, FIRST_PARTY, Catalog
from ptrain.config import core_options
from ptrain.data import rebuild_dataloader, stop_workers
from ptrain.evaluation_loop import LIMITS, SeveralLoaders, several_loaders
from ptrain.errors import (ChangedBeforeCopiedError, CheckpointError, CheckpointWriteError,
                           ConfigError, ModelError, NoCheckpointYetError, PluginError)
from ptrain.hook_calls import StepHooks, observation_of
from ptrain.hook_methods import adapt_callbacks, module_plugins
from ptrain.hyperparameters import (DATAMODULE_KEYS, MODULE_KEYS, checkpoint_entries,
                                    logged_hyperparameters, saved_hyperparameters)
from ptrain.loading import IMPL_MARK, call_impl, create_plugin_manager, instantiate, register
from ptrain.metrics import MetricStore
from ptrain.module import DataModule, TrainModule, class_path
from ptrain.optimizers import OptimizerSetup, configure_optimizers, rebind_scheduler
from ptrain.options import closest, near_names
from ptrain.precision_policy import PrecisionPolicy
from ptrain.seeding import seed_everything
from ptrain.selection import SelectedPlugin, object_name, select_plugins, split_callbacks
from ptrain.step_module import StepModule

#: Where, inside a run folder, the checkpoint that ``ckpt_path="last"`` resumes from lives.
LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"


class Trainer:
    """Trains a :class:`ptrain.TrainModule` with the plugins its options select.

    Keyword arguments are the core's options (``ptrain fit --help`` lists them; the same names
    as the ``[trainer]`` config table), except that ``accelerator``, ``strategy``, ``precision``
    and the entries of ``callbacks`` may also be plugin objects. ``plugin_options`` gives each
    plugin selected by name its options: ``{"early-stopping": {"monitor": "val_loss"}}``.

    State any plugin may read: ``current_epoch``, ``global_step``, ``callback_metrics``,
    ``should_stop`` (a plugin may set it), ``device``, ``world_size``, ``global_rank``,
    ``local_rank``, ``is_global_zero``, ``writes_run_files`` (whether this process writes
    the run's checkpoints: global rank 0, or with ``save_on_each_node`` the first of every
    machine), ``device_mesh`` (the strategy's
    ``torch.distributed.DeviceMesh`` of the job's processes, with named dimensions, laid out
    before the module's ``configure_model``; ``None`` under a strategy that lays out none),
    ``model`` (as wrapped), ``module`` (the user's),
    ``optimizers``, ``lr_schedulers``, ``fit_progress`` (where this trainer's last ``fit``
    ended, ``{"epoch", "global_step"}``: a later ``fit`` without a checkpoint goes on from
    there, as in Lightning), ``run_root`` (the folder run folders go under: the
    ``default_root_dir`` option), ``run_dir`` (this run's folder; ``None`` before the first
    stage), ``default_root_dir`` and ``log_dir`` (the same two on this class;
    ``ptrain.lightning.Trainer`` answers them with Lightning's meanings, so a plugin reads
    ``run_root``/``run_dir``), ``stage`` (the loop running: ``"train"``, ``"validate"``,
    ``"test"``, ``"predict"``; ``None`` between stages), ``stage_call`` (the stage method
    running or run last: ``"fit"``, ``"validate"``, ``"test"``, ``"predict"``), ``status``
    (``"initializing"`` before the first stage, ``"running"``, ``"finished"``, or
    ``"interrupted"`` after a stage ended with an error), ``ckpt_path`` (the checkpoint the
    stage resumed or evaluated, resolved from what was given: ``"last"`` becomes its path;
    ``None`` without one), ``finite_state_step`` (the global step at which the parameters and
    optimizer state were last found finite: :mod:`ptrain.finite_state`), ``sync_gradients``
    (whether the next backward's gradients are
    synchronised across processes; see the ``backward`` hook), ``precision_policy``,
    ``options`` (the core's resolved options), ``config`` (everything resolved), ``plugins``
    (name -> plugin object), ``loggers`` (the logger plugins), ``hook``.
    """

    #: An optimizer whose trainable parameters all got no gradient from the first batch's loss
    #: (its steps change nothing) stops the fit before its first step; ``False``: a warning, and
    #: the fit goes on (``ptrain.lightning.Trainer``: Lightning steps such an optimizer, and
    #: public programs do it).
    stops_on_unreached_optimizer = True
    #: A module's or a Lightning-style callback's hook method of Lightning 1.x that Lightning 2
    #: no longer calls (``on_epoch_end``, ``training_step_end``, ...) stops the run when it
    #: starts; ``False``: a warning, and the run goes on without calling it
    #: (``ptrain.lightning.Trainer``: Lightning runs such programs, ignoring the method).
    stops_on_removed_lightning_hooks = True
    #: Under automatic optimization the gradients are set to ``None`` right after each optimizer
    #: step, so their memory is free during the next forward pass; ``True``: at the first batch
    #: of the next accumulation window, after its training step and before its backward
    #: (``ptrain.lightning.Trainer``: Lightning's point, so a callback reading ``p.grad`` in
    #: ``on_train_batch_end``, or a program after ``fit``, finds the last step's gradients).
    #: ``on_before_zero_grad`` fires right before, either way.
    clears_gradients_before_backward = False
    #: The training loader's iterator for an epoch is made when the epoch starts, after
    #: ``on_epoch_start``; ``True``: a fit that does not resume makes it before
    #: ``on_loop_start("train")`` (Lightning's ``on_train_start``), after the sanity check, and
    #: its first epoch reads that one (``ptrain.lightning.Trainer``: Lightning's point, so a
    #: callback that changes the loader in the first ``on_train_epoch_start`` changes it from the
    #: second epoch on, and the iterator's random draws come before the hooks' own).
    iterates_training_data_before_train_start = False
    #: A training loader asked for again at an epoch's start
    #: (``reload_dataloaders_every_n_epochs``) is iterated once, by that epoch; ``True``: an
    #: iterator of it is also made and dropped as soon as it is asked for, before
    #: ``on_epoch_start`` (``ptrain.lightning.Trainer``: Lightning's set-up of a reloaded loader
    #: makes one that its epoch then replaces, so what making an iterator draws, a
    #: ``DataLoader``'s base seed from the global generator, is drawn twice, as there).
    iterates_reloaded_training_data_twice = False
    #: A validation or test loader that gives no batches (its dataset is empty) stops the
    #: stage when it starts; ``False``: a warning, and the fit trains without validating, a
    #: ``validate`` or ``test`` runs nothing (``ptrain.lightning.Trainer``: Lightning's stages
    #: do so, and darts' models give such a loader whenever they are fitted without
    #: validation series).
    stops_on_empty_evaluation = True
    #: The run folder's ``hparams.toml`` is written whether the run has loggers or not;
    #: ``False``: only when it has one (``ptrain.lightning.Trainer``: Lightning's loggers write
    #: its ``hparams.yaml``, so ``Trainer(logger=False)`` leaves no log folder).
    writes_hparams_without_loggers = True
    #: A scheduler given a ``monitor`` steps on that metric's value (``scheduler.step(value)``,
    #: or ``lr_scheduler_step(scheduler, value)``), whatever its kind; ``True``: only a
    #: ``ReduceLROnPlateau`` (or one marked ``reduce_on_plateau``) does, any other steps with
    #: no value, when its interval ends, and its ``monitor`` is only kept to be read
    #: (``ptrain.lightning.Trainer``: Lightning reads the monitor of plateau schedulers only;
    #: pytorch-tabular names one beside a ``StepLR``, which a value would take as its epoch).
    monitors_only_plateau_schedulers = False

    def __init__(
        self, *,
        accelerator: Any = "auto",
        strategy: Any = "single-device",
        precision: Any = "32-true",
        callbacks: list[Any] | None = None,
        devices: int | str | list[int] = 1,
        num_nodes: int = 1,
        max_epochs: int | None = None,
        min_epochs: int | None = None,
        max_steps: int | None = None,
        min_steps: int | None = None,
        max_time: float | str | None = None,
        val_check_interval: int | float = 1.0,
        check_val_every_n_epoch: int = 1,
        limit_train_batches: int | float = 1.0,
        limit_val_batches: int | float = 1.0,
        limit_test_batches: int | float = 1.0,
        limit_predict_batches: int | float = 1.0,
        reload_dataloaders_every_n_epochs: int = 0,
        num_sanity_val_steps: int = 2,
        fast_dev_run: bool | int = False,
        overfit_batches: int | float = 0,
        deterministic: bool | str = False,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
        log_every_n_steps: int = 50,
        default_root_dir: str = "runs",
        save_on_each_node: bool = False,
        seed: int | None = None,
        detect_anomaly: bool = False,
        inference_mode: bool = True,
        plugin_options: dict[str, dict[str, Any]] | None = None,
        catalog: Catalog | None = None,
        **unknown: Any,
    ):
        # the core's options, as ptrain fit --help describes them (config.core_options holds
        # their converters; a test keeps these defaults equal to its defaults). An unknown
        # keyword goes on to be refused with the closest option's name.
        options = {name: value for name, value in locals().items()
                   if name not in ("self", "plugin_options", "catalog", "unknown", "__class__")}
        options["callbacks"] = list(callbacks or [])
        options.update(unknown)
        self._init_kwargs = dict(options, plugin_options=plugin_options)  # to rebuild in a worker
        objects = {k: v for k, v in options.items()  # plugin objects; names are text (or
                   if k in EXCLUSIVE_KINDS and not isinstance(v, (str, int))}  # precision=16)
        callbacks = adapt_callbacks(list(options.get("callbacks") or []), "callback-methods",
                                    self.stops_on_removed_lightning_hooks)
        named = {k: v for k, v in options.items() if k not in objects}
        named["callbacks"] = [c for c in callbacks if isinstance(c, str)]
        self.options = core_options().resolve(named, "Trainer(...)")
        self.options.update({kind: object_name(plugin) for kind, plugin in objects.items()})
        self.catalog = catalog if catalog is not None else Catalog.discover()
        selected = select_plugins(
            self.catalog,
            *(objects.get(kind, self.options[kind]) for kind in EXCLUSIVE_KINDS),
            callbacks,
        )
        self.plugins, plugin_config = self._instantiate(selected, plugin_options or {}, callbacks,
                                                        self.catalog)
        if self.options["fast_dev_run"]:  # a debugging run logs nothing: no logger takes part
            self.plugins = {name: plugin for name, plugin in self.plugins.items()
                            if not is_logger(plugin)}
        self.config: dict[str, Any] = {"trainer": dict(self.options), "plugins": plugin_config}
        self.pm = create_plugin_manager()
        for name, plugin in self.plugins.items():
            register(self.pm, plugin, name)
        # registered after the plugins: pluggy calls the first-registered of several trylast
        # implementations last, and each default (all trylast) must come after a plugin's own
        register(self.pm, LoopDefaults(), "loop-defaults")
        self.hook = self.pm.hook

        for name, value in self.options.items():  # trainer.max_epochs, trainer.precision, ...
            setattr(self, name, value)
        if self.seed is not None:  # once, here: a model built after the trainer is seeded too
            seed_everything(self.seed)
        self._check_limits()
        # -1 is "no limit" (Lightning's spelling, kept as given); max_epochs=None is decided
        # when fit starts (see _resolve_epoch_limit)
        if self.max_epochs == -1 and no_limit(self.max_steps) and self.max_time is None:
            warnings.warn("max_epochs=-1 and no max_steps or max_time: training runs until "
                          "it is stopped (a callback, a signal).", stacklevel=2)
        if self.fast_dev_run:
            self._apply_fast_dev_run()
        if self.overfit_batches:
            self.limit_train_batches = self.limit_val_batches = self.overfit_batches
        self.run_dir: Path | None = None
        self._own_log_dir: Path | None = None  # the run folder this trainer's stages write to
        self._saved_state_checked = False  # see _check_saved_state
        self._overridden_on_resume: dict[str, dict[str, Any]] = {}  # see _report_overridden
        self._background_write: BackgroundWrite | None = None  # see save_checkpoint
        self._deferred_copies: DeferredCopies | None = None  # of the save being copied
        #: set by the fit loop around on_train_batch_end (see _between_two_steps): a save there
        #: is followed by the next step's forward and backward passes only, before anything
        #: waits for its copies
        self._between_steps = False
        self._point: object | None = None  # see checkpoint_point
        self._defers_copies = True  # off once a tensor changed before its deferred copy
        self._host_buffers = HostBuffers()  # what background writes copy into
        self._copies_prepared = False  # see prepare_background_copies; once per stage
        self._planning_copies = False  # inside prepare_background_copies
        self._write_agreement = WriteAgreement()  # its group is made when first needed
        self.ckpt_path: str | None = None
        self.current_epoch = 0
        self.global_step = 0
        self.batch_idx = 0
        #: whether the training batch under way (or run last) is its epoch's last; a loader
        #: without a length is read one batch ahead to know it (as Lightning's loop is)
        self.is_last_batch = False
        self.dataloader_idx: int | None = None  # which of several evaluation dataloaders runs
        self.should_stop = False
        self.stage: str | None = None
        self.stage_call: str | None = None
        self.status = "initializing"
        self.sync_gradients = True
        self.device = torch.device("cpu")
        self.world_size = 1
        self.global_rank = 0
        self.local_rank = 0
        self.device_mesh: Any = None  # a strategy's DeviceMesh (see the class docstring)
        self.model: torch.nn.Module | None = None
        self.module: TrainModule | None = None
        self.datamodule: DataModule | None = None
        self.given_dataloaders: dict[str, Any] = {}  # stage -> the loader fit/test/... received
        # stage -> a loader asked of the module before the stage prepared it (see
        # ptrain.lightning.Trainer.estimated_stepping_batches); the stage takes it instead
        self._asked_early: dict[str, Any] = {}
        self._empty_loaders: set[str] = set()  # evaluation loaders a stage found empty, let be
        self.num_training_batches: float = math.inf  # set when fit's loop starts
        self._module_plugins: list[Any] = []
        # for saves after the stage; None: no stage has run
        self._last_stage_module_plugins: list[Any] | None = None
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_schedulers: list[dict[str, Any]] = []
        self.precision_policy = PrecisionPolicy()
        self.train_dataloader = None
        self.val_dataloader = None
        self.test_dataloader = None
        self.predict_dataloader = None
        self.sanity_checking = False  # True while the sanity check runs validation batches
        self.return_predictions = True  # predict: keep and return the outputs
        self.predictions: list[Any] | None = None
        self.batch_indices: list[int] | None = None  # predict: the batch's dataset indices
        self.num_eval_batches: float = 0  # batches of the validation/test/predict pass under way
        self.exception: BaseException | None = None
        self.metrics = MetricStore(self)
        self.loop_state: dict[str, Any] = {}
        # where this trainer's last fit ended ({"epoch", "global_step"}): a later fit without a
        # checkpoint goes on from there, as in Lightning (limits reached: nothing to train)
        self.fit_progress: dict[str, int] | None = None
        self.loss_window: list[tuple[int, int, int, torch.Tensor]] = []  # checked at check points
        self.finite_state_step: int | None = None  # the step the state was last found finite

    def _apply_fast_dev_run(self) -> None:
        """Lightning's meaning: N batches (1 for ``True``) of every stage, one epoch, no sanity
        check, and nothing written: no logger takes part (see ``__init__``), no checkpoint
        (:meth:`save_checkpoint`), and the run folder is a scratch folder (:meth:`_run`)."""
        batches = 1 if self.fast_dev_run is True else self.fast_dev_run
        for option in LIMITS.values():
            setattr(self, option, batches)
        self.max_steps, self.max_epochs, self.max_time = batches, 1, None
        self.num_sanity_val_steps = 0
        self.val_check_interval, self.check_val_every_n_epoch = 1.0, 1

    @staticmethod
    def _instantiate(selected: list[SelectedPlugin], plugin_options: dict[str, dict[str, Any]],
                     callbacks: list[Any], catalog: Catalog,
                     ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        by_name = {p.name: p for p in selected}
        blocked = split_callbacks(callbacks)[1]
        for name in plugin_options:
            if name not in by_name and name not in blocked:
                raise ConfigError(_options_outside_the_run(name, selected, catalog))
        plugins, config = {}, {}
        for plugin in selected:
            given = plugin_options.get(plugin.name, {})
            if plugin.info is None and not inspect.isclass(plugin.target):
                # an object given from Python: it has its options already
                if given:
                    raise ConfigError(f"plugin {plugin.name!r} was given as an object; pass its "
                                      f"options to its constructor, not in plugin_options.")
                plugins[plugin.name] = plugin.target
                continue
            # merged from flags, a config file and plugin_options: the message names the flag
            # and the config key, not which of them gave the value
            resolved = plugin.options.resolve(given, "")
            created = instantiate(plugin.target, plugin.name, resolved)
            if plugin.info is None:  # -p MODULE:CLASS, or a class in callbacks=[...]
                # refused where it keeps a hook of Lightning 1.x, or mixes ptrain hooks with
                # Lightning's methods on a plain object, so the one plugin is there
                created = adapt_callbacks([created], plugin.name)[0]
            plugins[plugin.name] = created
            if resolved:
                config[plugin.name] = resolved
        return plugins, config

    # -- public API -------------------------------------------------------------------------

    @property
    def default_root_dir(self) -> str:
        """The folder this trainer's run folders go under (:attr:`run_root`)."""
        return self.run_root

    @default_root_dir.setter
    def default_root_dir(self, value: Any) -> None:
        self.run_root = os.fspath(value)

    @property
    def log_dir(self) -> Path | None:
        """This run's folder (:attr:`run_dir`)."""
        return self.run_dir

    @log_dir.setter
    def log_dir(self, value: Path | None) -> None:
        self.run_dir = value

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def writes_run_files(self) -> bool:
        """Whether this process writes the run's checkpoints: global rank 0, and with
        ``save_on_each_node`` the first process of every machine (into its own disk's run
        root). Messages and logs stay with global rank 0."""
        return self.global_rank == 0 or (self.save_on_each_node and self.local_rank == 0)

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        return self.metrics.callback_metrics

    @property
    def loggers(self) -> list[Any]:
        """The run's logger plugins: those implementing ``log_metrics`` or ``log_hyperparams``."""
        return [plugin for plugin in self.plugins.values() if is_logger(plugin)]

    @property
    def last_checkpoint_path(self) -> Path:
        """Where this run's resumable checkpoint goes (what ``ckpt_path="last"`` finds)."""
        assert self.run_dir is not None
        return self.run_dir / LAST_CHECKPOINT

    def fit(self, module: TrainModule, datamodule: DataModule | None = None,
            ckpt_path: str | None = None, *, train_dataloaders: Any = None,
            val_dataloaders: Any = None) -> None:
        """Train ``module``; with ``ckpt_path`` (a path, ``"last"`` or ``"best"``) resume
        exactly; ``"auto"``: from ``"last"`` when there is one, else from the start.
        Dataloaders given here are used instead of the module's (or the datamodule's) for
        their stage."""
        self._run("fit", module, datamodule, ckpt_path,
                  {"train": train_dataloaders, "validate": val_dataloaders})

    def validate(self, module: TrainModule, datamodule: DataModule | None = None,
                 ckpt_path: str | None = None, *,
                 dataloaders: Any = None) -> list[dict[str, float]]:
        """Run one validation pass; returns ``[metrics]`` like Lightning. ``ckpt_path`` (a path,
        ``"last"`` or ``"best"``) loads those weights first."""
        self._run("validate", module, datamodule, ckpt_path, {"validate": dataloaders})
        return self.metrics.results

    def test(self, module: TrainModule, datamodule: DataModule | None = None,
             ckpt_path: str | None = None, *, dataloaders: Any = None) -> list[dict[str, float]]:
        """Run one pass of ``test_step`` over the test dataloader; returns ``[metrics]`` (what
        ``test_step`` logged, averaged over the test set and reduced across processes)."""
        self._run("test", module, datamodule, ckpt_path, {"test": dataloaders})
        return self.metrics.results

    def predict(self, module: TrainModule, datamodule: DataModule | None = None,
                ckpt_path: str | None = None, return_predictions: bool = True, *,
                dataloaders: Any = None) -> list[Any] | None:
        """Run ``predict_step`` over the predict dataloader and return its outputs, one per
        batch: under several processes gathered from all of them in dataset order, without the
        samples a distributed sampler repeats, batched as one process would have. With
        ``return_predictions=False`` nothing is kept (stream them to disk with the
        ``prediction-writer`` callback) and ``None`` is returned."""
        self.return_predictions = return_predictions
        return self._run("predict", module, datamodule, ckpt_path, {"predict": dataloaders})

    @contextlib.contextmanager
    def init_module(self, empty_init: bool | None = None) -> Iterator[None]:
        """Create the layers made in this block the way the run's plugins want them: under a
        sharding strategy on the ``meta`` device (no memory, no values), so that a model larger
        than one process's memory can be built; its parameters get their memory (each rank its
        shards) and initial values (from each module's ``reset_parameters()``) when the model
        is wrapped, see :mod:`ptrain.meta_init`. ``empty_init``: ``True`` creates them on the
        meta device under every strategy, ``False`` whole under every strategy, ``None`` as
        the strategy prefers. The module's ``configure_model()`` runs in this block too.

        ::

            trainer = Trainer(strategy="fsdp", devices=8)
            with trainer.init_module():
                model = MyTransformer()   # nothing allocated yet
            trainer.fit(model)
        """
        with contextlib.ExitStack() as stack:
            for context in self.hook.module_init_context(trainer=self, empty_init=empty_init):
                stack.enter_context(context)
            yield

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The module's state dict with every tensor whole and on the CPU, on global rank 0;
        ``None`` on the other ranks. Under a sharding strategy each rank keeps only its shards
        after ``fit``: this gathers them, one tensor at a time, so it is a collective that every
        rank must call. Refused (:class:`ConfigError`, on every rank) when the whole weights
        would not fit in the memory rank 0's machine has available; then write a checkpoint and
        ``ptrain export`` it, which reads a sharded checkpoint without a process group."""
        if self.module is None:
            raise ConfigError("full_state_dict(): no module yet; call it after fit, validate, "
                              "test or predict.")
        needed = sum(t.numel() * t.element_size() for t in self.module.state_dict().values()
                     if isinstance(t, torch.Tensor))
        available = self._rank_zero_value(_available_memory() if self.is_global_zero else None)
        if available is not None and needed > available:
            raise ConfigError(
                f"the module's whole weights take {needed / 2**30:.1f} GiB, more than the "
                f"{available / 2**30:.1f} GiB of memory available to rank 0; gather them "
                f"elsewhere: trainer.save_checkpoint(path) writes them sharded, and `ptrain "
                f"export PATH --output model.safetensors` turns that into one file.")
        return full_state_dict(self.module, keep=self.is_global_zero)

    def save_full_weights(self, path: str | Path, *, force: bool = False) -> None:
        """Write the module's whole weights to ``path`` as one safetensors file (the format of
        ``ptrain export``, with the module's class and hyperparameters), gathered as
        :meth:`full_state_dict` gathers them: every rank calls it, rank 0 writes. An existing
        file is refused unless ``force``."""
        from ptrain.export import check_output, write_weights

        path = Path(path)
        problem = None
        if self.is_global_zero:
            try:
                check_output(path, None, force)
            except ConfigError as exc:
                problem = exc
        problem = self._rank_zero_value(problem)  # every rank stops, or none does
        if problem is not None:
            raise problem
        state = self.full_state_dict()
        if state is not None:
            write_weights(state, path, {"module_class": class_path(self.module),
                                        "hyper_parameters": saved_hyperparameters(
                                            self.module.hparams),
                                        "ptrain_version": __version__})

    def _rank_zero_value(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank (a collective under several processes)."""
        if self.world_size == 1:
            return value
        return self.hook.all_gather_object(trainer=self, obj=value)[0]

    def save_checkpoint(self, path: str | Path, weights_only: bool = False,
                        asynchronous: bool = False) -> bool:
        """Write a checkpoint of the whole run (on every process; the strategy decides who
        writes). Refuses, with :class:`NonFiniteLossError`, to save over good state after the
        loss went non-finite, and with :class:`NonFiniteStateError` when a parameter or
        optimizer state tensor is (:mod:`ptrain.finite_state`; an asynchronous save in a single
        process whose files hold copies of the state checks those on the writer's thread
        instead, and its refusal comes as a failed write's does). Under ``fast_dev_run``
        nothing is written.

        ``weights_only``: the module's weights, class, hyperparameters and counters only (no
        optimizer, scheduler, random or plugin state; ``checkpoint["weights_only"]`` is
        ``True``): it loads into ``validate``/``test``/``predict``, ``load_from_checkpoint`` and
        ``ptrain export``, but ``fit`` can't resume from it.

        ``asynchronous``: inside a stage, where :meth:`why_not_asynchronous` finds nothing
        against it, the checkpoint is copied to host memory and written on a background thread
        (``save_checkpoint_in_background``, :mod:`ptrain.background_write`; for a save made
        between two training steps (in ``on_train_batch_end``), the copies of what only an
        optimizer step changes are made on that thread, and the next batch waits for them
        before its optimizer step or, taking none, after its backward pass:
        :meth:`wait_for_checkpoint_copies`. Once such a copy found its tensor changed
        before it was made, the save fails with :class:`ChangedBeforeCopiedError` and this
        trainer's later saves copy everything on the training thread); returns ``True``
        then, ``False`` once a synchronous write is done (outside a stage no step boundary or
        stage end would finish a background write, and the process could end before it: the
        save is written before it returns). Every save first waits for the
        background write in flight (one at most), unless both are of one
        :meth:`checkpoint_point`;
        :meth:`finish_checkpoint_write` waits for it, :meth:`settle_checkpoint_write` finishes
        it once it has ended, and :meth:`after_checkpoint_write` runs what needs the file
        complete, with the write's error; without one, a failed background save raises its
        error where its write is finished: at the next save, step boundary that settles it, or
        stage end."""
        from ptrain.finite_state import check_state_finite, copy_check, optimized_tensors
        from ptrain.fit_loop import check_losses_finite

        # one write in flight: a synchronous save, or another point's, waits for it
        self.finish_checkpoint_write(unless_this_point=asynchronous)
        check_losses_finite(self)
        if self.fast_dev_run:  # a debugging run writes nothing
            return False
        background = (asynchronous and self.stage is not None
                      and self.why_not_asynchronous() is None)
        # one process checks what it writes on the writer's thread (copy_check); several
        # agree on the check (a collective), which the writers' threads could not join
        checks_copies = background and self.world_size == 1
        if not checks_copies:
            check_state_finite(self)
        # outside a stage the plugins the module brought to the last one are not registered;
        # they give their part (on_save_checkpoint, the states of the callbacks its
        # configure_callbacks returned) to this save as to one made in that stage
        outside = self.stage is None and self.module is not None and not self._module_plugins
        replaced = (self._register_module_plugins(self._last_stage_module_plugins)
                    if outside else None)
        try:
            checkpoint = self._checkpoint_contents(weights_only)
            if not self._saved_state_checked:
                self._check_saved_state(checkpoint)
                # a weights-only file leaves the plugins' and the datamodule's state unchecked
                self._saved_state_checked = not weights_only
        finally:
            if replaced is not None:
                self._unregister_module_plugins(replaced)
        if background:
            if self._background_write is None:
                self._background_write = BackgroundWrite(self.global_step, self._host_buffers,
                                                         self._point)
            write = self._background_write
            first = write.begin_part()
            copied_before = len(write.memo)
            # the first part's copies of what only an optimizer step changes are made on the
            # writer's thread, before its files, when the save is made between two steps; a
            # later part's would wait for those files
            defers = first and self._between_steps and self._defers_copies
            self._deferred_copies = DeferredCopies(optimized_tensors(self)) if defers else None
            try:
                files = self.hook.save_checkpoint_in_background(
                    trainer=self, checkpoint=checkpoint, path=str(path))
            finally:  # the memo holds their buffers: a later part may share them
                deferred, self._deferred_copies = self._deferred_copies, None
                if deferred:
                    write.add_copies(deferred)
            if checks_copies:  # this save's own copies, before its files
                check = copy_check(self, dict(islice(write.memo.items(), copied_before, None)),
                                   write.memo, weights_only)
                if check is None:  # the files hold something made from the state: checked
                    check_state_finite(self)  # here, as a synchronous save would be
                else:
                    write.add(check)
                    write.checks_state |= not weights_only
            for write_file in files:
                write.add(write_file)
            return True
        self.hook.save_checkpoint(trainer=self, checkpoint=checkpoint, path=str(path))
        return False

    def _checkpoint_contents(self, weights_only: bool) -> dict[str, Any]:
        """What a checkpoint of the run holds now (see :meth:`save_checkpoint`), with the
        live tensors in it."""
        checkpoint = {
            "format": checkpoint_io.FORMAT,
            "format_version": checkpoint_io.FORMAT_VERSION,
            "ptrain_version": __version__,
            "model": self.module.state_dict(),
            "module_class": class_path(self.module),
            **checkpoint_entries(self.module, MODULE_KEYS),
        }
        if self.datamodule is not None:
            checkpoint["datamodule_class"] = class_path(self.datamodule)
            checkpoint.update(checkpoint_entries(self.datamodule, DATAMODULE_KEYS))
        if weights_only:
            checkpoint.update(weights_only=True, optimizers=[], plugins={}, loop={
                "global_step": self.global_step, "epoch": self.current_epoch})
            # only the states of the plugins that ask (the module's on_save_checkpoint, which
            # its on_load_checkpoint reads when load_from_checkpoint rebuilds it)
            for impl in self.hook.state_dict.get_hookimpls():
                if getattr(impl.plugin, "saves_in_weights_only", False):
                    state = call_impl(impl, trainer=self, checkpoint=checkpoint)
                    if state:
                        checkpoint["plugins"][impl.plugin_name] = state
        else:
            checkpoint.update({
                "optimizers": [opt.state_dict() for opt in self.optimizers],
                "lr_schedulers": [s["scheduler"].state_dict() for s in self.lr_schedulers],
                "loop": dict(self.loop_state, global_step=self.global_step,
                             elapsed=self._elapsed()),
                "rng": checkpoint_io.capture_rng_states(),
                "metrics": {stage: {k: list(v) for k, v in sums.items()}
                            for stage, sums in self.metrics.epoch_sums.items()},
                "config": (dict(self.config, overridden_on_resume=self._overridden_on_resume)
                           if self._overridden_on_resume else self.config),
            })
            datamodule_state = self.datamodule.state_dict() if self.datamodule else None
            if datamodule_state:
                checkpoint["datamodule_state"] = datamodule_state
            checkpoint["plugins"] = {}  # each plugin reads the checkpoint as assembled so far
            for impl in self.hook.state_dict.get_hookimpls():
                state = call_impl(impl, trainer=self, checkpoint=checkpoint)
                if state is not None:
                    checkpoint["plugins"][impl.plugin_name] = state
        return checkpoint

    def copy_for_background(self, obj: Any) -> Any:
        """``obj`` (dicts, lists and tuples of tensors and plain values) with every tensor
        copied to host memory, for the background write of this checkpoint point: a tensor
        already copied for it (the weights of a top-k file and of ``last.ckpt``) is not copied
        again. For a save between two training steps, the copies of what only an optimizer
        step changes are made later, on the writer's thread before the write's functions run,
        and the next batch waits for them (before its optimizer step): read the copies only in
        those functions. The copies are written into once more for the next checkpoint point,
        once this one's write has finished: nothing may keep them past it. For
        ``save_checkpoint_in_background`` implementations; see
        :func:`ptrain.background_write.host_copy`,
        :class:`~ptrain.background_write.DeferredCopies` and
        :class:`~ptrain.background_write.HostBuffers`."""
        if self._background_write is not None:
            return host_copy(obj, self._background_write.memo, self._host_buffers,
                             self._deferred_copies)
        if self._planning_copies:  # prepare_background_copies: recorded, not copied
            return host_copy(obj, {}, self._host_buffers)
        raise RuntimeError("copy_for_background is for save_checkpoint_in_background, while "
                           "trainer.save_checkpoint(..., asynchronous=True) runs")

    def prepare_background_copies(self) -> None:
        """Allocate, on a thread of their own while training goes on, the host buffers that
        the first asynchronous save of this stage will copy this process's checkpoint into
        (:class:`~ptrain.background_write.HostBuffers`); otherwise that save waits for them
        (fresh memory is slow to touch the first time, pinned memory for CUDA tensors slower
        still to allocate). What to allocate is asked of the strategy: the checkpoint as it
        is now goes through ``save_checkpoint_in_background`` (its path ``os.devnull``) with
        :meth:`copy_for_background` recording instead of copying, and the functions returned
        are never run. The checkpoint callback calls it with ``async_save`` once the first
        optimizer step has made the optimizers' state. On every process at the same point
        (the strategy's hook may be a collective); it does nothing after its first call in a
        stage, under ``fast_dev_run``, while a write is in flight, and where saves can't be
        asynchronous."""
        if self._copies_prepared:
            return
        self._copies_prepared = True
        if self.fast_dev_run or self._background_write is not None \
                or self.why_not_asynchronous() is not None:
            return  # nothing to copy, or a write in flight whose copies will be the buffers
        checkpoint = self._checkpoint_contents(weights_only=False)
        self._planning_copies = True
        try:
            with self._host_buffers.planning():
                self.hook.save_checkpoint_in_background(trainer=self, checkpoint=checkpoint,
                                                        path=os.devnull)
        except CheckpointWriteError:
            pass  # a refusal while copying: the save meets it too, and its policy decides
        finally:
            self._planning_copies = False

    def why_not_asynchronous(self) -> str | None:
        """Why a checkpoint can't be written in the background in this run, or ``None``: a
        plugin that writes the run's checkpoints itself (``save_checkpoint``), or wraps their
        writing, and does not also implement ``save_checkpoint_in_background``."""
        background = {impl.plugin_name
                      for impl in self.hook.save_checkpoint_in_background.get_hookimpls()}
        writers = [impl.plugin_name for impl in self.hook.save_checkpoint.get_hookimpls()
                   if impl.plugin_name not in background]
        if writers:
            return (f"plugin {writers[-1]!r} writes this run's checkpoints itself "
                    f"(save_checkpoint) and can't write them in the background "
                    f"(no save_checkpoint_in_background)")
        return None

    def after_checkpoint_write(self, continuation: Callable[[BaseException | None], None]
                               ) -> None:
        """Run ``continuation`` with the write's error (``None``: written) once the checkpoint
        write in flight is finished, on this thread; at once when none is in flight. The error
        is then the continuation's to handle (or raise): the save is not raised again."""
        if self._background_write is None:
            continuation(None)
        else:
            self._background_write.then(continuation)

    def wait_for_checkpoint_copies(self) -> None:
        """Before anything that changes the parameters the optimizers hold or their state (an
        optimizer step): wait until the checkpoint write in flight has made its copies of them
        (:class:`~ptrain.background_write.DeferredCopies`). Costs nothing without a write."""
        if self._background_write is not None:
            self._background_write.wait_for_copies()

    @contextlib.contextmanager
    def checkpoint_point(self) -> Iterator[None]:
        """Inside, the saves made are one checkpoint point (a top-k file and ``last.ckpt``):
        nothing may change the state between them, so the background ones share one write and
        one host copy. Any other save, even at the same step (the state may have changed since:
        a forward's batch norm statistics, a callback), first waits for the write in flight and
        copies what it writes. Nested, it is the outer point."""
        if self._point is not None:
            yield
            return
        self._point = object()
        try:
            yield
        finally:
            self._point = None

    @contextlib.contextmanager
    def _between_two_steps(self) -> Iterator[None]:
        """Around the fit loop's ``on_train_batch_end``: a background save made inside leaves
        its copies of what only an optimizer step changes to the writer's thread, which starts
        them once every implementation has run (a later one may change the weights through
        ``.data``, which no version counter sees: the file then holds them as the next step
        does, never some before the change and some after)."""
        self._between_steps = True
        try:
            yield
        finally:
            self._between_steps = False
            if self._background_write is not None:
                self._background_write.release_copies()

    def finish_checkpoint_write(self, unless_this_point: bool = False) -> None:
        """Wait for the checkpoint write in flight, if any (with ``unless_this_point``: unless
        it is the :meth:`checkpoint_point`'s being made), and run what waited on it
        (:meth:`after_checkpoint_write`). A save whose files failed, and that nothing waited
        on (on any process), raises its error here (as it would have from ``save_checkpoint``
        had it been synchronous): its caller would not hear of it otherwise. A
        :class:`ChangedBeforeCopiedError`, which a synchronous save can't meet, is said in a
        warning instead, and the run goes on."""
        write = self._background_write
        if write is None or (unless_this_point and write.point is not None
                             and write.point is self._point):
            return
        self._background_write = None
        error = write.finish(self._write_agreement.agreed_outcome if self.world_size > 1 else None)
        if isinstance(error, ChangedBeforeCopiedError):  # e.g. a forward that renorms weights
            self._defers_copies = False
        if error is None and write.checks_state:
            self.finite_state_step = max(write.step, self.finite_state_step or 0)
        unheard = write.unheard_error
        if isinstance(unheard, ChangedBeforeCopiedError):
            # the background copy's own limit, which a synchronous save doesn't have: said,
            # and the run goes on (its later saves copy everything first)
            if self.is_global_zero:
                print(f"ptrain: warning: {unheard} Training goes on; this run's later "
                      f"background saves copy everything before training goes on.",
                      file=sys.stderr, flush=True)
        elif unheard is not None:
            raise unheard

    def settle_checkpoint_write(self) -> None:
        """At a step boundary: a checkpoint write that has ended (under several processes, on
        every process) is finished now (:meth:`finish_checkpoint_write`), so that its refusal is
        said, or stops the run, at once. Every process calls it at the same boundaries: while a
        write is in flight it is then a 1-element all-reduce on a CPU group (no host sync with
        the device)."""
        write = self._background_write
        if write is None:
            return
        ended = write.done()
        if self.world_size > 1:
            ended = self._write_agreement.all_ended(ended)
        if ended:
            self.finish_checkpoint_write()

    def checkpoint_write_done(self) -> bool:
        """Whether no checkpoint write is in flight in this process, or the one in flight has
        ended here (never blocks, not a collective)."""
        return self._background_write is None or self._background_write.done()

    def _check_saved_state(self, checkpoint: dict[str, Any]) -> None:
        """At the first save of a stage: every part of ``checkpoint`` that a plugin or the user
        contributes must load back the way this run reads checkpoints (the weights-only loader,
        see :meth:`_unloadable_reason`), or no checkpoint of the run could be resumed; the part
        that can't is named now, before training goes on."""
        parts = [(f"plugin {name!r}: its state_dict()", state, PluginError)
                 for name, state in checkpoint["plugins"].items()]
        parts += [("the module's hyperparameters (save_hyperparameters / hparams)",
                   checkpoint["hyper_parameters"], ModelError),
                  ("the datamodule's hyperparameters", checkpoint.get(
                      "datamodule_hyper_parameters"), ModelError),
                  ("the datamodule's state_dict()", checkpoint.get("datamodule_state"),
                   ModelError)]
        for what, value, error in parts:
            reason, reader = self._unloadable_reason(value)
            if reason is not None:
                raise error(
                    f"{what} can't go into a checkpoint that loads again: {reason}. Checkpoints "
                    f"are read with {reader}, so a checkpoint holding it could never be "
                    f"resumed; nothing was written. Keep to tensors, numbers, text, lists and "
                    f"dicts there (a class as its import path, an object as its fields).")

    def _unloadable_reason(self, value: Any) -> tuple[str | None, str]:
        """Why ``value`` could not be read back from a checkpoint of this run (``None``: it
        can), and what reads this run's checkpoints: torch's weights-only loader."""
        return checkpoint_io.unloadable_reason(value), "torch's weights-only loader"

    def run_backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` through the ``backward`` hook, with ``on_before_backward`` and
        ``on_after_backward`` around it (each only when implemented). Manual optimization calls
        it through ``manual_backward``; the training loop does the same steps inline."""
        hooks = self.step_hooks
        if hooks.has_on_before_backward:
            hooks.on_before_backward(trainer=self, loss=loss)
        hooks.backward(trainer=self, loss=loss)
        if hooks.has_on_after_backward:
            hooks.on_after_backward(trainer=self)

    def run_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale/inspect, clip and step ``optimizer`` through the hooks; counts a global step.
        Manual optimization calls it through ``optimizer.step()``; the training loop does the
        same steps inline at the end of each accumulation window."""
        hooks = self.step_hooks
        self.wait_for_checkpoint_copies()
        if hooks.has_on_before_optimizer_step:
            hooks.on_before_optimizer_step(trainer=self, optimizer=optimizer)
        if self.gradient_clip_val is not None or hooks.clips_every_step:
            hooks.clip_gradients(trainer=self, optimizer=optimizer)
        hooks.optimizer_step(trainer=self, optimizer=optimizer)
        self.global_step += 1

    # -- running a stage ----------------------------------------------------------------------

    def _run(self, stage: str, module: TrainModule, datamodule: DataModule | None,
             ckpt_path: str | None, dataloaders: dict[str, Any]) -> dict[str, float]:
        if not isinstance(module, TrainModule):
            raise ModelError(f"the model must be a ptrain.TrainModule, got "
                             f"{type(module).__module__}.{type(module).__qualname__}; subclass "
                             f"ptrain.TrainModule (training_step, configure_optimizers).")
        if datamodule is not None and not isinstance(datamodule, DataModule):
            raise ModelError(f"datamodule must be a ptrain.DataModule, got "
                             f"{type(datamodule).__qualname__}.")
        _check_stage_methods(stage, module)
        self.stage_call, self.status = stage, "running"
        try:
            result = self._run_checked(stage, module, datamodule, ckpt_path, dataloaders)
        except BaseException:
            self.status = "interrupted"
            raise
        self.status = "finished"
        return result

    def _run_checked(self, stage: str, module: TrainModule, datamodule: DataModule | None,
                     ckpt_path: str | None, dataloaders: dict[str, Any]) -> dict[str, float]:
        self.module, self.datamodule = module, datamodule
        self._last_stage_module_plugins = None  # another stage's module may have brought them
        self.given_dataloaders = {k: v for k, v in dataloaders.items() if v is not None}
        checkpoint_file = self._resolve_ckpt_path(ckpt_path, stage)
        self.ckpt_path = None if checkpoint_file is None else str(checkpoint_file)
        scratch = reserved = None
        if self.fast_dev_run:  # whatever a plugin writes goes to a folder removed at the end
            scratch = tempfile.mkdtemp(prefix="ptrain-fast-dev-run-")
            self.run_dir = Path(scratch)
            print(f"fast_dev_run: {self.limit_train_batches} batch(es) of each stage, one "
                  f"epoch; no checkpoint or log is written.", flush=True)
        else:
            first_stage = self._own_log_dir is None
            self.run_dir = self._own_log_dir = self._choose_log_dir(checkpoint_file, stage)
            if first_stage and run_folder.decides_for_job():
                reserved = self.run_dir  # removed if the stage writes nothing in it
        # one fit at a time writes a run's checkpoints (the process that chose the folder)
        lock = (run_folder.RunLock.acquire(self.run_dir) if stage == "fit" and scratch is None
                and run_folder.decides_for_job() else None)
        if lock is not None:  # what a run's killed writes left there, before this one writes
            run_folder.remove_unfinished_writes(self.run_dir)
        try:
            function = StageFunction(self, stage, checkpoint_file)
            result = self.hook.launch(trainer=self, function=function)
            if result is None:
                return function()
            if isinstance(result, WorkerResult):
                return self._adopt(result, stage)
            return result
        finally:
            if lock is not None:
                lock.release()
            # a stage that wrote nothing in its run folder (failed at its start, or nothing to
            # write: no checkpoint, no logger) leaves no folder behind
            if reserved is not None and run_folder.is_empty_run(reserved):
                run_folder.release_unused(reserved)
                self._own_log_dir = None
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    def adopt_run_dir(self, run_dir: Path | None) -> None:
        """Write into ``run_dir``, the job's run folder (global rank 0's choice), as this
        trainer's own: this stage's files, and the later stages' of this trainer, and what
        its loggers name as their folder (``None``: a debugging run's, which writes none).
        A multi-process strategy calls it on every rank once the processes can talk."""
        self.run_dir = run_dir
        if run_dir is not None and self._own_log_dir is not None:
            self._own_log_dir = run_dir

    def _adopt(self, result: WorkerResult, stage: str) -> dict[str, float] | list[Any] | None:
        """Take over what the workers ended with (the lowest rank on this machine): the module
        leaves ``fit`` trained, and the counters, metrics and predictions read as after a run
        here."""
        if result.model is not None:
            self._configure_model(empty_init=False)  # the layers to hold the weights, whole
            self.module.load_state_dict(result.model)
        if stage == "fit":  # the counters of training (an evaluation stage leaves them)
            self.global_step, self.current_epoch = result.global_step, result.current_epoch
            self.fit_progress = {"epoch": result.current_epoch,
                                 "global_step": result.global_step}
        self.metrics.callback_metrics.clear()
        self.metrics.callback_metrics.update(
            {k: torch.tensor(v) for k, v in result.metrics.items()})
        self.metrics.results = list(result.results or [])
        if stage == "predict":
            self.predictions = result.predictions
            return result.predictions
        return result.metrics

    def _run_stage(self, stage: str, checkpoint_file: Path | None) -> dict[str, float]:
        from ptrain.evaluation_loop import run_evaluation, run_prediction
        from ptrain.fit_loop import FitLoop

        self.stage = "train" if stage == "fit" else stage
        self.stage_call, self.status = stage, "running"  # also in a worker process
        self._asked_early = {}
        if stage == "fit" and self.max_epochs is None:  # decided now, as in Lightning
            self.max_epochs = 1000 if no_limit(self.max_steps) and self.max_time is None else -1
        self.exception = None
        self._saved_state_checked = False  # see _check_saved_state
        self.finite_state_step = None
        self._overridden_on_resume = {}
        self.metrics.reset()  # a stage reports its own metrics only
        module = self.module
        module._trainer = self
        if self.datamodule is not None:
            self.datamodule.__dict__["_trainer"] = self
        self._start_time = time.monotonic()
        replaced = self._register_module_plugins()
        try:
            self.device = self.hook.setup_device(trainer=self)
            if not isinstance(self.device, torch.device):
                raise PluginError(f"the accelerator {self.options['accelerator']!r} chose no "
                                  f"device: its setup_device returned {self.device!r} instead of "
                                  f"a torch.device.")
            self.precision_policy = self.hook.precision_policy(trainer=self)
            self._prepare_data()
            if self.datamodule is not None:
                self.datamodule.setup(stage=stage)
            self.hook.on_stage_start(trainer=self, stage=stage)
            module.setup(stage=stage)
            self._configure_model(empty_init=None)
            module.zero_grad()  # no gradient left from before the stage (Lightning's too)
            self.model = self.hook.wrap_model(trainer=self, model=StepModule(module))
            if not isinstance(self.model, torch.nn.Module):
                raise PluginError(_not_a_model(self))
            if stage == "fit":
                setup = configure_optimizers(module, TrainModule)
                _check_optimized_parameters(module, setup)
                self._wrap_optimizers(setup)
            # with a sanity check, the validation loader is asked for first, for it, and the
            # random state is put back after (a val_dataloader() that draws random data leaves
            # the training run as it would be without the check), as in Lightning; without one,
            # the training loader comes first, as Lightning asks for validation's later
            if stage == "fit":
                self._say_validation_skipped(module)
            sanity = stage == "fit" and self.num_sanity_val_steps != 0
            self._empty_loaders = set()
            for loader_stage in (reversed(_STAGE_LOADERS[stage]) if sanity
                                 else _STAGE_LOADERS[stage]):
                # no validation_step, or an evaluation limited to 0 batches: the loader is not
                # even asked for, as in Lightning
                skipped = ((loader_stage == "validate" and not implements(module,
                                                                          "validation_step"))
                           or (loader_stage in ("validate", "test")
                               and getattr(self, LIMITS[loader_stage]) == 0))
                rng = (checkpoint_io.capture_rng_states()
                       if sanity and loader_stage == "validate" and not skipped else None)
                setattr(self, _LOADER_ATTRIBUTES[loader_stage],
                        None if skipped else self._dataloader(loader_stage))
                if rng is not None:
                    checkpoint_io.restore_rng_states(rng)
            if stage == "fit":
                self._say_validation_step_unused(module)
            main_loader = _STAGE_LOADERS[stage][0]
            if getattr(self, _LOADER_ATTRIBUTES[main_loader]) is None and not (
                    main_loader in ("validate", "test")
                    and (getattr(self, LIMITS[main_loader]) == 0
                         or main_loader in self._empty_loaders)):
                method = _LOADER_METHODS[main_loader]
                raise ModelError(f"{type(module).__qualname__} has no {_DATA_NAMES[main_loader]} "
                                 f"data: implement {method}() on the module or on a DataModule "
                                 f"passed with it.")
            checkpoint = self._restore(checkpoint_file, stage) if checkpoint_file else None
            self.step_hooks = StepHooks(self.pm, self)
            self.hook.setup(trainer=self, stage=stage)
            self.hook.log_hyperparams(trainer=self, hyperparameters=logged_hyperparameters({
                **(self.datamodule.hparams if self.datamodule and
                   self.datamodule.logs_hyperparameters else {}),
                **(module.hparams if module.logs_hyperparameters else {})}))
            # restores the previous mode on leaving; check_nan: a backward that makes a NaN
            # raises, naming the forward operation that led to it
            with torch.autograd.set_detect_anomaly(self.detect_anomaly, check_nan=True), \
                    deterministic_algorithms(self.deterministic):
                if stage == "fit":
                    FitLoop(self, checkpoint).run()
                elif stage == "predict":
                    self.predictions = run_prediction(self)
                else:
                    run_evaluation(self, stage)
                self.finish_checkpoint_write()  # a stage returns with its files complete
            if stage == "predict":
                return self.predictions
            return {k: float(v) for k, v in self.callback_metrics.items()}
        except BaseException as exc:
            self.exception = exc
            self._finish_write_after_error()
            reported = self.hook.report_error(trainer=self, exception=exc)
            if reported is not None and reported is not exc:
                self.exception = reported
                raise reported from None
            raise
        finally:
            self.stage = None
            self._host_buffers.release()
            self._copies_prepared = False
            replaced_files.wait()  # the stage ends with the replaced checkpoints' space free
            try:
                self._teardown(stage, module)
            finally:
                self._unregister_module_plugins(replaced)
                for loader in (self.train_dataloader, self.val_dataloader, self.test_dataloader,
                               self.predict_dataloader):
                    stop_workers(loader)

    def _finish_write_after_error(self) -> None:
        """A stage that fails still waits for its checkpoint write in flight, so the last
        complete checkpoint is on disk; the write's own failure is said, not raised (the
        stage's error is the one to raise), and nothing that waited on the write runs. The
        ranks don't agree here: the failure may be one rank's own."""
        write, self._background_write = self._background_write, None
        if write is None:
            return
        write.discard_continuations()
        error = write.finish()
        if error is not None and self.is_global_zero:
            print(f"ptrain: warning: the checkpoint being written when the run failed was not "
                  f"completed: {error}", file=sys.stderr, flush=True)

    def _teardown(self, stage: str, module: TrainModule) -> None:
        """Every plugin's ``teardown`` (in hook order), then the module's and the datamodule's,
        each called even when one before it raised: one failed release must not keep the
        others from theirs (a logger's flush, a worker pool's shutdown). A failure is said in a
        warning that names whose teardown raised; the stage's outcome stands (its checkpoints,
        logs and results were written before teardown), and a stage that failed raises its own
        error, not the teardown's."""
        def release_plugins(stage: str) -> None:
            for impl in reversed(self.hook.teardown.get_hookimpls()):
                self._said_if_raises(f"plugin {impl.plugin_name!r}", _call_teardown_impl,
                                     impl, self, stage)

        observation = observation_of(self.pm)  # the testing kit and --trace see one call
        if observation is not None:
            release_plugins = observation.observed_caller("teardown", release_plugins)
        release_plugins(stage=stage)
        for owner in (module, self.datamodule):
            if owner is not None:
                self._said_if_raises(f"{type(owner).__qualname__}.teardown", owner.teardown,
                                     stage=stage)

    def _said_if_raises(self, who: str, function: Any, *args: Any, **kwargs: Any) -> None:
        """Call a teardown; an exception it raises becomes a warning naming ``who`` (see
        :meth:`_teardown`)."""
        try:
            function(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - said, and the other teardowns still run
            from ptrain.frames import dataloader_worker_death, plugin_origin

            if dataloader_worker_death(exc) is not None and any(
                    dataloader_worker_death(error) is not None
                    for error in _causes(self.exception)):
                return  # torch's signal handler saying again, wherever it lands, that the
                # worker whose death failed the stage died: the stage's error says it
            origin = plugin_origin(exc) or f"{who} raised {type(exc).__name__} in teardown"
            outcome = ("the stage had already failed; its own error follows" if
                       self.exception is not None else
                       "the stage had finished: its checkpoints, logs and results stand")
            warnings.warn(f"{origin}: {exc}. The other teardowns ran; {outcome}.",
                          stacklevel=3)

    def _configure_model(self, empty_init: bool | None) -> None:
        """Call the module's ``configure_model()`` inside the plugins' init contexts, the first
        time a stage runs it (a module already configured is left as it is)."""
        module = self.module
        if type(module).configure_model is TrainModule.configure_model \
                or getattr(module, "_model_configured", False):
            return
        with self.init_module(empty_init=empty_init):
            module.configure_model()
        module._model_configured = True

    def _register_module_plugins(self, plugins: list[Any] | None = None
                                 ) -> list[tuple[str, Any]]:
        """Register the plugins the module brings (its hook methods, its
        ``configure_callbacks``): ``plugins``, else made anew for this stage; one named like a
        plugin of the trainer replaces it. Returns the replaced ``(name, plugin)`` pairs for
        :meth:`_unregister_module_plugins`."""
        replaced = []
        self._module_plugins = []
        if plugins is None:
            plugins = module_plugins(self.module, TrainModule,
                                     self.stops_on_removed_lightning_hooks)
        for plugin in plugins:
            name = object_name(plugin)
            existing = self.pm.get_plugin(name)
            if existing is not None:
                self.pm.unregister(existing)
                replaced.append((name, existing))
            register(self.pm, plugin, name)
            self._module_plugins.append(plugin)
        return replaced

    def _unregister_module_plugins(self, replaced: list[tuple[str, Any]]) -> None:
        for plugin in self._module_plugins:
            self.pm.unregister(plugin)
        self._last_stage_module_plugins, self._module_plugins = self._module_plugins, []
        for name, plugin in replaced:
            register(self.pm, plugin, name)

    def _prepare_data(self) -> None:
        """``prepare_data()`` of the datamodule and the module, where overridden: once per
        machine, in the process of local rank 0, while the others wait."""
        owners = [owner for owner, base in ((self.datamodule, DataModule),
                                            (self.module, TrainModule))
                  if owner is not None and type(owner).prepare_data is not base.prepare_data]
        if not owners:
            return
        if self.local_rank == 0:
            for owner in owners:
                owner.prepare_data()
        if self.world_size > 1:  # a collective: no process goes on before the data is there
            self.hook.all_gather_object(trainer=self, obj=None)

    def _wrap_optimizers(self, setup: OptimizerSetup) -> None:
        if self.module.automatic_optimization and len(setup.optimizers) > 1:
            raise ModelError(
                f"configure_optimizers returned {len(setup.optimizers)} optimizers; automatic "
                f"optimization steps one. Set `automatic_optimization = False` on the module and "
                f"step them yourself (self.optimizers(), self.manual_backward(loss))."
            )
        self.optimizers = []
        for optimizer in setup.optimizers:
            wrapped = self.hook.wrap_optimizer(trainer=self, optimizer=optimizer)
            for entry in setup.lr_schedulers:
                if entry["scheduler"].optimizer is optimizer and wrapped is not optimizer:
                    rebind_scheduler(entry["scheduler"], wrapped)
            self.optimizers.append(wrapped)
        if self.monitors_only_plateau_schedulers:
            for entry in setup.lr_schedulers:
                if not entry["reduce_on_plateau"] and entry["monitor"] is not None:
                    entry["ignored_monitor"], entry["monitor"] = entry["monitor"], None
        self.lr_schedulers = setup.lr_schedulers

    def _say_validation_skipped(self, module: TrainModule) -> None:
        """Validation data without a ``validation_step`` is not used: ``fit`` runs no
        validation, which is said (once, on global rank 0), as Lightning says it, since the
        step may be missing by a typo."""
        if implements(module, "validation_step") or self.limit_val_batches == 0 \
                or not self.is_global_zero:
            return
        source = self.datamodule if self.datamodule is not None else module
        if "validate" in self.given_dataloaders:
            where = "the val_dataloaders given to fit"
        elif _overrides(source, "val_dataloader"):
            where = f"{type(source).__qualname__}.val_dataloader()"
        else:
            return
        name = type(module).__qualname__
        warnings.warn(
            f"{name} has no validation_step(self, batch, batch_idx), so fit runs no validation "
            f"and {where} is not used.{_near_method(module, 'validation_step')} Implement "
            f"validation_step to validate; to train without validation and not be told, remove "
            f"the validation data or pass limit_val_batches=0 (--limit-val-batches 0).",
            stacklevel=2)

    def _say_validation_step_unused(self, module: TrainModule) -> None:
        """A ``validation_step`` without validation data is never called: ``fit`` runs no
        validation, which is said (once, on global rank 0), as Lightning says it, since the
        data may be missing by mistake."""
        if (self.val_dataloader is not None or not implements(module, "validation_step")
                or self.limit_val_batches == 0 or not self.is_global_zero):
            return
        source = self.datamodule if self.datamodule is not None else module
        method = f"{type(source).__qualname__}.val_dataloader()"
        where = (f"{method} returned None" if _overrides(source, "val_dataloader")
                 else f"{type(source).__qualname__} has no val_dataloader()")
        warnings.warn(
            f"{type(module).__qualname__} has a validation_step, but fit has no validation "
            f"data (no val_dataloaders given to fit, and {where}), so it runs no validation. "
            f"Give validation data to validate; to train without validation and not be told, "
            f"pass limit_val_batches=0 (--limit-val-batches 0).", stacklevel=2)

    def _dataloader(self, stage: str):
        loader = self.given_dataloaders.get(stage)
        source = self.datamodule if self.datamodule is not None else self.module
        if loader is None:
            loader = self._asked_early.pop(stage, None)
        if loader is None:
            method = getattr(source, _LOADER_METHODS[stage])
            loader = method() if method is not None else None  # Lightning's "none" switch
        if loader is None:
            return None
        where = (f"{type(source).__qualname__}.{_LOADER_METHODS[stage]}()"
                 if stage not in self.given_dataloaders else f"the {stage} dataloader given")
        if (stage in ("validate", "test") and not self.stops_on_empty_evaluation
                and getattr(self, LIMITS[stage]) != 0 and _sized_empty(loader)):
            runs = "fit runs no validation" if self.stage == "train" else f"{stage} runs nothing"
            warnings.warn(f"{where} gives no batches (its dataset is empty), so {runs}; give it "
                          f"data, or pass {LIMITS[stage]}=0 not to be told.", stacklevel=2)
            self._empty_loaders.add(stage)
            return None
        several = several_loaders(loader) if stage != "train" else None
        if several is not None:  # each prepared as one would be; they run one after another
            prepared = [self._prepare_dataloader(stage, one, where) for one in several[0]]
            return prepared[0] if len(prepared) == 1 else SeveralLoaders(prepared, several[1])
        return self._prepare_dataloader(stage, loader, where)

    def _prepare_dataloader(self, stage: str, loader: Any, where: str) -> Any:
        if not hasattr(loader, "__iter__"):
            raise ModelError(f"{where} returned {type(loader).__qualname__} {loader!r:.60}, "
                             f"which can't be iterated over for batches; return a "
                             f"torch.utils.data.DataLoader (or any iterable of batches).")
        if stage != "train" and getattr(self, LIMITS[stage]) != 0 and _sized_empty(loader):
            limit = LIMITS[stage]
            raise ModelError(f"{where} gives no batches (its dataset is empty), so {stage} "
                             f"would run nothing; give it data, or turn it off with "
                             f"{limit}=0 (--{limit.replace('_', '-')} 0).")
        if stage == "train" and self.overfit_batches and isinstance(loader, DataLoader) \
                and isinstance(loader.sampler, RandomSampler):
            warnings.warn("overfit_batches: the training dataloader shuffles; it is read in order "
                          "instead, so that every epoch trains on the same batches.", stacklevel=2)
            loader = rebuild_dataloader(loader, sampler=SequentialSampler(loader.dataset))
        return self.hook.prepare_dataloader(trainer=self, dataloader=loader, stage=stage)

    def _elapsed(self) -> float:
        """The training time ``max_time`` limits: since the training loop started (after the
        sanity check), plus a resumed run's time before."""
        return self.loop_state.get("elapsed_before", 0.0) + time.monotonic() - self._start_time

    # -- checkpoints ----------------------------------------------------------------------------

    def resolve_ckpt_path(self, ckpt_path: str) -> Path:
        """The checkpoint ``ckpt_path`` names: a path, ``"last"`` (the newest run's resumable
        checkpoint under ``default_root_dir``) or ``"best"``."""
        return self._resolve_ckpt_path(ckpt_path)

    def _check_limits(self) -> None:
        """Limits that contradict each other, or that no count can meet, are usage errors."""
        for name in ("max_epochs", "max_steps"):
            value = getattr(self, name)
            if value is not None and value < -1:
                raise ConfigError(f"{name}={value} is not valid; give a count >= 0, or -1 for "
                                  f"no limit.")
        for name in ("min_epochs", "min_steps"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name}={value} is not valid; give a count >= 0.")
        for low, high in (("min_epochs", "max_epochs"), ("min_steps", "max_steps")):
            least, most = getattr(self, low), getattr(self, high)
            if least is not None and most is not None and most != -1 and least > most:
                raise ConfigError(f"{low}={least} is above {high}={most}: training can't run at "
                                  f"least {least} and at most {most}. Lower {low} or raise "
                                  f"{high}.")
        interval = self.val_check_interval
        if isinstance(interval, float) and interval > 1.0:
            raise ConfigError(
                f"val_check_interval={interval} is a fraction of an epoch above 1.0; give a "
                f"fraction <= 1.0 (0.25: four times per epoch), a whole number of batches "
                f"({int(interval)} without the decimal point), or check_val_every_n_epoch to "
                f"validate every few epochs.")
        if self.check_val_every_n_epoch is None and isinstance(interval, float) \
                and interval != 1.0:  # 1.0, the default: every epoch's worth of batches
            raise ConfigError(
                f"check_val_every_n_epoch=None validates every val_check_interval training "
                f"batches, counted across epochs, so val_check_interval must be a whole number "
                f"of batches, not the fraction {interval}. Give one (e.g. "
                f"val_check_interval=100), or a check_val_every_n_epoch.")

    def _resolve_ckpt_path(self, ckpt_path: str | None, stage: str = "fit") -> Path | None:
        """What the ``resolve_ckpt_path`` hook makes of ``ckpt_path`` ("last", "best", a path).
        ``"auto"`` (``fit`` only): ``"last"`` when there is one, else ``None``, said on stdout
        -- one command for a job's first start and every restart (torchrun --max-restarts, a
        requeued batch job)."""
        if ckpt_path is None:
            return None
        if not str(ckpt_path).strip():
            raise ConfigError("ckpt_path is empty; give a checkpoint's path, 'last' (the newest "
                              "run's) or 'best', or leave it out to start from scratch.")
        if ckpt_path == "auto":
            if stage != "fit":
                raise ConfigError(f"ckpt_path='auto' is for fit (resume when a checkpoint "
                                  f"exists, else start); {stage} needs weights: give a "
                                  f"checkpoint's path, 'last' or 'best'.")
            try:
                return Path(self.hook.resolve_ckpt_path(trainer=self, ckpt_path="last"))
            except NoCheckpointYetError:
                if os.environ.get("RANK", "0") == "0":
                    print(f"ckpt_path='auto': no checkpoint under {self.run_root} yet; training "
                          f"from the start.", flush=True)
                return None
        return Path(self.hook.resolve_ckpt_path(trainer=self, ckpt_path=str(ckpt_path)))

    def _choose_log_dir(self, checkpoint_file: Path | None, stage: str) -> Path:
        """Resuming ``fit`` from a run's ``checkpoints/last.ckpt`` (its latest state), or
        evaluating any checkpoint of a run, continues in that run's folder when the run is under
        this trainer's :attr:`run_root`; ``fit`` from another of its checkpoints (``best``, a
        top-k file), or from a run under another root (the root was moved off a full disk),
        starts a new run under ``run_root`` that records where it came from
        (``resumed_from.json``), so no history is overwritten and nothing is written where the
        user did not ask. A later stage of this trainer continues in the folder of its earlier
        ones (Lightning's one logger version per trainer: ``fit`` then ``test`` log to one
        place); otherwise a new ``version_N`` folder, reserved by creating it
        (:mod:`ptrain.run_folder`)."""
        origin = None
        if checkpoint_file is not None \
                and checkpoint_file.parent.name == LAST_CHECKPOINT.parent.name:
            run = checkpoint_file.parent.parent
            if run_folder.is_run_folder(run):
                under_root = run.resolve().parent == Path(self.run_root).resolve()
                if stage != "fit" or (checkpoint_file.name == LAST_CHECKPOINT.name
                                      and under_root):
                    return run
                origin = checkpoint_file
        if self._own_log_dir is not None and origin is None:
            return self._own_log_dir
        root = Path(self.run_root)
        if not run_folder.decides_for_job():  # rank 0's choice arrives with the process group
            return run_folder.next_free(root)
        run = run_folder.reserve(root)
        if origin is not None:
            run_folder.record_origin(run, origin)
        return run

    def _restore(self, path: Path, stage: str) -> dict[str, Any]:
        checkpoint = self.hook.load_checkpoint(trainer=self, path=str(path))
        if stage == "fit" and checkpoint.get("lightning_version"):
            raise CheckpointError(
                f"checkpoint {str(path)!r} was written by Lightning "
                f"{checkpoint['lightning_version']}, so fit can't resume from it: Lightning "
                f"keeps the loop's progress, the callbacks' and the random state in a layout "
                f"of its own, and the resume would not be exact. Its weights load: "
                f"validate, test or predict with it, or load it into a new model "
                f"(load_from_checkpoint) and fit that from the start.")
        if stage == "fit" and checkpoint.get("weights_only"):
            raise CheckpointError(
                f"checkpoint {str(path)!r} holds the weights only (saved with "
                f"weights_only=True, e.g. ModelCheckpoint(save_weights_only=True)), so fit can't "
                f"resume from it: the optimizer, scheduler and random state are not in it. "
                f"Resume from the run's full-state checkpoint (ckpt_path='last'), or load these "
                f"weights into a new model (load_from_checkpoint) and fit from the start.")
        checkpoint_io.load_module_weights(self.module, checkpoint, path, resuming=stage == "fit")
        if stage == "fit":
            if len(checkpoint["optimizers"]) != len(self.optimizers):
                raise CheckpointError(f"checkpoint {str(path)!r} holds "
                                      f"{len(checkpoint['optimizers'])} optimizer states; the "
                                      f"model configures {len(self.optimizers)}.")
            configured = []  # what configure_optimizers gave: compared below
            for optimizer, state in zip(self.optimizers, checkpoint["optimizers"]):
                configured.append(_group_settings(optimizer))
                optimizer.load_state_dict(state)
            for entry, state in zip(self.lr_schedulers, checkpoint["lr_schedulers"]):
                entry["scheduler"].load_state_dict(state)
            for stage_name, sums in checkpoint.get("metrics", {}).items():
                self.metrics.epoch_sums[stage_name] = {k: list(v) for k, v in sums.items()}
        if self.datamodule is not None and "datamodule_state" in checkpoint:
            self.datamodule.load_state_dict(checkpoint["datamodule_state"])
        saved = checkpoint.get("plugins", {})
        for impl in self.hook.load_state_dict.get_hookimpls():  # per plugin: its own state
            if impl.plugin_name in saved:
                call_impl(impl, trainer=self, state=saved[impl.plugin_name],
                          checkpoint=checkpoint)
        unclaimed = sorted(name for name in saved if self.pm.get_plugin(name) is None)
        if stage == "fit" and unclaimed:
            names = ", ".join(repr(name) for name in unclaimed)
            warnings.warn(
                f"resuming from {path}: the checkpoint holds the state of plugin(s) {names}, "
                f"which this run does not have: it is not restored, and this run's checkpoints "
                f"will not hold it. To continue it, resume with the plugin(s) in the run (a "
                f"callback: -p NAME, or callbacks = [...] in [trainer]).", stacklevel=2)
        if stage == "fit":  # the settings a plugin applies itself (a finder's lr) count too
            self.hook.applied_optimizer_settings(trainer=self, settings=configured)
            for index, optimizer in enumerate(self.optimizers):
                self._overridden_on_resume.update(
                    _report_overridden(path, index, optimizer, configured[index]))
        return checkpoint


#: stage -> the dataloaders it reads, its own first
_STAGE_LOADERS = {"fit": ("train", "validate"), "validate": ("validate",), "test": ("test",),
                  "predict": ("predict",)}
_LOADER_METHODS = {"train": "train_dataloader", "validate": "val_dataloader",
                   "test": "test_dataloader", "predict": "predict_dataloader"}
_LOADER_ATTRIBUTES = _LOADER_METHODS  # the trainer holds each prepared loader under that name
_DATA_NAMES = {"train": "training", "validate": "validation", "test": "test",
               "predict": "prediction"}
_STEP_METHODS = {"fit": "training_step", "validate": "validation_step", "test": "test_step",
                 "predict": "predict_step"}


def _not_a_model(trainer: Trainer) -> str:
    """What to say of a ``wrap_model`` result that is no ``nn.Module`` (the loop would fail far
    from the plugin that returned it, on the first ``trainer.model.modules()``)."""
    made = [impl.plugin_name for impl in reversed(trainer.hook.wrap_model.get_hookimpls())
            if impl.plugin_name != "loop-defaults"]
    return (f"wrap_model returned {type(trainer.model).__qualname__} "
            f"{reprlib.repr(trainer.model)}, not a torch.nn.Module: it must return the model to "
            f"train (the model it was given, or a wrapper around it). The plugins implementing "
            f"wrap_model, in the order they are called: {', '.join(map(repr, made))}.")


def _options_outside_the_run(name: str, selected: list[SelectedPlugin], catalog: Catalog) -> str:
    """What to say of options given for plugin ``name``, which is not part of the run: a name
    no plugin has (a typo: the closest installed name), a strategy/accelerator/precision other
    than the run's, or a callback not enabled; each with a fix that works."""
    head = f"options were given for plugin {name!r}"
    drop = f"remove its options ([plugins.{name}]), or set them aside with -p no:{name}"
    kinds = sorted({info.kind for info in catalog.infos if info.name == name})
    if not kinds:
        uninstalled = {n: d for named in FIRST_PARTY.values() for n, d in named.items()}
        if name in uninstalled:
            return (f"{head}, which comes with the distribution {uninstalled[name]}, not "
                    f"installed here: pip install {uninstalled[name]}, or {drop}.")
        known = {info.name for info in catalog.infos} | {p.name for p in selected}
        return (f"{head}, which is not part of this run, and no installed plugin is called "
                f"{name!r}.{closest(name, known)} Give a plugin's options under its name "
                f"([plugins.NAME]; `ptrain plugins` lists the installed ones), enable a "
                f"callback of your own with -p MODULE:CLASS (its options go under its class "
                f"name in kebab case), or remove them.")
    kind = kinds[0]
    if kind in EXCLUSIVE_KINDS:
        chosen = next((p.name for p in selected if p.kind == kind), None)
        return (f"{head}, a {kind}, but this run's {kind} is {chosen!r}. Select it with "
                f"--{kind} {name} ({kind} = \"{name}\" in [trainer]), or {drop}.")
    return (f"{head}, a callback that is not part of this run. Enable it with -p {name} "
            f"(callbacks = [\"{name}\"] in [trainer]), or {drop}.")


def _call_teardown_impl(impl: Any, trainer: Trainer, stage: str) -> None:
    """One plugin's ``teardown``; a wrapper implementation runs its code before and after its
    ``yield`` (teardown has no result to pass it)."""
    result = call_impl(impl, trainer=trainer, stage=stage)
    if not inspect.isgenerator(result):
        return
    next(result, None)
    try:
        result.send(pluggy.Result(None, None) if impl.hookwrapper else None)
    except StopIteration:
        pass


def no_limit(value: int | None) -> bool:
    """Whether a ``max_epochs``/``max_steps`` value sets no limit: ``None`` or ``-1``."""
    return value is None or value == -1


def is_logger(plugin: Any) -> bool:
    """Whether ``plugin`` is a logger: it implements ``log_metrics`` or ``log_hyperparams``."""
    return any(hasattr(getattr(plugin, hook, None), IMPL_MARK)
               for hook in ("log_metrics", "log_hyperparams"))


def _group_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each parameter group's settings a user configures and nothing changes as training goes:
    the learning rate a schedule starts from (``initial_lr``, which a scheduler records, else
    ``lr``) and the weight decay."""
    return [{"lr": group.get("initial_lr", group.get("lr")),
             "weight_decay": group.get("weight_decay")} for group in optimizer.param_groups]


def _report_overridden(path: Path, index: int, optimizer: torch.optim.Optimizer,
                       configured: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Warn of the settings ``configure_optimizers`` gives now (as the plugins that apply some
    themselves changed them: the ``applied_optimizer_settings`` hook) that the resumed optimizer
    state replaced (a learning rate changed on resume does not apply, the checkpoint's does), and
    return them as ``{"optimizer I[ group G] KEY": {"configured": ..., "applied": ...}}``: the
    run's checkpoints record them beside the config (``overridden_on_resume``), so the config
    does not read as if the new value had trained."""
    changed, said = {}, []
    for number, (before, after) in enumerate(zip(configured, _group_settings(optimizer))):
        for key, value in before.items():
            if after[key] != value:
                group = f" group {number}" if len(configured) > 1 else ""
                changed[f"optimizer {index}{group} {key}"] = {"configured": value,
                                                              "applied": after[key]}
                said.append(f"{key}={after[key]!r}{group} (configured now: {value!r})")
    if changed:
        warnings.warn(
            f"resuming from {path}: optimizer {index} ({type(optimizer).__name__}) continues "
            f"with the checkpoint's {', '.join(said)}; what configure_optimizers gives now "
            f"does not apply to a resumed run, and the run's checkpoints record it under the "
            f"config's 'overridden_on_resume'. To train with it, start a new run and load the "
            f"weights in __init__.", stacklevel=2)
    return changed


def _sized_empty(loader: Any) -> bool:
    try:
        return len(loader) == 0
    except TypeError:  # no length: an iterable dataset may still give batches
        return False



def _causes(error: BaseException | None) -> Iterator[BaseException]:
    """``error``, then what it was raised from or during, and so on."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__

def _check_optimized_parameters(module: TrainModule, setup: OptimizerSetup) -> None:
    """What ``configure_optimizers`` returned must train this module: under automatic
    optimization it needs trainable parameters, and no optimizer may hold parameters that are
    not the module's (built over a copy or another model, it would step those and leave the
    module untrained, silently)."""
    params = list(module.parameters())
    if module.automatic_optimization and not any(p.requires_grad for p in params):
        raise ModelError(
            f"{type(module).__qualname__} has no trainable parameters ("
            f"{'all of its parameters have requires_grad=False' if params else 'it has none'}), "
            f"so fit has nothing to train. Unfreeze what should learn (requires_grad_(True)), "
            f"or run validate/test instead of fit.")
    own = {id(p) for p in params}
    for index, optimizer in enumerate(setup.optimizers):
        foreign = sum(1 for group in optimizer.param_groups for p in group["params"]
                      if id(p) not in own)
        if foreign:
            raise ModelError(
                f"optimizer {index} ({type(optimizer).__name__}) from "
                f"{type(module).__qualname__}.configure_optimizers() holds {foreign} "
                f"parameter(s) that are not the module's: it would step those and leave the "
                f"module untrained. Build it from self.parameters() (or the module's own "
                f"submodules), not from a copy or another model.")


def implements(module: TrainModule, method: str) -> bool:
    """Whether ``module`` has its own ``method`` (a step method or hook): overridden in its
    class or set on the instance. Set to ``None`` on the instance, it has none (Lightning's
    way to switch a step off: ``model.validation_step = None``)."""
    if getattr(module, method, None) is None:
        return False
    return method in vars(module) or getattr(type(module), method) is not \
        getattr(TrainModule, method)


def _overrides(source: TrainModule | DataModule, method: str) -> bool:
    """Whether ``source`` (a module or datamodule) has its own ``method`` (a dataloader method):
    overridden in its class or set on the instance, and not set to ``None``."""
    if getattr(source, method, None) is None:
        return False
    base = TrainModule if isinstance(source, TrainModule) else DataModule
    return method in vars(source) or getattr(type(source), method) is not getattr(base, method)


def _check_stage_methods(stage: str, module: TrainModule) -> None:
    """A stage whose step the module does not implement is a usage error before anything
    starts. (``fit`` runs no validation without a ``validation_step``, as Lightning, and says
    so when there is validation data: see ``Trainer._say_validation_skipped``.)"""
    method = _STEP_METHODS[stage]
    name = type(module).__qualname__
    if method == "predict_step":
        if getattr(module, "predict_step", None) is None or (
                not implements(module, "predict_step")
                and type(module).forward is torch.nn.Module.forward):
            raise ModelError(f"{name} has neither predict_step(self, batch, batch_idx) nor "
                             f"forward, so predict has nothing to run; implement predict_step "
                             f"(the default returns self(batch)).")
    elif not implements(module, method):
        raise ModelError(f"{name} has no {method}(self, batch, batch_idx), which {stage} runs on "
                         f"every batch; implement it (see TrainModule.{method}'s docstring for "
                         f"what it returns).{_near_method(module, method)}")
    if stage == "fit" and not implements(module, "configure_optimizers"):
        raise ModelError(f"{name} has no configure_optimizers(self), which fit calls for the "
                         f"optimizer that trains the module; implement it (e.g. return "
                         f"torch.optim.AdamW(self.parameters(), lr=1e-3); see "
                         f"TrainModule.configure_optimizers's docstring for what it may "
                         f"return).{_near_method(module, 'configure_optimizers')}")


def _near_method(module: TrainModule, method: str) -> str:
    """A sentence naming the module's own method that ``method`` was likely mistyped as
    (``validaton_step``), or an empty string."""
    own = {name for cls in type(module).__mro__ if cls not in TrainModule.__mro__
           for name in vars(cls) if not name.startswith("__")}
    near = near_names(method, own - {method})
    return (f" {type(module).__qualname__} has {near[0]}(): a typo of {method}?"
            if len(near) == 1 else "")


@contextlib.contextmanager
def deterministic_algorithms(mode: bool | str) -> Iterator[None]:
    """With ``mode`` ``True`` or ``"warn"``: torch's deterministic algorithms only (cuDNN's too,
    and its autotuner off) for the block, restored after. An op that has no deterministic
    implementation then raises a :class:`ConfigError` naming it (``"warn"``: torch warns)."""
    if not mode:
        yield
        return
    previous = (torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
                torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    # cuBLAS needs this before its first call to be deterministic (CUDA >= 10.2)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=mode == "warn")
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    except RuntimeError as exc:
        match = _NOT_DETERMINISTIC.search(str(exc))
        if match is None:
            raise
        raise ConfigError(
            f"deterministic=True, but the operation {match.group(1)} has no deterministic "
            f"implementation in torch {torch.__version__}. Use another operation there, run with "
            f"deterministic='warn' to be warned instead, or without deterministic.") from exc
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = previous[2:]


_NOT_DETERMINISTIC = re.compile(r"^(\S+) does not have a deterministic implementation")


@dataclass
class WorkerResult:
    """What a worker process hands back to the process that launched it (the launcher keeps the
    lowest rank's)."""

    metrics: dict[str, float]
    model: dict[str, torch.Tensor] | None  # the module's full state dict, on the CPU
    global_step: int
    current_epoch: int
    predictions: list[Any] | None = None  # predict: every process's, in dataset order
    results: list[dict[str, float]] | None = None  # validate/test: per dataloader


class StageFunction:
    """The ``function`` the ``launch`` hook receives: calling it runs one stage of the trainer in
    the calling process and returns the stage's metrics.

    It is picklable, so a strategy may run it in worker processes it starts. Unpickled there, it
    rebuilds the trainer from the arguments the original was made with (plugins selected by name
    are instantiated anew in the worker; plugin objects, the module and the datamodule are
    pickled), keeps the run folder chosen by the launching process, starts from the launching
    process's CPU random generators (so every worker draws as that process would have), and
    returns a
    :class:`WorkerResult` (with the weights on each machine's local rank 0). Gathering the
    weights is a collective, so every rank takes part.
    """

    def __init__(self, trainer: Trainer, stage: str, checkpoint_file: Path | None,
                 in_worker: bool = False, launcher_rng: dict[str, Any] | None = None):
        self.trainer, self.stage, self.checkpoint_file = trainer, stage, checkpoint_file
        self.in_worker = in_worker
        self.launcher_rng = launcher_rng

    def __call__(self) -> dict[str, float] | WorkerResult | None:
        trainer = self.trainer
        if self.launcher_rng is not None:  # continue the launching process's random streams
            checkpoint_io.restore_rng_states(self.launcher_rng)
        result = trainer._run_stage(self.stage, self.checkpoint_file)
        if not self.in_worker:
            return result
        model = None
        if self.stage == "fit":  # one copy of the weights per machine goes back to its launcher
            model = full_state_dict(trainer.module, keep=trainer.local_rank == 0)
        if self.stage == "predict":
            return WorkerResult({}, None, trainer.global_step, trainer.current_epoch, result)
        return WorkerResult(result, model, trainer.global_step, trainer.current_epoch,
                            results=trainer.metrics.results)

    def __reduce__(self):
        t = self.trainer
        recipe = (type(t), t._init_kwargs, t.config, t.module, t.datamodule,
                  t.given_dataloaders, t.run_dir, t._own_log_dir, t.fit_progress)
        # the CPU generators as they are in the launching process (seed_everything before the
        # stage seeds every worker alike, as running the script in each process would)
        rng = {k: v for k, v in checkpoint_io.capture_rng_states().items() if k != "cuda"}
        return _rebuild_stage_function, (recipe, self.stage, self.checkpoint_file, rng)


def _rebuild_stage_function(recipe: tuple, stage: str, checkpoint_file: Path | None,
                            rng: dict[str, Any]) -> StageFunction:
    cls, init_kwargs, config, module, datamodule, dataloaders, log_dir, own, progress = recipe
    trainer = cls(**init_kwargs)
    trainer.config, trainer.fit_progress = config, progress
    trainer.module, trainer.datamodule, trainer.run_dir = module, datamodule, log_dir
    trainer._own_log_dir = own  # the launcher's trainer's folder: what log_dir answers
    trainer.given_dataloaders = dataloaders
    trainer.ckpt_path = None if checkpoint_file is None else str(checkpoint_file)
    return StageFunction(trainer, stage, checkpoint_file, in_worker=True, launcher_rng=rng)


def full_state_dict(module: torch.nn.Module, keep: bool = True) -> dict[str, torch.Tensor] | None:
    """``module``'s state dict with every tensor whole and on the CPU. Sharded tensors (DTensors)
    are gathered one at a time: a collective, so every rank must call it; ranks that pass
    ``keep=False`` take part in the gathering and return ``None`` (no host copy)."""
    state = {}
    for key, value in module.state_dict().items():
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        if keep:
            state[key] = value.detach().cpu()
    return state if keep else None


def run_folders(root: Path) -> list[Path]:
    """The ``version_N`` folders under ``root``, newest (highest N) first."""
    return [path for _, path in sorted(run_folder.versions(root), key=lambda v: -v[0])]


def _available_memory() -> int | None:
    """Bytes of memory this machine has available (Linux's MemAvailable), or ``None``."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


__all__ = ["StageFunction", "Trainer", "WorkerResult", "full_state_dict", "no_limit",
           "seed_everything"]
