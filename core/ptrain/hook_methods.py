"""Hook *methods*: a module's or a plain callback object's methods named like Lightning's hooks
(``on_train_epoch_end``, ``on_validation_batch_start``, ...), called at the points those names
mean through ptrain's own hooks.

A :class:`TrainModule` defines them as no-op methods (see :class:`ModuleHookMethods`); a module
that overrides some gets, for each run, one plugin (:func:`module_hook_plugin`) implementing just
the ptrain hooks those methods need. A callback object without ``@ptrain.hookimpl`` methods whose
methods carry Lightning's callback names (``(trainer, pl_module, ...)`` signatures) is adapted the
same way (:func:`callback_hook_plugin`). The set of methods is found once, when the run starts:
a method nobody overrides costs nothing per step, since its ptrain hook is then not implemented
at all.

Where each method fires (ptrain hook -> methods, in this order):

- ``on_loop_start(loop)``: ``on_fit_start``, ``on_sanity_check_start`` (callbacks),
  ``on_train_start``, ``on_{validation,test,predict}_start`` then ``..._epoch_start``
- ``on_loop_end(loop)``: ``on_fit_end``, ``on_sanity_check_end``, ``on_train_end``,
  ``on_{validation,test,predict}_end``
- ``on_epoch_start``: ``on_train_epoch_start``; ``on_epoch_metrics(stage)``:
  ``on_{train,validation,test,predict}_epoch_end`` (a value logged there joins the epoch's)
- ``on_batch_start(stage)``: ``on_{train,validation,test,predict}_batch_start``;
  ``on_train_batch_end``, ``on_evaluation_batch_end``: ``on_..._batch_end``
- ``on_before_backward``, ``on_after_backward``, ``on_before_optimizer_step``,
  ``on_before_zero_grad``: the methods of the same names
- ``state_dict``/``load_state_dict``: ``on_save_checkpoint``/``on_load_checkpoint`` (and a
  callback's own ``state_dict``/``load_state_dict``)
- ``setup``/``teardown`` (callbacks; a module's ``setup``/``teardown`` are called by the trainer
  around the stage, before the model is wrapped), ``on_exception`` before ``teardown``.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable

from ptrain.errors import ModelError, PluginError
from ptrain.hookspecs import PROJECT_NAME

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
EPOCH_END = {stage: f"on_{word}_epoch_end" for stage, word in STAGE_WORDS.items()}
BATCH_START = {stage: f"on_{word}_batch_start" for stage, word in STAGE_WORDS.items()}
BATCH_END = {stage: f"on_{word}_batch_end" for stage, word in STAGE_WORDS.items()}
STEP_METHODS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step",
                "on_before_zero_grad")
CHECKPOINT_METHODS = ("on_save_checkpoint", "on_load_checkpoint")
#: a callback defining one of these has state saved in checkpoints (under its state_key)
STATE_METHODS = ("state_dict", "load_state_dict") + CHECKPOINT_METHODS

#: every method name this module calls -> the ptrain hook that calls it
METHOD_HOOKS: dict[str, str] = {
    **{m: "on_loop_start" for ms in LOOP_START.values() for m in ms},
    **{m: "on_loop_end" for ms in LOOP_END.values() for m in ms},
    "on_train_epoch_start": "on_epoch_start",
    **{m: "on_epoch_metrics" for m in EPOCH_END.values()},
    **{m: "on_batch_start" for m in BATCH_START.values()},
    "on_train_batch_end": "on_train_batch_end",
    **{m: "on_evaluation_batch_end" for s, m in BATCH_END.items() if s != "train"},
    **{m: m for m in STEP_METHODS},
    "on_save_checkpoint": "state_dict", "on_load_checkpoint": "load_state_dict",
    "configure_gradient_clipping": "clip_gradients",
    "optimizer_step": "optimizer_step",
}
#: methods only a callback object has (a module's setup/teardown are called by the trainer)
CALLBACK_ONLY = {"setup": "setup", "teardown": "teardown", "on_exception": "teardown",
                 "state_dict": "state_dict", "load_state_dict": "load_state_dict"}
CALLBACK_METHODS = {**METHOD_HOOKS, **CALLBACK_ONLY}
MODULE_METHODS = {m: h for m, h in METHOD_HOOKS.items() if m != "on_sanity_check_start"
                  and m != "on_sanity_check_end"}
CALLBACK_METHODS.pop("configure_gradient_clipping")  # a module's only
CALLBACK_METHODS.pop("optimizer_step")

#: Lightning module hooks ptrain does not call, with what to do instead: a module overriding one
#: is refused at the start of the run rather than silently not called.
UNSUPPORTED_MODULE_METHODS = {
    "on_validation_model_eval": "the module is put in eval mode for every evaluation pass; "
                                "change modes in on_validation_start/on_validation_end",
    "on_validation_model_train": "the module's own modes are restored after every evaluation "
                                 "pass; change them in on_validation_end",
    "on_validation_model_zero_grad": "gradients are cleared right after each optimizer step",
    "on_test_model_eval": "change modes in on_test_start", "on_test_model_train":
    "change modes in on_test_end", "on_predict_model_eval": "change modes in on_predict_start",
    "configure_sharded_model": "create the layers in configure_model",
    "optimizer_zero_grad": "gradients are set to None right after each step; use "
                           "on_before_zero_grad to act before",
    "backward": "write a plugin implementing the backward hook",
    "transfer_batch_to_device": "write a plugin implementing the transfer_batch hook",
    "on_before_batch_transfer": "transform the batch in the dataset or collate_fn",
    "on_after_batch_transfer": "transform the batch at the start of training_step",
}


def overridden(obj: Any, names: dict[str, str], base: type | None) -> list[str]:
    """The names among ``names`` that ``obj`` defines as methods other than ``base``'s."""
    found = []
    for name in names:
        method = getattr(type(obj), name, None)
        if method is None or not callable(method):
            continue
        if base is not None and getattr(base, name, None) is method:
            continue
        found.append(name)
    return found


class _Dispatch:
    """The bound methods of one or more targets, by method name, each taking
    ``(trainer, *args)``: for a callback, ``method(trainer, trainer.module, *args)``; for a
    module, ``method(*args)``."""

    def __init__(self) -> None:
        self.methods: dict[str, list[Callable[..., Any]]] = {}

    def add(self, name: str, function: Callable[..., Any]) -> None:
        self.methods.setdefault(name, []).append(function)

    def call(self, name: str, trainer: Trainer, *args: Any) -> None:
        for function in self.methods.get(name, ()):
            result = function(trainer, *args)
            if name == "on_train_batch_start" and isinstance(result, int) and result == -1:
                raise ModelError(
                    "on_train_batch_start returned -1, which in Lightning ends the epoch early; "
                    "ptrain does not skip batches that way. Set trainer.should_stop = True to "
                    "stop training, or limit the batches with limit_train_batches.")


def _plugin_class(name: str, hooks: set[str], dispatch: _Dispatch, trylast: bool,
                  states: Callable[[Trainer], dict[str, Any] | None] | None = None,
                  load: Callable[[Trainer, dict[str, Any]], None] | None = None) -> Any:
    """An object implementing exactly ``hooks`` of the ptrain specification by calling
    ``dispatch``'s methods (its class is made per run, so nothing else is implemented)."""
    mark = _hookimpl(trylast=trylast)

    def on_loop_start(trainer, loop):
        for method in LOOP_START[loop]:
            dispatch.call(method, trainer)

    def on_loop_end(trainer, loop):
        for method in LOOP_END[loop]:
            dispatch.call(method, trainer)

    def on_epoch_start(trainer):
        dispatch.call("on_train_epoch_start", trainer)

    def on_epoch_metrics(trainer, stage):
        dispatch.call(EPOCH_END[stage], trainer)

    def on_batch_start(trainer, stage, batch, batch_idx):
        dispatch.call(BATCH_START[stage], trainer, batch, batch_idx)

    def on_train_batch_end(trainer, batch, batch_idx, loss):
        outputs = None if loss is None else {"loss": loss}
        dispatch.call("on_train_batch_end", trainer, outputs, batch, batch_idx)

    def on_evaluation_batch_end(trainer, stage, outputs, batch, batch_idx):
        dispatch.call(BATCH_END[stage], trainer, outputs, batch, batch_idx)

    def on_before_backward(trainer, loss):
        dispatch.call("on_before_backward", trainer, loss)

    def on_after_backward(trainer):
        dispatch.call("on_after_backward", trainer)

    def on_before_optimizer_step(trainer, optimizer):
        dispatch.call("on_before_optimizer_step", trainer, optimizer)

    def on_before_zero_grad(trainer, optimizer):
        dispatch.call("on_before_zero_grad", trainer, optimizer)

    def setup(trainer, stage):
        dispatch.call("setup", trainer, stage)

    def teardown(trainer, stage):
        if trainer.exception is not None:
            dispatch.call("on_exception", trainer, trainer.exception)
        dispatch.call("teardown", trainer, stage)

    inside_clip: list[bool] = []
    inside_step: list[bool] = []

    def clip_gradients(trainer, optimizer):
        if inside_clip:  # the module's own clip_gradients call: the next implementation clips
            return None
        inside_clip.append(True)
        try:
            dispatch.call("configure_gradient_clipping", trainer, optimizer,
                          trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
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

    def state_dict(trainer):
        return states(trainer)

    def load_state_dict(trainer, state):
        load(trainer, state)

    functions = {f.__name__: f for f in (
        on_loop_start, on_loop_end, on_epoch_start, on_epoch_metrics, on_batch_start,
        on_train_batch_end, on_evaluation_batch_end, on_before_backward, on_after_backward,
        on_before_optimizer_step, on_before_zero_grad, setup, teardown, state_dict,
        load_state_dict, clip_gradients, optimizer_step)}
    namespace = {hook: staticmethod(mark(functions[hook])) for hook in hooks}
    if "clip_gradients" in hooks:  # it decides on every step, before any other clipping
        namespace["clip_gradients"] = staticmethod(_hookimpl(tryfirst=True)(clip_gradients))
        namespace["clips_every_step"] = True
    if "optimizer_step" in hooks:  # the module's method decides; its optimizer.step() steps
        namespace["optimizer_step"] = staticmethod(_hookimpl(tryfirst=True)(optimizer_step))
    namespace["name"] = name
    return type("HookMethods", (), namespace)()


def module_hook_plugin(module: Any, base: type) -> Any | None:
    """The plugin calling ``module``'s overridden hook methods (those ``base``, the
    :class:`TrainModule`, defines as no-ops), or ``None`` when it overrides none. Its
    implementations are ``trylast``, so they run after the callbacks' (Lightning's order). A
    Lightning hook ptrain does not call is a :class:`ModelError` naming what to do instead."""
    unsupported = [m for m in UNSUPPORTED_MODULE_METHODS if callable(getattr(module, m, None))]
    if unsupported:
        name = unsupported[0]
        raise ModelError(f"{type(module).__qualname__}.{name} is a Lightning hook that ptrain "
                         f"does not call, so it would be silently ignored: "
                         f"{UNSUPPORTED_MODULE_METHODS[name]}.")
    names = overridden(module, MODULE_METHODS, base)
    if not names:
        return None
    dispatch = _Dispatch()
    for name in names:
        method = getattr(module, name)
        dispatch.add(name, lambda trainer, *args, _m=method: _m(*args))
    hooks = {MODULE_METHODS[n] for n in names}

    def states(trainer: Trainer) -> dict[str, Any] | None:
        checkpoint: dict[str, Any] = {}
        module.on_save_checkpoint(checkpoint)
        return checkpoint or None

    def load(trainer: Trainer, state: dict[str, Any]) -> None:
        module.on_load_checkpoint(state)

    return _plugin_class("module-hooks", hooks, dispatch, trylast=True, states=states, load=load)


def adapt_callbacks(callbacks: list[Any], name: str) -> list[Any]:
    """``callbacks`` with the callbacks written with Lightning's method names (see
    :func:`is_hook_method_callback`) replaced by one plugin calling them in list order, named
    ``name``; names and plugin objects stay as they are."""
    methods = [c for c in callbacks if is_hook_method_callback(c)]
    if not methods:
        return list(callbacks)
    return [c for c in callbacks if not any(c is m for m in methods)] + \
        [callback_hook_plugin(methods, name)]


def module_plugins(module: Any, base: type) -> list[Any]:
    """The plugins a module brings to a run: the one calling its hook methods, then the
    callbacks its ``configure_callbacks()`` returns (those with Lightning's method names
    adapted)."""
    plugins = []
    own = module_hook_plugin(module, base)
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
    plugins.extend(adapt_callbacks(list(configured), "module-callbacks"))
    return plugins


def is_hook_method_callback(obj: Any) -> bool:
    """Whether ``obj`` is a callback written with Lightning's method names rather than
    ``@ptrain.hookimpl`` (it has at least one, and no hook implementation)."""
    from ptrain.loading import IMPL_MARK

    if inspect.isclass(obj) or inspect.ismodule(obj):
        return False
    if any(hasattr(getattr(obj, a, None), IMPL_MARK) for a in dir(obj) if not a.startswith("_")):
        return False
    return bool(overridden(obj, CALLBACK_METHODS, _callback_base(obj)))


def _callback_base(obj: Any) -> type | None:
    return Callback if isinstance(obj, Callback) else None


def state_key(callback: Any) -> str:
    """The key a callback's state is saved under: its ``state_key`` (Lightning's), else its
    class's qualified name."""
    key = getattr(callback, "state_key", None)
    return key if isinstance(key, str) else type(callback).__qualname__


def callback_hook_plugin(callbacks: list[Any], name: str) -> Any:
    """One plugin calling the Lightning-named methods of ``callbacks``, in list order, each as
    ``method(trainer, trainer.module, ...)``. Their ``state_dict()`` and what
    ``on_save_checkpoint`` adds to the dict it is given are saved per callback (under
    :func:`state_key`) and handed back on resume."""
    dispatch = _Dispatch()
    hooks: set[str] = set()
    keys: dict[str, Any] = {}
    for callback in callbacks:
        if any(_defines(callback, m) for m in STATE_METHODS):  # only state needs a unique key
            key = state_key(callback)
            if key in keys:
                raise PluginError(f"two callbacks of this run save their state under {key!r}; "
                                  f"give one a distinct `state_key` property.")
            keys[key] = callback
        for method_name in overridden(callback, CALLBACK_METHODS, _callback_base(callback)):
            if method_name in STATE_METHODS:
                hooks.add(CALLBACK_ONLY.get(method_name) or METHOD_HOOKS[method_name])
                continue
            method = getattr(callback, method_name)
            dispatch.add(method_name, lambda trainer, *args, _m=method:
                         _m(trainer, trainer.module, *args))
            hooks.add(CALLBACK_METHODS[method_name])

    def states(trainer: Trainer) -> dict[str, Any] | None:
        saved = {}
        for key, callback in keys.items():
            entry: dict[str, Any] = {}
            if _defines(callback, "state_dict"):
                entry["state"] = callback.state_dict()
            if _defines(callback, "on_save_checkpoint"):
                checkpoint: dict[str, Any] = {}
                callback.on_save_checkpoint(trainer, trainer.module, checkpoint)
                entry["checkpoint"] = checkpoint
            if entry:
                saved[key] = entry
        return saved or None

    def load(trainer: Trainer, state: dict[str, Any]) -> None:
        for key, entry in state.items():
            callback = keys.get(key)
            if callback is None:
                continue
            if _defines(callback, "on_load_checkpoint"):
                callback.on_load_checkpoint(trainer, trainer.module, entry.get("checkpoint", {}))
            if "state" in entry and _defines(callback, "load_state_dict"):
                callback.load_state_dict(entry["state"])

    return _plugin_class(name, hooks, dispatch, trylast=False, states=states, load=load)


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


def _defines(callback: Any, name: str) -> bool:
    return bool(overridden(callback, {name: ""}, _callback_base(callback)))


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
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: Any) -> None: ...

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
    :class:`~ptrain.Trainer` and ``pl_module`` the :class:`~ptrain.TrainModule`."""

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
