"""The ptrain hook specification: the whole training loop, as the contract plugins implement.

A plugin is an object (a class instance or a module) whose methods carry ``@ptrain.hookimpl``.
Every hook of the loop receives ``trainer`` among its arguments; the declaration hooks
(``add_options``, ``check_available``, and ``tune_candidates`` for ``ptrain tune``) are the
exception: they run on the plugin's class, before the plugin is made. An implementation declares only the arguments it uses (pluggy's opt-in
arguments), so a hook can gain an argument later without breaking anyone. The core calls hooks
with keyword arguments only. Hooks fire per run, per epoch or per step, never per tensor.

The loop, with every hook where it fires (``fit``; ``validate`` and ``test`` run the evaluation
part alone on their dataloader, ``predict`` the prediction part)::

    # once, on the plugin *class or module*, before anything is instantiated
    add_options(options)                           # declare flags and config keys
    check_available()                              # `ptrain plugins --check`, `--accelerator auto`

    path = resolve_ckpt_path(trainer, ckpt_path)   # only with ckpt_path: 'last', 'best', a path
        verify_checkpoint(trainer, path)           # 'last-intact': each candidate, newest first
    result = launch(trainer, function)             # strategy may start processes; None: run here
    function():                                    # in every process
        trainer.device = setup_device(trainer)     # accelerator; strategies wrap it (ranks, groups)
        trainer.precision_policy = precision_policy(trainer)
        on_stage_start(trainer, stage="fit")       # then the module's own setup(stage)
        with module_init_context(trainer, empty_init=None):   # each plugin's context, entered
            trainer.module.configure_model()                  # once per module
                modify_parallel_plan(trainer, module, mesh, plan)   # per self.parallelize(...)
        trainer.model = wrap_model(trainer, model=StepModule(trainer.module))   # on the CPU
        trainer.optimizers = [wrap_optimizer(trainer, optimizer) for each optimizer]
        val_loader = prepare_dataloader(trainer, dataloader, stage="validate")
        train_loader = prepare_dataloader(trainer, dataloader, stage="train")
        checkpoint = load_checkpoint(trainer, path)        # only with ckpt_path
        load_state_dict(trainer, state, checkpoint)        # each plugin, its own saved state
        applied_optimizer_settings(trainer, settings)      # compared with the checkpoint's
        unused_step_hooks(trainer)                 # each plugin: per-step hooks it leaves this stage
        setup(trainer, stage="fit")
        log_hyperparams(trainer, hyperparameters)   # module's hparams + datamodule's
        on_loop_start(trainer, loop="fit")
        on_loop_start(trainer, loop="sanity_check")  # the first num_sanity_val_steps validation
        [a validation pass (below), nothing published, no on_validation_end]       # batches
        on_loop_end(trainer, loop="sanity_check")
        on_loop_start(trainer, loop="train")
        while not stopped:
            on_epoch_start(trainer)
            for batch_idx, batch in train_loader:
                batch = transfer_batch(trainer, batch)
                on_batch_start(trainer, stage="train", batch, batch_idx)
                loss = model_step(trainer, stage="train", batch, batch_idx)  # forward + loss
                on_before_backward(trainer, loss)
                backward(trainer, loss)
                on_after_backward(trainer)
                if trainer.sync_gradients:                   # end of an accumulation window
                    on_before_optimizer_step(trainer, optimizer)
                    clip_gradients(trainer, optimizer)       # only when clipping is configured
                    optimizer_step(trainer, optimizer)
                    on_before_zero_grad(trainer, optimizer)  # see its contract for where
                    optimizer.zero_grad(set_to_none=True); schedulers with interval "step"
                # a module that optimizes manually calls, inside model_step instead:
                #   backward (manual_backward), and per optimizer.step() the three step hooks
                every log_every_n_steps and at the end of each epoch / validation:
                    metrics = reduce_metrics(trainer, metrics, op="mean")
                    log_metrics(trainer, metrics, step)
                if validation is due: run validation (below)
                on_train_batch_end(trainer, batch, batch_idx, loss)
            [validation, if due at the end of this epoch]
            on_epoch_metrics(trainer, stage="train")       # the last moment to log for the epoch
            reduce_metrics, log_metrics                    # the epoch-level metrics
            schedulers with interval "epoch"
            on_epoch_end(trainer)
        on_loop_end(trainer, loop="train")
        on_loop_end(trainer, loop="fit")
        [after an error: exception = report_error(trainer, exception) or exception]
        teardown(trainer, stage="fit")                     # always, also after an error

    validation (and test, with stage="test" over the test loader, without on_validation_end):
        evaluation_mode(trainer, stage="validate")     # model.eval(), by default
        on_loop_start(trainer, loop="validate")
        with torch.no_grad():
            for batch_idx, batch in val_loader:
                batch = transfer_batch(trainer, batch)
                on_batch_start(trainer, "validate", batch, batch_idx)
                outputs = model_step(trainer, stage="validate", batch, batch_idx)
                on_evaluation_batch_end(trainer, "validate", outputs, batch, batch_idx)
        on_epoch_metrics(trainer, stage="validate")
        reduce_metrics, log_metrics                        # the epoch-level metrics
        on_validation_end(trainer)                         # epoch-level val metrics are ready
        on_loop_end(trainer, loop="validate")

    prediction:
        evaluation_mode(trainer, stage="predict")
        on_loop_start(trainer, loop="predict")
        with torch.no_grad():
            for batch_idx, batch in predict_loader:
                batch = transfer_batch(trainer, batch)
                on_batch_start(trainer, "predict", batch, batch_idx)
                outputs = model_step(trainer, stage="predict", batch, batch_idx)
                on_evaluation_batch_end(trainer, "predict", outputs, batch, batch_idx)
        on_epoch_metrics(trainer, stage="predict")
        all_gather_object(trainer, obj)                    # several processes, predictions kept
        on_loop_end(trainer, loop="predict")

    trainer.save_checkpoint(path):                         # called by the checkpoint callback
        state_dict(trainer, checkpoint)                    # each plugin, stored under its name
        save_checkpoint(trainer, checkpoint, path)
        # asynchronous=True: save_checkpoint_in_background(trainer, checkpoint, path) instead

Result semantics, stated on every hook:

- **firstresult**: implementations are called in order until one returns something other than
  ``None``; that value is the result and the rest are skipped. For hooks that *do* something
  (``backward``, ``optimizer_step``, ``clip_gradients``) an implementation returns ``True`` once it
  has done it. The core's default implementation is ``trylast`` and is registered after every
  plugin, so it is called after all of them (a plugin's own ``trylast`` ones included): a plugin
  takes over by returning a value, and the default runs only when nobody did.
- **all**: every implementation is called; results are collected in a list (usually ignored).
- **per plugin**: the core calls each plugin's implementation on its own, with arguments scoped to
  that plugin (its option group, its saved state).

Order: pluggy calls the most recently registered plugin first. ptrain registers the
accelerator, the precision, the strategy, and the callbacks in the order they were given, then the
core's defaults (as ``trylast``); so the default order is *callbacks, strategy, precision,
accelerator, core defaults*
(a sharding engine's backward wins over a loss scaler's, which wins over plain ``loss.backward()``).
``tryfirst=True`` / ``trylast=True`` move an implementation to the front or the back. Wrappers
(``@hookimpl(wrapper=True)``) run code around all the other implementations of a hook and may
change its result: the way to transform what another plugin produces (a model, a dataloader).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:  # the contract names torch types without importing torch at import time
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from ptrain.options import OptionGroup
    from ptrain.precision_policy import PrecisionPolicy
    from ptrain.trainer import Trainer
    from ptrain.tuning.candidates import Candidate

PROJECT_NAME = "ptrain"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# --------------------------------------------------------------------------------------------------
# Declaration: called on the plugin class or module, before it is instantiated.


@hookspec
def add_options(options: OptionGroup) -> None:
    """Declare the plugin's options: its command-line flags and config keys.

    Fires: once per plugin, when the CLI or ``Trainer`` resolves its configuration, before the
    plugin is instantiated. On a class it must be a ``@staticmethod`` (there is no instance yet).

    :param options: the group for this plugin alone. ``options.add("patience", int, default=3,
        help=...)`` declares the flag ``--early-stopping-patience`` (the plugin's name, then the
        option's, with ``-``), the config key ``patience`` in the table ``[plugins.early-stopping]``,
        and the keyword argument ``patience`` the class is instantiated with.

    Result: per plugin; the return value is ignored. Implemented by: any plugin that has options.
    """


@hookspec
def check_available() -> str | None:
    """Say whether the plugin can run on this machine.

    Fires: when ``ptrain plugins --check`` lists the plugin, when ``--accelerator auto`` chooses
    one, and when the plugin is selected (an unavailable selected plugin is a usage error). Like
    ``add_options`` it is called on the class or module (a ``@staticmethod`` on a class). It must
    be cheap and must not initialise a device.

    Result: per plugin; ``None`` when it can run, else one line saying why not and what to do
    (``"torch_xla is not installed: pip install torch_xla"``). Implemented by: accelerators
    chiefly; any plugin with requirements.
    """


@hookspec
def tune_candidates(trainer: Trainer) -> list[Candidate]:
    """Offer ``ptrain tune`` the settings this plugin can change to make training faster.

    Fires: once per installed plugin when ``ptrain tune`` starts, on the class or module (a
    ``@staticmethod`` on a class), whether or not the plugin is part of the user's run. Each
    candidate is then trained for real, through the normal loop, against the user's own
    configuration (see "Tuning" in ptrain's documentation).

    :param trainer: the trainer of the user's configuration, made and not run: its
        ``options`` (``trainer.options["precision"]``...), ``plugins`` and ``config`` say what
        is set already (a candidate that changes nothing is listed as such, not measured).

    Result: per plugin; a list of :class:`ptrain.tuning.Candidate` (empty when nothing applies).
    A candidate that can't run here carries the reason in ``unavailable``; a plugin whose
    ``check_available`` says it can't run here has every candidate listed with that reason.
    Implemented by: plugins that make training faster (precisions, compile, data loading,
    accelerators' settings, finders).
    """


# --------------------------------------------------------------------------------------------------
# Start-up and teardown.


@hookspec(firstresult=True)
def launch(trainer: Trainer, function: Callable[[], Any]) -> Any:
    """Run ``function`` in every process the strategy needs and return rank 0's result.

    Fires: once per stage call (``fit``, ``validate``, ``test``, ``predict``), before any other
    loop hook. ``function()`` runs the whole stage (``setup_device`` onward) in the calling
    process. A strategy that needs several processes either makes the calling process one of
    them (starting the others, e.g. by running the program again, or finding them started by
    ``torchrun``/SLURM or by an earlier stage) and returns ``None``; or, where it can't, starts
    worker processes for this stage and calls ``function()`` in each: it is picklable, and
    rebuilds the trainer there. Rank 0 then returns a :class:`ptrain.trainer.WorkerResult`,
    which the launching trainer adopts (the trained weights, counters and metrics).
    :mod:`ptrain.distributed` does all of this for strategies built on torch.distributed.

    Result: firstresult; ``None`` means "run ``function()`` here", which the core then does.
    Implemented by: strategies.
    """


@hookspec(firstresult=True)
def setup_device(trainer: Trainer) -> torch.device:
    """Choose and initialise the device this process trains on.

    Fires: once per process, first thing inside the launched function. Strategies implement it as
    a wrapper: before ``yield`` they set ``trainer.global_rank``, ``trainer.local_rank`` and
    ``trainer.world_size`` (the accelerator reads ``local_rank`` to pick its device); after it they
    create the process group on the device that came back.

    Result: firstresult; the ``torch.device``, stored as ``trainer.device``.
    Implemented by: accelerators (strategies as wrappers).
    """


@hookspec(firstresult=True)
def precision_policy(trainer: Trainer) -> PrecisionPolicy:
    """Describe the numeric formats of the run, for the strategy and other plugins to honour.

    Fires: once per process, after ``setup_device`` and before ``wrap_model``. The result is stored
    as ``trainer.precision_policy``; a sharding strategy reads it to build its own mixed-precision
    settings instead of fighting the precision plugin.

    Result: firstresult; a :class:`ptrain.PrecisionPolicy`. Implemented by: precision plugins.
    """


@hookspec
def module_init_context(trainer: Trainer,
                        empty_init: bool | None) -> contextlib.AbstractContextManager | None:
    """A context in which the module's layers are created: ``configure_model()`` runs inside
    every plugin's (and so does a block under ``Trainer.init_module()``).

    Fires: once per process before the module's ``configure_model`` (the first stage that
    builds it), and at each ``Trainer.init_module(empty_init)``. ``empty_init``: ``True`` asks
    that parameters be created without memory or initial values (on the ``meta`` device; the
    plugin that wraps the model then gives them memory and values, see
    :mod:`ptrain.meta_init`), ``False`` that they be created whole, ``None`` leaves it to the
    plugin. A plugin returns a context manager (``torch.device("meta")`` is one), or ``None``.

    Result: all; every context returned is entered, in hook order. Implemented by: sharding
    strategies (parameters on the meta device, so that no rank holds the whole model).
    """


@hookspec
def modify_parallel_plan(trainer: Trainer, module: nn.Module, mesh: Any,
                         plan: dict[str, Any]) -> None:
    """Adapt a tensor-parallel plan, and the layers it names, before torch applies it.

    Fires: at each ``TrainModule.parallelize(module, mesh, plan)`` (the module's
    ``configure_model`` calls it where it would call torch's ``parallelize_module``, with the
    same arguments), just before ``parallelize_module(module, mesh, plan)``. ``module`` is the
    module the plan is relative to (the user's module or one of its submodules), ``mesh`` the
    1-D tensor-parallel ``DeviceMesh``, and ``plan`` a mutable ``{module path: ParallelStyle}``
    dict in torch's format (a lone style arrives as ``{"": style}``, which torch applies to
    ``module`` itself). An implementation may replace submodules of ``module`` (a layer type
    whose plan styles differ, e.g. float8 layers) and the plan's entries, in place; torch
    applies what ``plan`` holds once every implementation returned.

    Result: all; return ``None``. Implemented by: precision plugins whose layers need plan
    styles of their own (``fp8-mixed`` converts the layers it chose and gives them torchao's
    float8 styles).
    """


@hookspec(firstresult=True)
def wrap_model(trainer: Trainer, model: nn.Module) -> nn.Module:
    """Return the model to train: ``model`` itself, or a wrapper (DDP, FSDP) around it.

    Fires: once per process, after ``precision_policy``, with ``model`` still where the user built
    it (usually the CPU): placing it on ``trainer.device`` is the strategy's job. ``model`` is a :class:`ptrain.StepModule` around the user's module, whose
    ``forward(stage, batch, batch_idx)`` runs ``training_step``/``validation_step``, so a wrapper
    that hooks ``forward`` (DDP, FSDP) sees every step. Plugins that change the model in place
    before the strategy wraps it (casting to a dtype, activation checkpointing) implement this as a
    wrapper and work before ``yield``; plugins that wrap the strategy's result (``torch.compile``)
    work after it.

    Result: firstresult; the model, stored as ``trainer.model``. Implemented by: strategies
    (precision and callbacks as wrappers). Default: ``model`` moved to ``trainer.device``.
    """


@hookspec(firstresult=True)
def wrap_optimizer(trainer: Trainer, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Return the optimizer to use: ``optimizer`` itself or one that replaces it (ZeRO).

    Fires: once per optimizer returned by ``configure_optimizers``, after ``wrap_model`` (so the
    optimizer was built over the wrapped model's parameters). Learning-rate schedulers bound to a
    replaced optimizer are re-bound to its replacement by the core.

    Result: firstresult; stored in ``trainer.optimizers``. Implemented by: strategies. Default:
    ``optimizer`` unchanged.
    """


@hookspec(firstresult=True)
def prepare_dataloader(trainer: Trainer, dataloader: DataLoader, stage: str) -> DataLoader:
    """Return the dataloader to iterate for ``stage`` (``"train"``, ``"validate"``, ``"test"`` or
    ``"predict"``).

    Fires: once per dataloader per run, after ``wrap_model``. Plugins that change a dataloader (a
    distributed sampler, pinned memory, more workers) implement this as a wrapper: they take the
    result of ``yield`` and return a new loader built with :func:`ptrain.data.rebuild_dataloader`,
    so each change composes with the others.

    Result: firstresult; the dataloader. Implemented by: strategies, accelerators and callbacks, as
    wrappers. Default: ``dataloader`` unchanged.
    """


@hookspec
def unused_step_hooks(trainer: Trainer) -> list[str] | None:
    """The per-step hooks this plugin implements but has nothing to do in during this stage (its
    options turned that part off), for the loop to leave uncalled: a hook per step costs even
    when it returns at once.

    Fires: once per process per stage, on each plugin on its own, when the loop builds its
    per-step calls, after ``prepare_dataloader`` and any restore, just before ``setup``. The
    answer holds for the whole stage: a plugin that may have work in a hook later in the stage
    (after a signal, a time limit, a change made in ``setup``) must not name it. A hook that has
    a wrapper registered is called through pluggy, which reaches every implementation: there,
    the answer changes nothing.

    Result: per plugin; the names, each a per-step hook the plugin implements
    (``transfer_batch``, ``on_batch_start``, ``model_step``, ``on_before_backward``, ``backward``,
    ``on_after_backward``, ``on_before_optimizer_step``, ``clip_gradients``, ``optimizer_step``,
    ``on_before_zero_grad``, ``on_train_batch_end``, ``on_evaluation_batch_end``); any other name
    is a :class:`~ptrain.errors.PluginError`. ``None`` or nothing: every hook it implements is
    called. Implemented by: callbacks whose per-step work is optional (the checkpoint callback
    without step or time triggers).
    """


@hookspec
def on_stage_start(trainer: Trainer, stage: str) -> None:
    """A stage begins in this process, before the module is set up for it.

    Fires: once per process per stage (``stage`` is ``"fit"``, ``"validate"``, ``"test"`` or
    ``"predict"``), after ``setup_device``, ``precision_policy``, the data's ``prepare_data``
    and the datamodule's ``setup``; then the module's own ``setup(stage)`` runs, then its
    ``configure_model``, ``wrap_model`` and the optimizers. Lightning's ``Callback.setup``
    fires here, as Lightning calls it before the module's ``setup``. For work that needs the
    wrapped model, the optimizers or the dataloaders, use :func:`setup`.

    Result: all. Implemented by: callbacks that change the module before it is configured
    (freezing layers before the optimizers are built), Lightning adapters.
    """


@hookspec
def setup(trainer: Trainer, stage: str) -> None:
    """Prepare the plugin for a stage; everything is in place.

    Fires: once per process per stage (``stage`` is ``"fit"``, ``"validate"``, ``"test"`` or
    ``"predict"``),
    after models, optimizers and dataloaders are ready and a checkpoint (if any) is restored, just
    before the first epoch.

    Result: all. Implemented by: any plugin.
    """


@hookspec(firstresult=True)
def report_error(trainer: Trainer, exception: BaseException) -> BaseException | None:
    """The error a failed stage raises, where another than its own explains it better.

    Fires: once per process when a stage ends with an error (``exception``), before
    ``teardown``. A multi-process strategy returns the error of the rank that failed first (a
    rank whose collective broke because another rank died would otherwise report the broken
    collective), and may stop the job's other processes here.

    Result: firstresult; the exception to raise, or ``None`` to raise ``exception``.
    Implemented by: strategies.
    """


@hookspec
def teardown(trainer: Trainer, stage: str) -> None:
    """Release what ``setup`` took; always fires, also when the run ended with an error.

    Fires: once per process at the end of each stage. ``trainer.exception`` is the error
    that ended the run, or ``None``. Each implementation is called on its own, then the
    module's and the datamodule's ``teardown``: one that raises does not keep the others from
    theirs, and its error is a warning naming the plugin (the stage's outcome stands).

    Result: all. Implemented by: any plugin.
    """


@hookspec
def on_loop_start(trainer: Trainer, loop: str) -> None:
    """A loop begins.

    Fires: on every process, with ``loop`` one of ``"fit"`` (the whole ``fit`` call, after
    ``setup``), ``"sanity_check"`` (the few validation batches before training), ``"train"``
    (the training epochs, after the sanity check), ``"validate"``, ``"test"`` or ``"predict"``
    (one pass over that stage's dataloader: also each validation within ``fit``, and the one
    inside the sanity check, where ``trainer.sanity_checking`` is ``True``). Lightning's
    ``on_fit_start``, ``on_sanity_check_start``, ``on_train_start`` and
    ``on_{validation,test,predict}_start`` (and ``_epoch_start``) are these.

    Result: all. Implemented by: callbacks (timers, displays, Lightning adapters).
    """


@hookspec
def on_loop_end(trainer: Trainer, loop: str) -> None:
    """A loop that :func:`on_loop_start` announced is done.

    Fires: on every process, once per ``on_loop_start`` of the same ``loop``, unless an error
    ended the loop (``teardown`` fires then). A ``"validate"`` or ``"test"`` pass ends after its
    metrics are published (for ``"validate"`` within ``fit``, after ``on_validation_end``);
    ``"fit"`` ends after the last epoch, before ``teardown``.

    Result: all. Implemented by: callbacks.
    """


@hookspec(firstresult=True)
def evaluation_mode(trainer: Trainer, stage: str) -> bool | None:
    """Put the model in evaluation mode for a pass of ``stage``.

    Fires: at the start of every validation, test and prediction pass (``stage``
    ``"validate"``, ``"test"`` or ``"predict"``; each validation within ``fit`` and the sanity
    check's too), before its ``on_loop_start``, with autograd already off. ``trainer.stage``
    is still that of the loop the pass runs in (``"train"`` for a validation within ``fit``).
    Whatever an implementation does, every submodule's ``training`` flag is restored after the
    pass's batches and epoch-level hooks, before ``on_validation_end``.

    Result: firstresult; return ``True`` once done. Implemented by: the Lightning adapter of a
    module's ``on_validation_model_eval``, ``on_test_model_eval``, ``on_predict_model_eval``
    and ``on_validation_model_zero_grad``. Default: ``trainer.model.eval()``.
    """


# --------------------------------------------------------------------------------------------------
# Per step. Each of these fires once per batch: implementations must not sync the host with the
# device (no ``.item()``, no printing of tensors).


@hookspec(firstresult=True)
def transfer_batch(trainer: Trainer, batch: Any) -> Any:
    """Move a batch to ``trainer.device``.

    Fires: once per batch of every stage, before ``model_step``.

    Result: firstresult; the batch on the device. Implemented by: accelerators.
    """


@hookspec(firstresult=True)
def model_step(trainer: Trainer, stage: str, batch: Any, batch_idx: int) -> Any:
    """Run the forward pass and the loss for one batch.

    Fires: once per batch: ``stage="train"`` for training batches (under autograd); ``"validate"``,
    ``"test"`` and ``"predict"`` for the batches of those stages (under ``torch.no_grad``, also
    for the sanity check, where ``trainer.sanity_checking`` is ``True``). The default
    implementation calls ``trainer.model(stage, batch, batch_idx)``, i.e. the module's
    ``training_step``, ``validation_step``, ``test_step`` or ``predict_step`` through any wrapper
    ``wrap_model`` put around it.

    Wrappers put contexts around the forward pass: a precision plugin's autocast; a strategy's
    skipping of gradient synchronisation while ``trainer.sync_gradients`` is ``False``. A module
    that optimizes manually runs its backward passes and optimizer steps inside this call.

    Result: firstresult; what the module's step returned. Implemented by: the core (precision and
    strategies as wrappers).
    """


@hookspec(firstresult=True)
def backward(trainer: Trainer, loss: torch.Tensor) -> bool | None:
    """Compute gradients of ``loss`` (already divided by the accumulation factor).

    Fires: once per training batch after ``model_step``, and for each ``manual_backward`` call of
    a module that optimizes manually (inside ``model_step``). ``trainer.sync_gradients`` says
    whether this backward's gradients are to be synchronised across processes. In automatic
    optimization it is fixed for the batch (``False`` inside an accumulation window); in manual
    optimization it is ``True`` unless the module turned it off around this call
    (``toggle_model(optimizer, sync_grad=False)``), so a strategy decides here, not in forward.

    Result: firstresult; return ``True`` once the backward pass is done. Implemented by: precision
    plugins (loss scaling) and strategies (engines with their own backward). Default:
    ``loss.backward()``.
    """


@hookspec
def on_batch_start(trainer: Trainer, stage: str, batch: Any, batch_idx: int) -> None:
    """A batch is on the device and about to be run.

    Fires: once per batch of ``stage`` (``"train"``, ``"validate"``, ``"test"`` or
    ``"predict"``; the sanity check's too), after ``transfer_batch`` and before ``model_step``.
    Costs nothing per step when no plugin implements it.

    Result: all. Implemented by: callbacks.
    """


@hookspec
def on_before_backward(trainer: Trainer, loss: torch.Tensor) -> None:
    """``loss`` is about to be backpropagated.

    Fires: before each ``backward`` call (every training batch in automatic optimization, each
    ``manual_backward`` in manual optimization), with the loss ``backward`` receives.

    Result: all. Implemented by: callbacks.
    """


@hookspec
def on_after_backward(trainer: Trainer) -> None:
    """A backward pass is done: the gradients of this micro-batch are accumulated.

    Fires: after each ``backward`` call. Inside an accumulation window, and before
    ``on_before_optimizer_step`` unscales them, the gradients may still be scaled by a
    loss-scaling precision plugin.

    Result: all. Implemented by: callbacks.
    """


@hookspec
def on_before_optimizer_step(trainer: Trainer, optimizer: torch.optim.Optimizer) -> None:
    """Gradients are complete and about to be clipped and applied.

    Fires: once per optimizer step, before ``clip_gradients``. A loss-scaling precision plugin
    unscales the gradients here (with ``tryfirst=True``, so that every other implementation sees
    true gradients); callbacks may inspect or change gradients.

    Result: all. Implemented by: precision plugins and callbacks.
    """


@hookspec(firstresult=True)
def clip_gradients(trainer: Trainer, optimizer: torch.optim.Optimizer) -> bool | None:
    """Clip the gradients of ``optimizer``'s parameters.

    Fires: once per optimizer step when ``trainer.gradient_clip_val`` is set, with
    ``trainer.gradient_clip_algorithm`` ``"norm"`` or ``"value"``; on every optimizer step when
    a registered plugin has the attribute ``clips_every_step = True`` (an implementation that
    decides itself whether and how to clip, such as the one calling a module's
    ``configure_gradient_clipping``; it runs ``tryfirst`` and returns ``True``).

    Result: firstresult; return ``True`` once clipped, ``None`` to leave the step to the next
    implementation. Implemented by: strategies whose gradients are sharded. Default:
    ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_`` with ``gradient_clip_val``;
    nothing when it is unset (a step a ``clips_every_step`` plugin left alone).
    """


@hookspec(firstresult=True)
def optimizer_step(trainer: Trainer, optimizer: torch.optim.Optimizer) -> bool | None:
    """Apply the gradients: step ``optimizer``.

    Fires: once per optimizer step (at the end of each accumulation window, and at the end of an
    epoch whose last window is incomplete), after ``clip_gradients``. The core then zeroes the
    gradients with ``set_to_none=True``.

    Result: firstresult; return ``True`` once stepped (also when the step was deliberately
    skipped, e.g. on a gradient overflow). Implemented by: precision plugins (a gradient scaler)
    and accelerators (XLA). Default: ``optimizer.step()``.
    """


@hookspec
def on_before_zero_grad(trainer: Trainer, optimizer: torch.optim.Optimizer) -> None:
    """``optimizer`` stepped; its gradients are about to be cleared (set to ``None``).

    Fires: in automatic optimization, after each ``optimizer_step``, before
    ``optimizer.zero_grad(set_to_none=True)`` (ptrain clears gradients right after the step, so
    their memory is free during the next forward pass). A trainer whose
    ``clears_gradients_before_backward`` is true (``ptrain.lightning``'s, as Lightning) clears
    them later: at the first batch of the next accumulation window, after its ``model_step`` and
    before its ``on_before_backward``; the hook fires there.

    Result: all. Implemented by: callbacks (weight averaging, gradient statistics).
    """


@hookspec
def on_train_step_end(trainer: Trainer, batch: Any, batch_idx: int, loss: torch.Tensor,
                      output: Any) -> None:
    """A training batch's step is done, and nothing it triggers has run yet.

    Fires: once per training batch, right after its training step (and the optimizer step, when
    one was due: ``trainer.global_step`` counts it; the schedulers that step with it, and on the
    epoch's last batch the per-epoch ones without a monitor, as in Lightning), before the
    step's metrics are published and before the validation the batch triggers. What a plugin
    logs here is published with the step's values, and a change it makes to the model (an
    extra forward pass that moves BatchNorm's running statistics, an averaged copy of the
    weights) is what that validation sees. Lightning's ``on_train_batch_end`` fires here. Not
    the place to write a checkpoint: the validation due after this batch has not run, so a
    resume from it would skip that validation (:func:`on_train_batch_end` is the place).

    :param loss: the step's loss as the module returned it (``None`` when it skipped the
        batch), still holding its graph.
    :param output: what ``training_step`` returned: the loss, or a dict with ``"loss"`` and
        whatever else the module put in it (predictions to collect, ...).

    Result: all. Implemented by: callbacks that act on the model after each step (online
    evaluators, weight averaging, Lightning's ``on_train_batch_end`` methods). Called only when
    some plugin implements it.
    """


@hookspec
def on_train_batch_end(trainer: Trainer, batch: Any, batch_idx: int, loss: torch.Tensor) -> None:
    """A training batch is done (and the validation due after it, if any).

    Fires: once per training batch, after the optimizer step, :func:`on_train_step_end` and any
    validation the batch triggered. ``trainer.global_step`` counts the optimizer steps taken so
    far. A checkpoint written here resumes exactly after this batch.

    Result: all. Implemented by: callbacks (progress, step-based checkpointing, timers).
    """


@hookspec
def on_evaluation_batch_end(trainer: Trainer, stage: str, outputs: Any, batch: Any,
                            batch_idx: int) -> None:
    """A batch of validation, test or prediction is done.

    Fires: once per batch of ``stage`` (``"validate"``, within ``fit`` too, ``"test"`` or
    ``"predict"``), on every process, after its ``model_step``; for the sanity check's batches
    too, with ``trainer.sanity_checking`` ``True``. ``outputs`` is what the step method returned (for ``"predict"``, the predictions).
    In ``predict``, ``trainer.batch_indices`` holds the dataset indices of the batch where the
    dataloader's order is fixed (a sequential or non-shuffling distributed sampler), else
    ``None``: a writer that streams predictions to disk works here, so nothing needs to be held
    in memory. ``trainer.num_eval_batches`` is the number of batches the pass runs.

    Result: all. Implemented by: callbacks (prediction writers, progress displays).
    """


# --------------------------------------------------------------------------------------------------
# Per epoch and per validation.


@hookspec
def on_epoch_start(trainer: Trainer) -> None:
    """A training epoch begins (``trainer.current_epoch`` is its index).

    Fires: once per training epoch, before its dataloader iterator is created (set a sampler's
    epoch here).

    Result: all. Implemented by: strategies and callbacks.
    """


@hookspec
def on_epoch_metrics(trainer: Trainer, stage: str) -> None:
    """The batches of a training epoch or an evaluation pass are done, and its epoch-level
    metrics are about to be averaged, reduced and published: the last moment to ``log`` a value
    that belongs to this epoch (it is published with the others).

    Fires: once per training epoch (``stage="train"``, after the epoch's last batch and the
    validation due after it, before ``on_epoch_end``) and once per validation, test or
    prediction pass (``"validate"``, ``"test"``, ``"predict"``; in the sanity check too, whose
    metrics are then discarded). Lightning's ``on_{train,validation,test,predict}_epoch_end``.

    Result: all. Implemented by: callbacks and modules that log epoch aggregates.
    """


@hookspec
def on_epoch_end(trainer: Trainer) -> None:
    """A training epoch is done; its epoch-level metrics are in ``trainer.callback_metrics``.

    Fires: once per training epoch, after the epoch's last batch, after the validation due at the
    end of the epoch and after epoch-interval schedulers stepped. ``trainer.current_epoch`` is
    still the index of the epoch that ended. Set ``trainer.should_stop`` to stop.

    Result: all. Implemented by: callbacks.
    """


@hookspec
def on_validation_end(trainer: Trainer) -> None:
    """A validation run is done; its metrics are in ``trainer.callback_metrics``, reduced.

    Fires: after every validation run (within ``fit`` and in ``validate``), with the model back in
    training mode. Set ``trainer.should_stop`` to stop. Not after the sanity check that precedes
    training: it publishes nothing (its batches fire the per-batch hooks and
    ``on_loop_start``/``on_loop_end("validate")``, with ``trainer.sanity_checking`` ``True``).

    Result: all. Implemented by: callbacks (early stopping, best-model checkpointing).
    """


# --------------------------------------------------------------------------------------------------
# Metrics.


@hookspec(firstresult=True)
def reduce_metrics(
    trainer: Trainer, metrics: dict[str, torch.Tensor], op: str
) -> dict[str, torch.Tensor]:
    """Reduce metric tensors across processes.

    Fires: on every process at the same points (the core's publish points: every
    ``log_every_n_steps`` steps, after each validation, at the end of each epoch, and to agree on
    stopping), so an implementation may run collectives. ``op`` is ``"mean"``, ``"sum"``,
    ``"max"`` or ``"min"``.

    Result: firstresult; a dict with the same keys. Implemented by: strategies. Default: the
    metrics unchanged (one process).
    """


@hookspec(firstresult=True)
def all_gather_object(trainer: Trainer, obj: Any) -> list[Any]:
    """Collect a picklable object from every process.

    Fires: where the core needs every process's part of a result (the predictions of
    ``predict``; at each publish point of the metrics, what each process publishes, so that
    they reduce the same names), on every process at the same point, so an implementation
    may run a collective.

    Result: firstresult; a list with one object per process, by global rank, on every process.
    Implemented by: strategies. Default: ``[obj]`` (one process).
    """


@hookspec
def log_metrics(trainer: Trainer, metrics: dict[str, float], step: int) -> None:
    """Write metrics (already reduced and turned into numbers) at ``step``.

    Fires: at the core's publish points (every ``log_every_n_steps`` optimizer steps, after each
    validation, at the end of each epoch), on every process: write only where
    ``trainer.is_global_zero``.

    Result: all. Implemented by: loggers.
    """


@hookspec
def log_hyperparams(trainer: Trainer, hyperparameters: dict[str, Any]) -> None:
    """Record the run's hyperparameters (and, if the tool can hold it, its configuration).

    Fires: once per process at the start of each ``fit``/``validate``, right after ``setup``
    (before the first ``log_metrics``), on every process: write only where
    ``trainer.is_global_zero``. ``hyperparameters`` is the module's ``hparams`` (what
    ``save_hyperparameters`` recorded) merged with the datamodule's, the module's value winning
    where both have a name; plain values only (None, bool, int, float, str, and lists/dicts of
    them), possibly empty. ``trainer.config`` is the run's resolved configuration (the
    ``[trainer]`` options, each plugin's options, and from the CLI the ``[model]``/``[data]``
    tables), for a logger that records it too. The core's default (``trylast``) writes
    ``<run folder>/hparams.toml`` on global rank 0 when there are hyperparameters.

    Result: all. Implemented by: loggers (and the core's default).
    """


# --------------------------------------------------------------------------------------------------
# Checkpoints.


@hookspec
def state_dict(trainer: Trainer, checkpoint: dict[str, Any] | None) -> dict[str, Any] | None:
    """Return this plugin's state to store in a checkpoint (tensors and plain Python values only).

    Fires: per plugin, each time a checkpoint is assembled; the result is stored under the
    plugin's name and handed back to its ``load_state_dict`` on resume. A weights-only
    checkpoint holds no plugin's state, but that of a plugin with the attribute
    ``saves_in_weights_only = True`` (what a module adds to its checkpoints, which loading
    the weights into a new module hands back).

    :param checkpoint: the checkpoint being assembled, to read, not to change: the module's
        weights (``"model"``), the optimizer and scheduler states, the loop counters
        (``"loop"``), and under ``"plugins"`` the states of the plugins asked before this one
        (pluggy's order: ``trylast`` implementations first, ``tryfirst`` ones last). ``None``
        when the state is taken outside a checkpoint (a finder's snapshot of the run).

    Result: per plugin; ``None`` stores nothing. Implemented by: stateful plugins.
    """


@hookspec
def load_state_dict(trainer: Trainer, state: dict[str, Any],
                    checkpoint: dict[str, Any] | None) -> None:
    """Restore what this plugin's ``state_dict`` returned.

    Fires: per plugin, when a run resumes from a checkpoint that holds state under its name, after
    the model and optimizers are restored and before ``setup``.

    :param checkpoint: the whole checkpoint ``state`` came from, to read (``None`` when the
        state comes from outside a checkpoint, a finder's snapshot).

    Result: per plugin. Implemented by: stateful plugins.
    """


@hookspec
def applied_optimizer_settings(trainer: Trainer, settings: list[list[dict[str, Any]]]) -> None:
    """Write into ``settings`` the optimizer settings this plugin applies itself.

    A resume then compares the checkpoint's settings with what the run applies, not only with
    what ``configure_optimizers`` gives.

    Fires: when ``fit`` resumes from a checkpoint, once, after every ``load_state_dict``.
    ``settings`` holds, per optimizer (as in ``trainer.optimizers``), one dict per param group,
    ``{"lr": ..., "weight_decay": ...}``, from ``configure_optimizers`` (``lr`` is where a
    schedule starts: ``initial_lr`` where a scheduler set it). The optimizers hold the
    checkpoint's settings already, and continue with them; the core then warns of each setting
    that differs (docs/reliability.md). A plugin that sets a learning rate or weight decay
    itself (a learning-rate finder applies its suggestion) changes ``settings`` in place to what
    it applies, so that a resume that changed nothing says nothing.

    Result: all (ignored). Implemented by: plugins that change optimizer settings; since it
    fires on every resume of ``fit``, whatever the checkpoint holds, also by plugins that must
    know the run resumes (the finders do not search again).
    """


@hookspec(firstresult=True)
def save_checkpoint(trainer: Trainer, checkpoint: dict[str, Any], path: str) -> bool | None:
    """Write ``checkpoint`` to ``path``; called on every process.

    Fires: each time ``trainer.save_checkpoint(path)`` is called. The default writes on each
    process whose ``trainer.writes_run_files`` is true (global rank 0; with
    ``save_on_each_node`` the first process of every machine), atomically (temporary file,
    fsync, rename). A sharding strategy writes its shards instead; a multi-process strategy adds
    a barrier after the write (as a wrapper).

    Result: firstresult; return ``True`` once written. Implemented by: strategies.
    """


@hookspec(firstresult=True)
def save_checkpoint_in_background(trainer: Trainer, checkpoint: dict[str, Any],
                                  path: str) -> list[Callable[[], None]] | None:
    """Copy what writing ``checkpoint`` to ``path`` needs, and return the functions that write it
    from that copy on the background writer's thread; called on every process, instead of
    ``save_checkpoint``, for an asynchronous save.

    Fires: each time ``trainer.save_checkpoint(path, asynchronous=True)`` is called (the
    checkpoint callback's ``async_save``) in a run where every plugin that implements
    ``save_checkpoint`` implements this hook too (``Trainer.why_not_asynchronous``). What is
    done here, on the training thread, is the training stall: copy what the next step changes
    with ``trainer.copy_for_background(obj)`` (tensors to host memory; a tensor two files of one
    checkpoint point share is copied once; the copies are the next point's buffers once this one
    is written, so the functions must not keep them). For a save between two training steps
    (``on_train_batch_end``), the copies of what only an optimizer step changes (the parameters
    the optimizers hold, and their state) are made on the writer's thread, before the functions
    run, while the next step computes its gradients: read the copies only in the functions.
    The functions returned run in order on one thread, after those of the same checkpoint
    point saved before and before those of any later point. What they raise reaches the
    checkpoint callback at a step boundary, as a synchronous write's error would; under several
    processes every process gets the same error (a refused write:
    :class:`ptrain.CheckpointWriteError`). A collective in them goes over a process group of
    the plugin's own, never one the training thread uses; a function whose collectives every
    rank must join is returned as a :class:`ptrain.background_write.CollectiveWrite`, which
    runs on a rank whose save failed already too (a copy of a tensor changed before it was
    made, an earlier file), told so, where a plain function would be skipped there and leave
    the other ranks waiting. Once per stage, before the first
    such save, it is also called to learn what would be copied
    (``Trainer.prepare_background_copies``): ``trainer.copy_for_background`` then records its
    argument and returns it uncopied, ``path`` is ``os.devnull``, and the functions returned
    are never run, so do nothing here but copy.

    Result: firstresult; the functions this process runs, an empty list on a process that
    writes nothing. Implemented by: strategies that implement ``save_checkpoint`` (a
    multi-process strategy also wraps it, to agree on a refusal while copying). Default: on
    each process whose ``trainer.writes_run_files`` is true, the single file, written
    atomically.
    """


@hookspec(firstresult=True)
def resolve_ckpt_path(trainer: Trainer, ckpt_path: str) -> str | None:
    """Turn what the user gave as ``ckpt_path`` (``"last"``, ``"best"``, a path) into the path to
    load.

    Fires: once per ``fit``/``validate`` given a ``ckpt_path``, in the process that called it,
    before ``launch`` (so before any other loop hook of the stage, and before the run folder is
    chosen: ``trainer.run_dir`` is still that of the trainer's previous run, or ``None``). The
    path that comes back is what every process then hands to ``load_checkpoint``; a checkpoint
    under ``<run>/checkpoints/`` makes ``fit`` continue in ``<run>``. An implementation answers
    only the words it knows and returns ``None`` for the rest; a word it knows but can't resolve
    is a :class:`ptrain.errors.CheckpointError` saying what to do.

    Result: firstresult; the path, as text. Implemented by: callbacks that name checkpoints
    (``checkpoint`` answers ``"best"``), strategies whose checkpoints live elsewhere. Default:
    ``"last"`` is the newest ``run_root/version_N/checkpoints/last.ckpt``; anything else
    is taken as a path.
    """


@hookspec(firstresult=True)
def load_checkpoint(trainer: Trainer, path: str) -> dict[str, Any] | None:
    """Read a checkpoint written by ``save_checkpoint``.

    Fires: once per process when a run resumes (``ckpt_path``), after the model and optimizers are
    set up. The default reads the file with ``torch.load(weights_only=True)``.

    Result: firstresult; the checkpoint dict. Implemented by: strategies.
    """


@hookspec(firstresult=True)
def verify_checkpoint(trainer: Trainer, path: str) -> bool | None:
    """Check that the checkpoint at ``path`` is intact (every byte as it was written) without
    restoring anything from it.

    Fires: when the run chooses among checkpoints (``ckpt_path="last-intact"``), once per
    candidate, newest first, until one is intact; in the process that resolves ``ckpt_path``,
    before ``launch``. Not a collective.

    Result: firstresult; ``True`` when the implementation reads this checkpoint's format and
    found it intact, ``False`` when this run can't resume from a checkpoint of this format (a
    strategy that reads only its own: ``fsdp`` and a single file), ``None`` when the format is
    not its own (the next implementation is asked). A damaged or unreadable checkpoint raises
    :class:`ptrain.errors.CheckpointError` saying what failed. Implemented by: strategies that
    write their own format (``fsdp``'s sharded folders). Default: a single file, read with its
    checksums checked.
    """
