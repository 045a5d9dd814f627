"""Hook *methods*: a module's or a plain callback object's methods named like Lightning's hooks
(``on_train_epoch_end``, ``on_validation_batch_start``, ...), called at the points those names
mean through ptrain's own hooks.

A :class:`TrainModule` defines them as no-op methods (see :class:`ModuleHookMethods`); a module
that overrides some (in its class, or by setting one on the instance) gets, for each run, one
plugin (:func:`module_hook_plugin`) implementing just the ptrain hooks those methods need. A
callback object without ``@ptrain.hookimpl`` methods whose methods carry Lightning's callback
names (``(trainer, pl_module, ...)`` signatures) is adapted the same way
(:func:`callback_hook_plugin`). The set of methods is found once, when the run starts: a method
nobody overrides costs nothing per step, since its ptrain hook is then not implemented at all.

Where each method fires (ptrain hook -> methods, in this order; for one event the callbacks'
method, then the module's, as in Lightning):

- ``on_stage_start(stage)``: ``setup(trainer, pl_module, stage=...)`` (callbacks; a module's
  ``setup``/``teardown`` are called by the trainer right after, before the model is wrapped)
- ``on_loop_start(loop)``: ``on_fit_start``, ``on_sanity_check_start`` (callbacks),
  ``on_train_start``, ``on_{validation,test,predict}_start`` then ``..._epoch_start``
- ``on_loop_end(loop)``: ``on_fit_end``, ``on_sanity_check_end``, ``on_train_end``,
  ``on_{validation,test,predict}_end``, then the module's ``on_{validation,test}_model_train``
- ``evaluation_mode(stage)`` (module): ``on_validation_model_zero_grad`` (a validation within
  ``fit``), then ``on_{validation,test,predict}_model_eval``, which puts the model in eval mode
- ``on_epoch_start``: ``on_train_epoch_start``; ``on_epoch_metrics(stage)``:
  ``on_{train,validation,test,predict}_epoch_end`` (a value logged there joins the epoch's)
- ``transfer_batch`` (module): ``on_before_batch_transfer``, ``transfer_batch_to_device``,
  ``on_after_batch_transfer``
- ``on_batch_start(stage)``: ``on_{train,validation,test,predict}_batch_start``;
  ``on_train_step_end``: ``on_train_batch_end`` (before the validation the batch triggers, as
  in Lightning); ``on_evaluation_batch_end``: ``on_{validation,test,predict}_batch_end``
- ``on_before_backward``, ``on_after_backward``, ``on_before_optimizer_step``,
  ``on_before_zero_grad``: the methods of the same names; ``backward`` (module): ``backward``
- ``clip_gradients`` (module): ``configure_gradient_clipping``; ``optimizer_step`` (module):
  ``optimizer_step``
- ``state_dict``/``load_state_dict``: ``on_save_checkpoint``/``on_load_checkpoint`` (and a
  callback's own ``state_dict``/``load_state_dict``), with Lightning's checkpoint layout (see
  :func:`checkpoint_view`)
- ``teardown``: ``on_exception`` (after an error), then ``teardown(trainer, pl_module,
  stage=...)`` (callbacks).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import TYPE_CHECKING, Any, Callable

from ptrain.errors import ModelError, PluginError
from ptrain.hookspecs import PROJECT_NAME
from ptrain.hyperparameters import DATAMODULE_KEYS, MODULE_KEYS, checkpoint_entries

if TYPE_CHECKING:
    from ptrain.trainer import Trainer

import pluggy

_hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

#: the stage names of ptrain's hooks -> the word Lightning's method names use
STAGE_WORDS = {"train": "train", "validate": "validation", "test": "test", "predict": "predict"}
#: on_loop_start(loop) -> the methods it calls, in order
LOOP_START = {"fit": ("on_fit_start",), "sanity_check": ("on_sanity_check_start",),
              "train": ("on_train_start",),
              **{stage: (f"on_{word}_start", f"on_{word}_epoch_start")
                 for stage, word in STAGE_WORDS.items() if stage != "train"}}
LOOP_END = {"fit": ("on_fit_end",), "sanity_check": ("on_sanity_check_end",),
            "train": ("on_train_end",),
            **{stage: (f"on_{word}_end",) for stage, word in STAGE_WORDS.items()
               if stage != "train"}}
#: on_loop_end(loop) -> the module's method after the others (called only when overridden, as
#: in Lightning: without it, the trainer restores the modes the model had)
MODEL_TRAIN = {"validate": "on_validation_model_train", "test": "on_test_model_train"}
#: evaluation_mode(stage) -> the module's method that puts the model in eval mode
MODEL_EVAL = {"validate": "on_validation_model_eval", "test": "on_test_model_eval",
              "predict": "on_predict_model_eval"}
ZERO_GRAD_BEFORE_VALIDATION = "on_validation_model_zero_grad"
TRANSFER_METHODS = ("on_before_batch_transfer", "transfer_batch_to_device",
                    "on_after_batch_transfer")
EPOCH_END = {stage: f"on_{word}_epoch_end" for stage, word in STAGE_WORDS.items()}
BATCH_START = {stage: f"on_{word}_batch_start" for stage, word in STAGE_WORDS.items()}
BATCH_END = {stage: f"on_{word}_batch_end" for stage, word in STAGE_WORDS.items()}
STEP_METHODS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step",
                "on_before_zero_grad")
CHECKPOINT_METHODS = ("on_save_checkpoint", "on_load_checkpoint")
#: a callback defining one of these has state saved in checkpoints (under its state_key)
STATE_METHODS = ("state_dict", "load_state_dict") + CHECKPOINT_METHODS

#: every method name both a module and a callback may have -> the ptrain hook that calls it
METHOD_HOOKS: dict[str, str] = {
    **{m: "on_loop_start" for ms in LOOP_START.values() for m in ms},
    **{m: "on_loop_end" for ms in LOOP_END.values() for m in ms},
    "on_train_epoch_start": "on_epoch_start",
    **{m: "on_epoch_metrics" for m in EPOCH_END.values()},
    **{m: "on_batch_start" for m in BATCH_START.values()},
    "on_train_batch_end": "on_train_step_end",
    **{m: "on_evaluation_batch_end" for s, m in BATCH_END.items() if s != "train"},
    **{m: m for m in STEP_METHODS},
    "on_save_checkpoint": "state_dict", "on_load_checkpoint": "load_state_dict",
}
#: methods only a callback object has (a module's setup/teardown are called by the trainer)
CALLBACK_ONLY = {"setup": "on_stage_start", "teardown": "teardown", "on_exception": "teardown",
                 "state_dict": "state_dict", "load_state_dict": "load_state_dict"}
CALLBACK_METHODS = {**METHOD_HOOKS, **CALLBACK_ONLY}
#: methods only a module has
MODULE_ONLY = {
    **{m: "on_loop_end" for m in MODEL_TRAIN.values()},
    **{m: "evaluation_mode" for m in MODEL_EVAL.values()},
    ZERO_GRAD_BEFORE_VALIDATION: "evaluation_mode",
    **{m: "transfer_batch" for m in TRANSFER_METHODS},
    "backward": "backward",
    "configure_gradient_clipping": "clip_gradients",
    "optimizer_step": "optimizer_step",
}
MODULE_METHODS = {**{m: h for m, h in METHOD_HOOKS.items()
                     if m not in ("on_sanity_check_start", "on_sanity_check_end")},
                  **MODULE_ONLY}
#: the name of the plugin calling a module's hook methods (its saved state's key)
MODULE_PLUGIN = "module-hooks"

#: Lightning module hooks ptrain does not call, with why and what to do instead: a module
#: overriding one is refused at the start of the run rather than silently not called.
UNSUPPORTED_MODULE_METHODS = {
    "configure_sharded_model": "Lightning deprecated it for configure_model, which ptrain "
                               "calls in its place; create the layers in configure_model",
    "optimizer_zero_grad": "ptrain sets the gradients to None itself (its own Trainer right "
                           "after each optimizer step, ptrain.lightning's before the next "
                           "window's backward, as Lightning), so an override would not decide "
                           "how they are cleared; act in on_before_zero_grad, which runs right "
                           "before",
}
#: Module methods Lightning 2.0 removed and refuses: ptrain refuses them too, under either
#: Trainer -> the method to use instead.
EPOCH_OUTPUTS_METHODS = {"training_epoch_end": "on_train_epoch_end",
                         "validation_epoch_end": "on_validation_epoch_end",
                         "test_epoch_end": "on_test_epoch_end"}
#: Hook methods of Lightning 1.x that Lightning 2 no longer calls, and does not refuse: it runs
#: a program that defines one without ever calling it -> where their code goes now. ptrain's
#: Trainer refuses them; ``ptrain.lightning``'s warns and runs on (see
#: ``Trainer.stops_on_removed_lightning_hooks``).
_REMOVED_EITHER = {
    "on_epoch_start": "on_train_epoch_start (or on_validation_epoch_start, "
                      "on_test_epoch_start)",
    "on_epoch_end": "on_train_epoch_end (or on_validation_epoch_end, on_test_epoch_end)",
    "on_batch_start": "on_train_batch_start",
    "on_batch_end": "on_train_batch_end",
    "on_pretrain_routine_start": "on_fit_start",
    "on_pretrain_routine_end": "on_fit_start",
}
REMOVED_MODULE_METHODS = {
    **_REMOVED_EITHER,
    **{f"{stage}_step_end": f"{stage}_step (ptrain runs no DataParallel whose parts would need "
                            f"joining)" for stage in ("training", "validation", "test")},
    "on_hpc_save": "on_save_checkpoint", "on_hpc_load": "on_load_checkpoint",
    "on_post_move_to_device": "configure_model",
}
REMOVED_CALLBACK_METHODS = {
    **_REMOVED_EITHER,
    "on_init_start": "the callback's __init__", "on_init_end": "setup",
    "on_keyboard_interrupt": "on_exception",
    "on_configure_sharded_model": "setup", "on_before_accelerator_backend_setup": "setup",
}


def overridden(obj: Any, names: Any, base: type | None) -> list[str]:
    """The names among ``names`` that ``obj`` defines as methods other than ``base``'s: in its
    class, or set on the instance (``model.on_validation_model_train = fn``; set to ``None``,
    it has none)."""
    found = []
    own = getattr(obj, "__dict__", {})
    for name in names:
        if name in own:
            if callable(own[name]):
                found.append(name)
            continue
        method = getattr(type(obj), name, None)
        if method is None or not callable(method):
            continue
        if base is not None and getattr(base, name, None) is method:
            continue
        found.append(name)
    return found


def overridden_method(module: Any, name: str) -> bool:
    """Whether ``module`` (a :class:`TrainModule`) overrides the hook method ``name``."""
    return bool(overridden(module, (name,), ModuleHookMethods))


class _Dispatch:
    """The bound methods of one or more targets, by method name, each taking
    ``(trainer, *args, **kwargs)``: for a callback, ``method(trainer, trainer.module, *args,
    **kwargs)``; for a module, ``method(*args, **kwargs)``."""

    def __init__(self) -> None:
        self.methods: dict[str, list[Callable[..., Any]]] = {}

    def add(self, name: str, function: Callable[..., Any]) -> None:
        self.methods.setdefault(name, []).append(function)

    def has(self, name: str) -> bool:
        return name in self.methods

    def call(self, name: str, trainer: Trainer, *args: Any, **kwargs: Any) -> None:
        for function in self.methods.get(name, ()):
            result = function(trainer, *args, **kwargs)
            if name == "on_train_batch_start" and isinstance(result, int) and result == -1:
                raise ModelError(
                    "on_train_batch_start returned -1, which in Lightning ends the epoch early; "
                    "ptrain does not skip batches that way. Set trainer.should_stop = True to "
                    "stop training, or limit the batches with limit_train_batches.")


def _lightning_plugins(trainer: Trainer, role: str) -> list[Any]:
    """The hook-method plugins of ``role`` (``"module"`` or ``"callbacks"``) registered in the
    run, in registration order."""
    return [plugin for _, plugin in trainer.pm.list_name_plugin()
            if getattr(plugin, "lightning_role", None) == role]


def _module_takes_over(trainer: Trainer) -> bool:
    """Whether the module's plugin calls the callbacks' methods of a multi-method loop event
    itself, interleaved with its own (Lightning's order)."""
    return any("on_loop_start" in plugin.hooks for plugin in _lightning_plugins(trainer, "module"))


def _plugin_class(name: str, hooks: set[str], dispatch: _Dispatch, role: str,
                  states: Callable[..., dict[str, Any] | None] | None = None,
                  load: Callable[..., None] | None = None) -> Any:
    """An object implementing exactly ``hooks`` of the ptrain specification by calling
    ``dispatch``'s methods (its class is made per run, so nothing else is implemented).
    ``role`` is ``"module"`` (implementations ``trylast``: after the callbacks', Lightning's
    order) or ``"callbacks"``."""
    module_role = role == "module"
    mark = _hookimpl(trylast=module_role)

    def on_stage_start(trainer, stage):
        dispatch.call(ATTACH_LOGGING, trainer)
        dispatch.call("setup", trainer, stage=stage)

    def on_loop_start(trainer, loop):
        methods = LOOP_START[loop]
        if len(methods) == 1:
            dispatch.call(methods[0], trainer)
        elif module_role:  # per method: the callbacks', then the module's
            others = [p.lightning_dispatch for p in _lightning_plugins(trainer, "callbacks")]
            for method in methods:
                for other in others:
                    other.call(method, trainer)
                dispatch.call(method, trainer)
        elif not _module_takes_over(trainer):
            for method in methods:
                dispatch.call(method, trainer)

    def on_loop_end(trainer, loop):
        for method in LOOP_END[loop]:
            if method == "on_validation_end" and "on_validation_end" in hooks and \
                    not trainer.sanity_checking:
                continue  # called by the on_validation_end hook, before the checkpoint saves
            dispatch.call(method, trainer)
        if loop in MODEL_TRAIN:
            dispatch.call(MODEL_TRAIN[loop], trainer)

    def on_validation_end(trainer):
        dispatch.call("on_validation_end", trainer)

    def evaluation_mode(trainer, stage):
        if (stage == "validate" and trainer.stage == "train" and not trainer.sanity_checking):
            dispatch.call(ZERO_GRAD_BEFORE_VALIDATION, trainer)
        if not dispatch.has(MODEL_EVAL[stage]):
            return None  # the default puts the model in eval mode
        dispatch.call(MODEL_EVAL[stage], trainer)
        return True

    def transfer_batch(trainer, batch):
        index = getattr(trainer, "dataloader_idx", 0) or 0
        module = trainer.module
        if dispatch.has("on_before_batch_transfer"):
            batch = module.on_before_batch_transfer(batch, index)
        batch = module.transfer_batch_to_device(batch, trainer.device, index)
        if dispatch.has("on_after_batch_transfer"):
            batch = module.on_after_batch_transfer(batch, index)
        return batch

    def on_epoch_start(trainer):
        dispatch.call("on_train_epoch_start", trainer)

    def on_epoch_metrics(trainer, stage):
        dispatch.call(EPOCH_END[stage], trainer)

    def on_batch_start(trainer, stage, batch, batch_idx):
        index = getattr(trainer, "dataloader_idx", None)  # given under several dataloaders
        if index is None:
            dispatch.call(BATCH_START[stage], trainer, batch, batch_idx)
        else:
            dispatch.call(BATCH_START[stage], trainer, batch, batch_idx, index)

    def on_train_step_end(trainer, batch, batch_idx, loss, output):
        dispatch.call("on_train_batch_end", trainer, _batch_end_outputs(trainer, loss, output),
                      batch, batch_idx)

    def on_evaluation_batch_end(trainer, stage, outputs, batch, batch_idx):
        index = getattr(trainer, "dataloader_idx", None)
        if index is None:
            dispatch.call(BATCH_END[stage], trainer, outputs, batch, batch_idx)
        else:
            dispatch.call(BATCH_END[stage], trainer, outputs, batch, batch_idx, index)

    def on_before_backward(trainer, loss):
        dispatch.call("on_before_backward", trainer, loss)

    def backward(trainer, loss):
        pending = trainer.module.__dict__.get("_backward_arguments")
        args, kwargs = (pending[0], pending[1]) if pending else ((), {})
        if pending:
            pending[0] = None  # taken (manual_backward checks)
        trainer.module.backward(loss, *args, **kwargs)
        return True

    def setup(trainer, stage):
        other = [impl.plugin_name for impl in trainer.pm.hook.backward.get_hookimpls()
                 if not impl.tryfirst and impl.plugin_name not in (name, "loop-defaults")]
        if other and dispatch.has("backward"):
            raise ModelError(
                f"{type(trainer.module).__qualname__}.backward is overridden, but the plugin "
                f"{other[-1]!r} does the backward pass itself (loss scaling, a sharding "
                f"engine), so the override would silently not run. Remove the override (act "
                f"in on_before_backward / on_after_backward), or run without that plugin.")

    def on_after_backward(trainer):
        dispatch.call("on_after_backward", trainer)

    def on_before_optimizer_step(trainer, optimizer):
        dispatch.call("on_before_optimizer_step", trainer, optimizer)

    def on_before_zero_grad(trainer, optimizer):
        dispatch.call("on_before_zero_grad", trainer, optimizer)

    def teardown(trainer, stage):
        if trainer.exception is not None:
            dispatch.call("on_exception", trainer, trainer.exception)
        dispatch.call("teardown", trainer, stage=stage)

    inside_clip: list[bool] = []
    inside_step: list[bool] = []

    def clip_gradients(trainer, optimizer):
        if inside_clip:  # the module's own clip_gradients call: the next implementation clips
            return None
        inside_clip.append(True)
        try:
            dispatch.call("configure_gradient_clipping", trainer, optimizer,
                          gradient_clip_val=trainer.gradient_clip_val,
                          gradient_clip_algorithm=trainer.gradient_clip_algorithm)
        finally:
            inside_clip.clear()
        return True

    def optimizer_step(trainer, optimizer):
        # the module's optimizer.step() inside its override, or manual optimization (where
        # Lightning does not call the module's optimizer_step): the next implementation steps
        if inside_step or not trainer.module.automatic_optimization:
            return None
        inside_step.append(True)
        closure = StepClosure(trainer)
        try:
            dispatch.call("optimizer_step", trainer, trainer.current_epoch, trainer.batch_idx,
                          StepOptimizer(trainer, optimizer), closure)
        finally:
            inside_step.clear()
        if not closure.called:
            raise ModelError(
                f"{type(trainer.module).__qualname__}.optimizer_step returned without calling "
                f"optimizer_closure() or optimizer.step(closure=optimizer_closure); the closure "
                f"stands for the batch's training step and backward, which Lightning runs "
                f"inside it. Call optimizer.step(closure=optimizer_closure) (skip the step "
                f"after calling optimizer_closure() to leave the weights as they are).")
        return True

    def state_dict(trainer, checkpoint):
        return states(trainer, checkpoint)

    def load_state_dict(trainer, state, checkpoint):
        load(trainer, state, checkpoint)

    functions = {f.__name__: f for f in (
        on_stage_start, on_loop_start, on_loop_end, on_validation_end, evaluation_mode,
        transfer_batch, on_epoch_start, on_epoch_metrics, on_batch_start, on_train_step_end,
        on_evaluation_batch_end, on_before_backward, backward, on_after_backward,
        on_before_optimizer_step, on_before_zero_grad, setup, teardown, state_dict,
        load_state_dict, clip_gradients, optimizer_step)}
    namespace = {hook: staticmethod(mark(functions[hook])) for hook in hooks}
    # the module's methods decide: before any other implementation
    first = {"clip_gradients", "optimizer_step", "transfer_batch", "evaluation_mode"}
    if module_role:  # saved after the callbacks' (it reads theirs), as Lightning calls it last
        first.add("state_dict")
    for hook in first & hooks:
        namespace[hook] = staticmethod(_hookimpl(tryfirst=True)(functions[hook]))
    if module_role and dispatch.has("backward") and "backward" in hooks:
        # an overridden backward does the pass: before loop-defaults' (trylast) loss.backward(),
        # not after it; setup refuses a plugin that also does it (loss scaling). Called for
        # manual_backward's arguments only, it stays trylast, after a loss scaler's.
        namespace["backward"] = staticmethod(_hookimpl()(functions["backward"]))
    if "clip_gradients" in hooks:  # it decides on every step, before any other clipping
        namespace["clips_every_step"] = True
    if module_role:  # what on_save_checkpoint adds, which load_from_checkpoint hands back
        namespace["saves_in_weights_only"] = True
    namespace.update(name=name, hooks=frozenset(hooks), lightning_role=role,
                     lightning_dispatch=dispatch)
    return type("HookMethods", (), namespace)()


def _batch_end_outputs(trainer: Trainer, loss: Any, output: Any) -> dict[str, Any] | None:
    """``on_train_batch_end``'s ``outputs``, as Lightning's: the loss the backward pass used
    (divided by ``accumulate_grad_batches`` under automatic optimization) without its graph,
    so a method keeping outputs across steps keeps numbers, and the other entries of a dict
    ``training_step`` returned, as they are; without a loss (the step returned ``None``, or
    under manual optimization a dict without one), those entries alone (``{}``)."""
    rest = {k: v for k, v in output.items() if k != "loss"} if isinstance(output, dict) else {}
    if loss is None:
        return rest
    accumulate = trainer.accumulate_grad_batches
    if accumulate > 1 and trainer.module.automatic_optimization:
        loss = loss / accumulate
    return {"loss": loss.detach(), **rest}


def module_hook_plugin(module: Any, base: type, stop: bool = True) -> Any | None:
    """The plugin calling ``module``'s overridden hook methods (those ``base``, the
    :class:`TrainModule`, defines as no-ops), or ``None`` when it overrides none. Its
    implementations are ``trylast``, so they run after the callbacks' (Lightning's order). A
    Lightning hook ptrain does not call is a :class:`ModelError` naming what to do instead; so
    is a hook Lightning 2 no longer calls, or with ``stop=False`` a warning (see
    :func:`check_removed_methods`)."""
    unsupported = overridden(module, UNSUPPORTED_MODULE_METHODS, base)
    if unsupported:
        name = unsupported[0]
        raise ModelError(f"{type(module).__qualname__}.{name} is a Lightning hook that ptrain "
                         f"does not call, so it would be silently ignored: "
                         f"{UNSUPPORTED_MODULE_METHODS[name]}.")
    removed = overridden(module, EPOCH_OUTPUTS_METHODS, base)
    if removed:
        name = removed[0]
        raise ModelError(
            f"{type(module).__qualname__}.{name} is a hook Lightning 2.0 removed (Lightning "
            f"refuses it too), so it would never run: move its code to "
            f"{EPOCH_OUTPUTS_METHODS[name]}, and keep the step outputs it needs on the module "
            f"(append them to a list in the step, use and clear it there).")
    check_removed_methods(module, base, REMOVED_MODULE_METHODS, stop, ModelError)
    names = overridden(module, MODULE_METHODS, base)
    if not names and module.automatic_optimization:
        return None
    dispatch = _Dispatch()
    for name in names:
        method = getattr(module, name)
        dispatch.add(name, lambda trainer, *args, _m=method, **kwargs: _m(*args, **kwargs))
    hooks = {MODULE_METHODS[n] for n in names}
    if hooks & {"state_dict", "load_state_dict"}:  # saved even when empty: loaded on resume
        hooks |= {"state_dict", "load_state_dict"}
    if "backward" in names:
        hooks.add("setup")  # checks that no other plugin does the backward instead
    if not module.automatic_optimization:  # manual_backward's arguments reach loss.backward
        hooks.add("backward")

    def states(trainer: Trainer, checkpoint: dict[str, Any] | None) -> dict[str, Any]:
        view = checkpoint_view(trainer, checkpoint)
        before, weights = dict(view), dict(view["state_dict"])
        if dispatch.has("on_save_checkpoint"):
            module.on_save_checkpoint(view)
            _warn_changed(f"{type(module).__qualname__}.on_save_checkpoint", view, before,
                          weights)
        return {k: v for k, v in view.items() if k not in before}

    def load(trainer: Trainer, state: dict[str, Any], checkpoint: dict[str, Any] | None) -> None:
        if dispatch.has("on_load_checkpoint"):
            module.on_load_checkpoint(loaded_checkpoint_view(checkpoint, state, trainer))

    return _plugin_class(MODULE_PLUGIN, hooks, dispatch, "module", states=states, load=load)


# -- Lightning's checkpoint layout -----------------------------------------------------------

#: the keys of Lightning's checkpoint that ptrain fills from its own; what a hook adds under
#: any other key is saved for it and handed back on load
VIEW_KEYS = ("epoch", "global_step", "pytorch-lightning_version", "state_dict", "loops",
             "callbacks", "optimizer_states", "lr_schedulers")
_WARNED: set[str] = set()


def _lightning_version() -> str:
    from ptrain.lightning import __version__

    return __version__


def _epoch_of(loop: dict[str, Any]) -> int:
    """Lightning's ``epoch`` of a checkpoint (the epoch under way, or the last one done) from
    ptrain's loop state (the next epoch to run once one ended)."""
    epoch = int(loop.get("epoch", 0))
    return epoch - 1 if epoch > 0 and loop.get("batch") == 0 else epoch


def _live_checkpoint(trainer: Trainer) -> dict[str, Any]:
    """The run's state in a checkpoint's layout, for a hook called outside a checkpoint (a
    finder's snapshot, where Lightning writes a checkpoint file): the module's (and
    datamodule's) hyperparameters too, as a checkpoint holds them."""
    live = {"model": trainer.module.state_dict(),
            "optimizers": [opt.state_dict() for opt in trainer.optimizers],
            "lr_schedulers": [s["scheduler"].state_dict() for s in trainer.lr_schedulers],
            "loop": dict(trainer.loop_state, global_step=trainer.global_step), "plugins": {},
            **checkpoint_entries(trainer.module, MODULE_KEYS)}
    if trainer.datamodule is not None:
        live.update(checkpoint_entries(trainer.datamodule, DATAMODULE_KEYS))
    return live


def _view(checkpoint: dict[str, Any], epoch: int) -> dict[str, Any]:
    loop = checkpoint.get("loop") or {}
    plugins = checkpoint.get("plugins") or {}
    callbacks = checkpoint.get("callbacks")
    if not isinstance(callbacks, dict):
        callbacks = {k: v for k, v in plugins.items() if k != MODULE_PLUGIN}
    view: dict[str, Any] = {
        "epoch": epoch, "global_step": int(loop.get("global_step", 0)),
        "pytorch-lightning_version": _lightning_version(),
        "state_dict": dict(checkpoint["model"]), "loops": dict(loop), "callbacks": callbacks,
        "optimizer_states": list(checkpoint.get("optimizers") or []),
        "lr_schedulers": list(checkpoint.get("lr_schedulers") or [])}
    for key in ("hyper_parameters", "hparams_name", "datamodule_hyper_parameters",
                "datamodule_hparams_name"):
        if checkpoint.get(key):
            view[key] = checkpoint[key]
    if "datamodule_state" in checkpoint:  # Lightning keeps it under the class's name
        qualname = str(checkpoint.get("datamodule_class", "")).rpartition(":")[2]
        view[qualname or "datamodule"] = checkpoint["datamodule_state"]
    return view


def checkpoint_view(trainer: Trainer, checkpoint: dict[str, Any] | None) -> dict[str, Any]:
    """The checkpoint being saved as a Lightning ``on_save_checkpoint(checkpoint)`` reads it:
    Lightning's keys (``state_dict``, ``optimizer_states``, ``lr_schedulers``, ``epoch``,
    ``global_step``, ``callbacks``, ``loops`` (ptrain's loop state), ``hyper_parameters``,
    the datamodule's state under its class name, ``pytorch-lightning_version``), each holding
    ptrain's own entry (a new dict or list around the same tensors, so that changing one
    changes nothing saved). What a hook adds under a new key is saved for it."""
    if checkpoint is None:
        return _view(_live_checkpoint(trainer), trainer.current_epoch)
    return _view(checkpoint, trainer.current_epoch)


def loaded_checkpoint_view(checkpoint: dict[str, Any] | None, added: dict[str, Any] | None,
                           trainer: Trainer | None = None) -> dict[str, Any]:
    """A loaded checkpoint as Lightning's ``on_load_checkpoint(checkpoint)`` reads it (see
    :func:`checkpoint_view`), with what the module's ``on_save_checkpoint`` added (``added``;
    ``None``: read from the checkpoint)."""
    if checkpoint is None:
        view = _view(_live_checkpoint(trainer), trainer.current_epoch)
    else:
        loop = checkpoint.get("loop") or {}
        epoch = checkpoint["epoch"] if isinstance(checkpoint.get("epoch"), int) else \
            _epoch_of(loop)
        view = _view(checkpoint, epoch)
        if added is None:
            added = (checkpoint.get("plugins") or {}).get(MODULE_PLUGIN)
    view.update(added or {})
    return view


def _warn_changed(where: str, view: dict[str, Any], before: dict[str, Any],
                  weights: dict[str, Any]) -> None:
    """Say once per hook that a change it made to Lightning's own keys is not saved."""
    changed = [k for k, v in before.items() if k not in view or view[k] is not v]
    state = view.get("state_dict")
    if "state_dict" not in changed and (state.keys() != weights.keys() or any(
            state[k] is not v for k, v in weights.items())):
        changed.append("state_dict")
    if not changed or where in _WARNED:
        return
    _WARNED.add(where)
    warnings.warn(
        f"{where} changed checkpoint[{', '.join(map(repr, changed))}]; ptrain saves the run's "
        f"own weights, optimizer and loop state, so that every checkpoint resumes exactly, and "
        f"this change is not written. Put what you want kept under a new key (it comes back "
        f"in on_load_checkpoint).", stacklevel=3)


def check_removed_methods(obj: Any, base: type | None, removed: dict[str, str], stop: bool,
                          error: type[Exception]) -> None:
    """Refuse (``stop``: ``error``) or warn about ``obj``'s methods named in ``removed``: hooks
    of Lightning 1.x that Lightning 2 no longer calls (a module's or a callback's, see
    :data:`REMOVED_MODULE_METHODS`), so their code would never run. The message names where
    each one's code goes now."""
    names = overridden(obj, removed, base)
    if not names:
        return
    owner = type(obj).__qualname__
    if len(names) == 1:
        message = (f"{owner}.{names[0]} is a hook of Lightning 1.x that Lightning 2 no longer "
                   f"calls, so its code would never run: move it to {removed[names[0]]}.")
    else:
        moves = "; ".join(f"{name} -> {removed[name]}" for name in names)
        message = (f"{' and '.join(f'{owner}.{name}' for name in names)} are hooks of Lightning "
                   f"1.x that Lightning 2 no longer calls, so their code would never run: move "
                   f"it ({moves}).")
    if stop:
        raise error(message)
    warnings.warn(f"{message} Lightning runs such a program without calling "
                  f"{'it' if len(names) == 1 else 'them'}; so does ptrain.lightning.",
                  stacklevel=2)


def adapt_callbacks(callbacks: list[Any], name: str, stop: bool = True) -> list[Any]:
    """``callbacks`` with the callbacks written with Lightning's method names (see
    :func:`is_hook_method_callback`) replaced by one plugin calling them in list order, named
    ``name``; names and plugin objects stay as they are. A method Lightning 2 no longer calls
    is refused (``stop``) or warned about (:func:`check_removed_methods`), and a callback with
    no other method takes no part. A plain object that implements ptrain hooks and has
    Lightning's method names too is refused (:func:`check_plugin_callback`)."""
    for callback in callbacks:
        check_plugin_callback(callback)
    methods = [c for c in callbacks if is_hook_method_callback(c)]
    if not methods:
        return list(callbacks)
    for callback in methods:
        check_removed_methods(callback, _callback_base(callback), REMOVED_CALLBACK_METHODS, stop,
                              PluginError)
    called = [c for c in methods if lightning_methods(c)]
    return [c for c in callbacks if not any(c is m for m in methods)] + \
        ([callback_hook_plugin(called, name)] if called else [])


def check_plugin_callback(obj: Any) -> None:
    """Refuse (:class:`PluginError`) ``obj``, a callback that is not a :class:`Callback`, when
    it implements ptrain hooks and also has unmarked methods named like Lightning's callback
    methods: it is registered as a plugin, whose hooks are its marked methods only, so those
    would never be called. (A :class:`Callback` subclass runs both kinds; on another object a
    name such as ``setup`` or ``on_train_batch_end`` may mean either.) Left out: names its
    ``not_ptrain_hooks`` attribute declares (helpers), and a name whose ptrain hook a marked
    method implements (``@hookimpl(specname="setup")`` beside a Lightning ``setup`` the object
    calls itself, as ``ptrain.lightning``'s ``ModelCheckpoint``)."""
    from ptrain.loading import HOOK_NAMES, IMPL_MARK, declared_not_hooks

    if isinstance(obj, (str, Callback)) or inspect.isclass(obj) or inspect.ismodule(obj) or \
            not implements_ptrain_hooks(obj):
        return
    skip = declared_not_hooks(obj)
    for base in type(obj).__mro__:
        for attribute, value in vars(base).items():
            if _marked(value):
                mark = getattr(getattr(value, "__func__", value), IMPL_MARK, None) or {}
                skip.add(mark.get("specname") or attribute)
    names = [name for name in lightning_methods(obj) if name not in skip]
    if not names:
        return
    owner = type(obj).__qualname__
    listed = ", ".join(f"{owner}.{name}" for name in names)
    one = len(names) == 1
    hooks = [name for name in names if name in HOOK_NAMES]
    marking = (f"; if {' or '.join(hooks)} is meant as the ptrain hook, mark it @ptrain.hookimpl"
               if hooks else "")
    raise PluginError(
        f"callback {owner} implements ptrain hooks (methods marked @ptrain.hookimpl) and has "
        f"{'a method' if one else 'methods'} named like Lightning's callback methods ({listed}) "
        f"without the mark: ptrain registers such an object as a plugin, whose hooks are its "
        f"marked methods, so it would never call {'it' if one else 'them'}. Derive {owner} from "
        f"ptrain.lightning.Callback (ptrain.hook_methods.Callback under ptrain.Trainer), which "
        f"calls both kinds where each belongs{marking}; or, for a helper, rename it (or name it "
        f"in the class's attribute `not_ptrain_hooks`).")


def module_plugins(module: Any, base: type, stop: bool = True) -> list[Any]:
    """The plugins a module brings to a run: the one calling its hook methods, then the
    callbacks its ``configure_callbacks()`` returns (those with Lightning's method names
    adapted). ``stop``: whether a hook Lightning 2 no longer calls is refused or warned about
    (:func:`check_removed_methods`)."""
    plugins = []
    own = module_hook_plugin(module, base, stop)
    if own is not None:
        plugins.append(own)
    configured = module.configure_callbacks()
    if configured is None:
        configured = []
    elif not isinstance(configured, (list, tuple)):
        configured = [configured]
    for entry in configured:
        if isinstance(entry, str) or inspect.isclass(entry):
            raise ModelError(f"{type(module).__qualname__}.configure_callbacks returned "
                             f"{entry!r}; return callback objects (instances).")
    plugins.extend(adapt_callbacks(list(configured), "module-callbacks", stop))
    return plugins


def is_hook_method_callback(obj: Any) -> bool:
    """Whether ``obj`` is a callback written with Lightning's method names rather than
    ``@ptrain.hookimpl`` (it has no hook implementation, and at least one such method; for a
    :class:`Callback`, a method of Lightning 1.x counts: ``on_epoch_end`` there is Lightning's,
    where on another object it may be a ptrain hook without its mark)."""
    if inspect.isclass(obj) or inspect.ismodule(obj):
        return False
    if implements_ptrain_hooks(obj):
        return False
    base = _callback_base(obj)
    return bool(overridden(obj, CALLBACK_METHODS, base)) or (
        base is not None and bool(overridden(obj, REMOVED_CALLBACK_METHODS, base)))


def _callback_base(obj: Any) -> type | None:
    return Callback if isinstance(obj, Callback) else None


#: the prefix of the attributes under which a :class:`Callback` carries its Lightning methods'
#: hook implementations
_CARRIED = "_lightning_"


def _marked(value: Any) -> bool:
    """Whether ``value`` (a function, or a staticmethod or classmethod) is marked
    ``@ptrain.hookimpl``."""
    from ptrain.loading import IMPL_MARK

    return hasattr(getattr(value, "__func__", value), IMPL_MARK) or hasattr(value, IMPL_MARK)


def _implements_ptrain_hooks(cls: type) -> bool:
    """Whether ``cls`` (or a base) has a method marked ``@ptrain.hookimpl``."""
    return any(_marked(value) for base in cls.__mro__ for value in vars(base).values())


def implements_ptrain_hooks(obj: Any) -> bool:
    """Whether ``obj`` has a method marked ``@ptrain.hookimpl``, public or private (a
    ``specname``): in its class, or set on the object itself (the implementations a
    :class:`Callback` carries for its Lightning methods do not count)."""
    own = getattr(obj, "__dict__", None)
    own = own if isinstance(own, dict) else {}
    return _implements_ptrain_hooks(type(obj)) or any(
        _marked(value) for key, value in own.items() if not key.startswith(_CARRIED))


def state_key(callback: Any) -> str:
    """The key a callback's state is saved under: its ``state_key`` (Lightning's), else its
    class's qualified name."""
    key = getattr(callback, "state_key", None)
    return key if isinstance(key, str) else type(callback).__qualname__


#: the dispatch entry, at each stage's start before any ``setup``, that hands the callbacks
#: without a ``log`` of their own the module's ``log`` and ``log_dict`` (:func:`_attach_logging`)
ATTACH_LOGGING = "<attach logging>"


def _attach_logging(callback: Any, trainer: Trainer, *args: Any, **kwargs: Any) -> None:
    """Lightning's callbacks log with ``self.log``/``self.log_dict``: the stage's module's
    methods, which the trainer sets on each callback when a stage starts."""
    callback.log = trainer.module.log
    callback.log_dict = trainer.module.log_dict


def callback_hook_plugin(callbacks: list[Any], name: str) -> Any:
    """One plugin calling the Lightning-named methods of ``callbacks``, in list order, each as
    ``method(trainer, trainer.module, ...)``. Their ``state_dict()`` and what
    ``on_save_checkpoint`` adds to the checkpoint it is given (Lightning's layout, see
    :func:`checkpoint_view`) are saved per callback (under :func:`state_key`) and handed back
    on resume."""
    dispatch = _Dispatch()
    hooks: set[str] = set()
    keyed: list[tuple[str, Any]] = []  # the callbacks with a state method, under their keys
    stateful: set[str] = set()
    for callback in callbacks:
        if getattr(type(callback), "log", None) is None:
            dispatch.add(ATTACH_LOGGING, functools.partial(_attach_logging, callback))
        if any(_defines(callback, m) for m in STATE_METHODS):
            key = state_key(callback)
            # only a state_dict needs a key of its own (Lightning's rule): what the checkpoint
            # methods add is one checkpoint's keys, which every callback sees on resume
            if _defines(callback, "state_dict") or _defines(callback, "load_state_dict"):
                if key in stateful:
                    raise PluginError(f"two callbacks of this run save their state under "
                                      f"{key!r}; give one a distinct `state_key` property.")
                stateful.add(key)
            keyed.append((key, callback))
        for method_name in lightning_methods(callback):
            if method_name in STATE_METHODS:
                hooks.add(CALLBACK_METHODS[method_name])
                continue
            if method_name == "on_validation_end":
                # after a validation (the sanity check's aside) a callback's on_validation_end
                # runs before the checkpoint callback saves (trylast), which then holds the
                # state it left, as Lightning runs its checkpoint callbacks last
                hooks.add("on_validation_end")
            method = getattr(callback, method_name)
            dispatch.add(method_name, lambda trainer, *args, _m=method, **kwargs:
                         _m(trainer, trainer.module, *args, **kwargs))
            hooks.add(CALLBACK_METHODS[method_name])
    if hooks & {"state_dict", "load_state_dict"}:
        hooks |= {"state_dict", "load_state_dict"}
    if hooks and dispatch.has(ATTACH_LOGGING):
        hooks.add("on_stage_start")

    def states(trainer: Trainer, checkpoint: dict[str, Any] | None) -> dict[str, Any] | None:
        saved: dict[str, dict[str, Any]] = {}
        view = None  # one checkpoint for all of them, as in Lightning
        for key, callback in keyed:
            entry: dict[str, Any] = {}
            if _defines(callback, "state_dict"):
                entry["state"] = callback.state_dict()
            if _defines(callback, "on_save_checkpoint"):
                if view is None:
                    view = checkpoint_view(trainer, checkpoint)
                    before, weights = dict(view), dict(view["state_dict"])
                known = set(view)
                callback.on_save_checkpoint(trainer, trainer.module, view)
                entry["checkpoint"] = {k: v for k, v in view.items() if k not in known}
            if entry:
                shared = saved.setdefault(key, {})  # a key's second callback adds its keys
                shared.setdefault("checkpoint", {}).update(entry.pop("checkpoint", {}))
                shared.update(entry)
                if not shared["checkpoint"]:
                    del shared["checkpoint"]
        if view is not None:
            _warn_changed(f"{name}'s on_save_checkpoint", view, before, weights)
        return saved or None

    def load(trainer: Trainer, state: dict[str, Any], checkpoint: dict[str, Any] | None) -> None:
        view = None
        for key, callback in keyed:
            entry = state.get(key)
            if entry is None:
                continue
            if _defines(callback, "on_load_checkpoint"):
                if view is None:
                    view = loaded_checkpoint_view(checkpoint, {}, trainer)
                    for other in state.values():
                        view.update(other.get("checkpoint", {}))
                callback.on_load_checkpoint(trainer, trainer.module, view)
            if "state" in entry and _defines(callback, "load_state_dict"):
                callback.load_state_dict(entry["state"])

    plugin = _plugin_class(name, hooks, dispatch, "callbacks", states=states, load=load)
    plugin.lightning_callbacks = list(callbacks)  # the objects, for Lightning's trainer.callbacks
    return plugin


class StepClosure:
    """The ``optimizer_closure`` a module's ``optimizer_step`` override receives. In ptrain the
    batch's training step and backward have run when the override is called; calling the
    closure returns that batch's loss (detached), as Lightning's returns the loss it
    computes."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.called = False

    def __call__(self) -> Any:
        self.called = True
        window = self.trainer.loss_window
        return window[-1][3] if window else None


class StepOptimizer:
    """The optimizer a module's ``optimizer_step`` override receives (Lightning's
    ``LightningOptimizer``): ``step(closure=None)`` calls the closure, then steps through the
    run's ``optimizer_step`` hook (the precision's scaler, the strategy); everything else is the
    optimizer's own (``param_groups``, ``state``, ``zero_grad``; ``.optimizer`` is the
    optimizer itself)."""

    def __init__(self, trainer: Trainer, optimizer: Any):
        self.trainer = trainer
        self.optimizer = optimizer

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        if kwargs:
            raise ModelError(f"optimizer.step({', '.join(kwargs)}=...) inside optimizer_step: "
                             f"ptrain steps through the run's optimizer_step hook, which takes "
                             f"no arguments; pass only closure=optimizer_closure.")
        loss = closure() if closure is not None else None
        self.trainer.step_hooks.optimizer_step(trainer=self.trainer, optimizer=self.optimizer)
        return loss

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


def lightning_methods(callback: Any, names: Any = CALLBACK_METHODS) -> list[str]:
    """The names among ``names`` that ``callback`` defines as Lightning's methods: overridden
    (see :func:`overridden`) and not marked ``@ptrain.hookimpl`` (a marked ``setup`` is the
    ptrain hook, called as such, never as Lightning's)."""
    return [name for name in overridden(callback, names, _callback_base(callback))
            if not _marked(inspect.getattr_static(callback, name))]


def _defines(callback: Any, name: str) -> bool:
    return bool(lightning_methods(callback, (name,)))


class ModuleHookMethods:
    """The hook methods of :class:`ptrain.TrainModule`, all doing nothing: override those you
    need (``super()`` calls are fine). Each is called where Lightning calls the method of the
    same name; see :mod:`ptrain.hook_methods` for the ptrain hook behind each."""

    def setup(self, stage: str) -> None:
        """Called in every process at the start of each stage (``"fit"``, ``"validate"``,
        ``"test"``, ``"predict"``), after ``prepare_data`` and the datamodule's ``setup``,
        before the model is wrapped and the optimizers are configured."""

    def teardown(self, stage: str) -> None:
        """Called in every process at the end of each stage, also after an error."""

    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_validation_start(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...

    def on_train_epoch_end(self) -> None:
        """After the epoch's last batch and its validation; a value logged here
        (``on_epoch=True``) is published with the epoch's metrics."""

    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_before_backward(self, loss: Any) -> None: ...

    def backward(self, loss: Any, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``loss`` (``loss.backward(*args, **kwargs)``; the arguments are those
        given to :meth:`manual_backward`). Once overridden, the run's ``backward`` hook calls
        it on every backward pass, with the loss as the precision plugin hands it over."""
        loss.backward(*args, **kwargs)

    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: Any) -> None: ...

    def on_validation_model_zero_grad(self) -> None:
        """Before each validation within ``fit``: release the gradients (``zero_grad``)."""
        self.zero_grad()

    def on_validation_model_eval(self) -> None:
        """At the start of each validation pass: put the model in eval mode. Every
        submodule's own mode is restored after the pass (before ``on_validation_end``)."""
        self.trainer.model.eval()

    def on_validation_model_train(self) -> None:
        """After each validation pass, once the modes the model had are restored (Lightning
        calls it instead of restoring them): change them here. Called only when
        overridden."""
        self.trainer.model.train()

    def on_test_model_eval(self) -> None:
        """At the start of each test pass: put the model in eval mode."""
        self.trainer.model.eval()

    def on_test_model_train(self) -> None:
        """After each test pass, once the modes the model had are restored; called only when
        overridden."""
        self.trainer.model.train()

    def on_predict_model_eval(self) -> None:
        """At the start of each prediction pass: put the model in eval mode."""
        self.trainer.model.eval()

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch before it moves to the device (in the dataloader's process);
        return it."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
        """Move a batch to ``device`` and return it (the tensors in it, through lists, tuples
        and dicts). Override it for a batch type of your own; once it is overridden, or one of
        the two hooks around it, the run moves every batch with it."""
        from ptrain.data import move_to_device

        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch once it is on the device (GPU augmentation); return it."""
        return batch

    def on_before_zero_grad(self, optimizer: Any) -> None:
        """After each optimizer step, before its gradients are set to ``None``."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add entries to ``checkpoint`` (plain values and tensors); they come back in
        :meth:`on_load_checkpoint` on resume."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Read back what :meth:`on_save_checkpoint` stored (after the weights are loaded)."""

    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Clip ``optimizer``'s gradients before each of its steps; called with the trainer's
        ``gradient_clip_val``/``gradient_clip_algorithm`` on every step once overridden. The
        default clips with them (``self.clip_gradients``); an override decides itself."""
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any,
                       optimizer_closure: Callable[[], Any] | None = None) -> None:
        """Step ``optimizer`` at the end of each accumulation window (automatic optimization
        only). Override it to act around the step (a learning-rate warm-up, say); call
        ``optimizer.step(closure=optimizer_closure)``, which steps through the run's
        precision and strategy plugins. When it is called, the batch's training step and
        backward have run and its gradients are clipped (in Lightning they run inside the
        closure); ``optimizer_closure()`` returns the batch's loss."""
        optimizer.step(closure=optimizer_closure)

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step ``scheduler`` at its interval; ``metric`` is its monitored value (a tensor), or
        ``None`` without a monitor. Override it for a scheduler whose ``step`` takes other
        arguments (``scheduler.step(epoch=self.current_epoch)``)."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def configure_callbacks(self) -> Any:
        """Callbacks this model needs (one or a list; plugin objects or Lightning-style
        callbacks). One named like a callback the trainer has (its ``name``, or a
        ``ModelCheckpoint``) replaces that one for the run."""
        return []


class Callback:
    """A callback written with Lightning's method names and ``(trainer, pl_module, ...)``
    signatures, as ``ptrain.lightning.Callback``: subclass it (or write any object with such
    methods) and pass it in ``callbacks``; no ``@ptrain.hookimpl`` is needed. Each method runs
    where Lightning runs it (see :mod:`ptrain.hook_methods`); ``trainer`` is the ptrain
    :class:`~ptrain.Trainer` and ``pl_module`` the :class:`~ptrain.TrainModule`.

    A subclass may also implement ptrain hooks (``@ptrain.hookimpl``): ptrain then registers
    the object as a plugin, as it is, and both kinds of method are called. For that, each object
    of such a class carries, as its own attributes, the adapter's hook implementations for the
    Lightning methods its class defines (:func:`callback_hook_plugin`), under private names
    (``_lightning_<hook>``, marked with the hook's ``specname``); they are left out of its
    pickled state and made again when it is unpickled."""

    #: Lightning's methods, some named like ptrain hooks (``setup``, ``state_dict``, ...): they
    #: are called through an adapter (:func:`callback_hook_plugin`), not as ptrain hooks, so a
    #: subclass that also has ``@ptrain.hookimpl`` methods is not warned that they lack the mark
    not_ptrain_hooks = tuple(CALLBACK_METHODS)

    def __new__(cls, *args: Any, **kwargs: Any) -> Callback:
        self = super().__new__(cls)
        if _implements_ptrain_hooks(cls):
            self._carry_lightning_methods()
        return self

    def _carry_lightning_methods(self) -> None:
        from ptrain.loading import HOOK_NAMES, IMPL_MARK

        adapter = callback_hook_plugin([self], type(self).__name__)
        for hook in HOOK_NAMES:
            function = getattr(adapter, hook, None)
            if function is not None and isinstance(getattr(function, IMPL_MARK, None), dict):
                setattr(function, IMPL_MARK, {**getattr(function, IMPL_MARK), "specname": hook})
                self.__dict__[_CARRIED + hook] = function

    def __getstate__(self) -> dict[str, Any]:
        # the carried implementations are closures, made again when the object is (unpickling
        # calls __new__); the module's log methods a stage handed it are handed again
        return {k: v for k, v in self.__dict__.items()
                if not k.startswith(_CARRIED) and k not in ("log", "log_dict")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def state_key(self) -> str:
        """The key this callback's state is saved under (its class name)."""
        return type(self).__qualname__

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None: ...
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None: ...
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None: ...
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None: ...
    def on_fit_end(self, trainer: Any, pl_module: Any) -> None: ...
    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None: ...
    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None: ...
    def on_train_start(self, trainer: Any, pl_module: Any) -> None: ...
    def on_train_end(self, trainer: Any, pl_module: Any) -> None: ...
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None: ...
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None: ...
    def on_test_start(self, trainer: Any, pl_module: Any) -> None: ...
    def on_test_end(self, trainer: Any, pl_module: Any) -> None: ...
    def on_predict_start(self, trainer: Any, pl_module: Any) -> None: ...
    def on_predict_end(self, trainer: Any, pl_module: Any) -> None: ...
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None: ...
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None: ...
    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None: ...
    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None: ...
    def on_test_epoch_start(self, trainer: Any, pl_module: Any) -> None: ...
    def on_test_epoch_end(self, trainer: Any, pl_module: Any) -> None: ...
    def on_predict_epoch_start(self, trainer: Any, pl_module: Any) -> None: ...
    def on_predict_epoch_end(self, trainer: Any, pl_module: Any) -> None: ...
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None: ...
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None: ...
    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                                  batch_idx: int) -> None: ...
    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                                batch_idx: int) -> None: ...
    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                            batch_idx: int) -> None: ...
    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                          batch_idx: int) -> None: ...
    def on_predict_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                               batch_idx: int) -> None: ...
    def on_predict_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                             batch_idx: int) -> None: ...
    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None: ...
    def on_after_backward(self, trainer: Any, pl_module: Any) -> None: ...
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None: ...
    def on_before_zero_grad(self, trainer: Any, pl_module: Any, optimizer: Any) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...
    def on_save_checkpoint(self, trainer: Any, pl_module: Any,
                           checkpoint: dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, trainer: Any, pl_module: Any,
                           checkpoint: dict[str, Any]) -> None: ...
