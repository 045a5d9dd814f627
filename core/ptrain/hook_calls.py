"""Direct callers for the hooks that fire on every batch, and observation of every hook call.

A pluggy hook call costs about 2 µs of bookkeeping (argument checks, the generic multicall), which
on a small model is most of a trainer's overhead. For a hook without wrappers, that bookkeeping
changes nothing: the result is that of calling its implementations in pluggy's order (most
recently registered first, ``tryfirst``/``trylast`` respected) and, for a firstresult hook,
stopping at the first non-None result. :func:`direct_caller` does exactly that, and falls back to
the pluggy hook itself whenever a wrapper is registered.
The callers are built after every plugin is registered, so they see the final set.

Observation. An *observer* is any object with a method ``observe_hook_call(call)``: registered
as a plugin (``ptrain.testing.HookRecorder``), or put on the plugin manager by the core when
``PTRAIN_TRACE=1`` (:class:`StderrTracer`). Once a plugin manager has an observer, every hook call
reaches it as a :class:`HookCall` (with each implementation that ran, its time and its result):
calls through pluggy, the direct per-step calls and the per-plugin calls (``state_dict``,
``load_state_dict``) alike, because each implementation's function is replaced by a timing
wrapper and each direct caller is wrapped. All of that is decided when plugins are registered
and when the direct callers are built: without an observer, no call takes an extra branch.
``add_options`` and ``check_available`` run on plugin classes before any plugin manager
exists and are not observed.
"""

from __future__ import annotations

import inspect
import itertools
import os
import sys
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Callable, Collection, Generator

import pluggy

from ptrain.errors import ConfigError, PluginError
from ptrain.loading import bind_impl, call_per_plugin

PER_STEP_HOOKS = (
    "transfer_batch", "on_batch_start", "model_step", "on_before_backward", "backward",
    "on_after_backward", "on_before_optimizer_step", "clip_gradients", "optimizer_step",
    "on_before_zero_grad", "on_train_step_end", "on_train_batch_end", "on_evaluation_batch_end",
)
#: Per-step notifications the loop calls only when some plugin implements them (``has_NAME``),
#: so that a run without them pays not even a call.
OPTIONAL_STEP_HOOKS = ("on_batch_start", "on_before_backward", "on_after_backward",
                       "on_before_optimizer_step", "on_before_zero_grad", "on_train_step_end")
#: Set to ``1`` to print every hook call to stderr (see :class:`StderrTracer`).
TRACE_ENV = "PTRAIN_TRACE"
_TRACE_ON = ("1", "true", "yes", "on")
_TRACE_OFF = ("", "0", "false", "no", "off")
_OBSERVATION = "_ptrain_observation"  # the attribute of a plugin manager holding its Observation
_OBSERVED = "_ptrain_observed"  # marks an implementation function already wrapped for timing
_CALL_NUMBERS = itertools.count()  # start order of observed calls, across the runs of a process


def direct_caller(pm: pluggy.PluginManager, name: str,
                  skipped: Collection[str] = ()) -> Callable[..., Any]:
    """A callable with the same result as ``pm.hook.<name>(**kwargs)``, leaving out the
    implementations of the plugins named in ``skipped`` (see :func:`unused_step_hooks`)."""
    caller = _direct_caller(pm, name, skipped)
    observation = observation_of(pm)
    if observation is None or caller is getattr(pm.hook, name):  # pluggy's calls are monitored
        return caller
    return observation.observed_caller(name, caller)


def _direct_caller(pm: pluggy.PluginManager, name: str,
                   skipped: Collection[str]) -> Callable[..., Any]:
    caller = getattr(pm.hook, name)
    impls = caller.get_hookimpls()
    if any(impl.wrapper or impl.hookwrapper for impl in impls):
        return caller  # a wrapper's yield reaches every implementation: none is left out
    spec_args = tuple(caller.spec.argnames)
    functions = [bind_impl(impl, spec_args) for impl in reversed(impls)  # pluggy's call order
                 if impl.plugin_name not in skipped]
    if caller.spec.opts.get("firstresult"):
        if len(functions) == 1:
            return functions[0]

        def first_result(**kwargs: Any) -> Any:
            for function in functions:
                result = function(**kwargs)
                if result is not None:
                    return result
            return None

        return first_result

    def all_results(**kwargs: Any) -> list[Any]:
        results = []
        for function in functions:
            result = function(**kwargs)
            if result is not None:
                results.append(result)
        return results

    return all_results


def unused_step_hooks(pm: pluggy.PluginManager, trainer: Any) -> dict[str, set[str]]:
    """Per-step hook name -> the plugins that answered ``unused_step_hooks`` with it: each
    plugin asked on its own. A name that is not a per-step hook the plugin implements is a
    :class:`PluginError` (a typo would otherwise leave the hook called, silently)."""
    unused: dict[str, set[str]] = {}
    for plugin, names in call_per_plugin(pm, "unused_step_hooks", trainer=trainer).items():
        if names is None:
            continue
        if not isinstance(names, (list, tuple, set, frozenset)) or not all(
                isinstance(n, str) for n in names):
            raise PluginError(f"plugin {plugin!r}: unused_step_hooks returned {names!r}; return "
                              f"a list of hook names (or None).")
        for name in names:
            if name not in PER_STEP_HOOKS or plugin not in (
                    impl.plugin_name for impl in getattr(pm.hook, name).get_hookimpls()):
                what = ("is not a per-step hook" if name not in PER_STEP_HOOKS
                        else "is a per-step hook it does not implement")
                raise PluginError(
                    f"plugin {plugin!r}: unused_step_hooks named {name!r}, which {what}; "
                    f"name only the per-step hooks it implements "
                    f"({', '.join(PER_STEP_HOOKS)}).")
            unused.setdefault(name, set()).add(plugin)
    return unused


class StepHooks:
    """The per-step hooks of one run, as direct callers (attributes named after the hooks),
    ``has_NAME`` for each of :data:`OPTIONAL_STEP_HOOKS` (whether any implementation is called),
    and ``clips_every_step`` (whether a plugin asks ``clip_gradients`` to run on every step).
    With ``trainer``, the plugins' ``unused_step_hooks`` answers are asked and followed."""

    def __init__(self, pm: pluggy.PluginManager, trainer: Any = None):
        unused = unused_step_hooks(pm, trainer) if trainer is not None else {}
        for name in PER_STEP_HOOKS:
            setattr(self, name, direct_caller(pm, name, unused.get(name, ())))
        for name in OPTIONAL_STEP_HOOKS:
            impls = getattr(pm.hook, name).get_hookimpls()
            setattr(self, f"has_{name}", any(
                impl.wrapper or impl.hookwrapper or impl.plugin_name not in unused.get(name, ())
                for impl in impls))
        self.clips_every_step = any(getattr(impl.plugin, "clips_every_step", False)
                                    for impl in pm.hook.clip_gradients.get_hookimpls())


# -- observation ---------------------------------------------------------------------------------


@dataclass
class ImplCall:
    """One implementation's part in a hook call.

    ``seconds`` is the wall time of the implementation, including any hook it called; for a
    wrapper (``wrapper=True``), only its own code before and after its ``yield``.
    """

    plugin: str
    wrapper: bool = False
    seconds: float = 0.0
    result: Any = None
    error: BaseException | None = None


@dataclass
class HookCall:
    """One call of a hook, as an observer receives it once the call returned or raised.

    ``kwargs``: the hook's arguments, ``trainer`` excluded (a per-plugin call has those its
    implementation declares). ``impls``: the implementations that ran, in the order they
    started (a firstresult hook stops at the first result, so later ones are absent).
    ``result``: what the caller got (a list for an "all" hook); ``error``: what it raised, or
    ``None``. ``index``: the call's position in start order among all observed calls of this
    process (increasing, also across runs); ``depth``: how many hook calls it is nested in (a ``save_checkpoint`` inside the
    checkpoint callback's ``on_epoch_end`` has depth 1). ``rank``: the global rank when the
    run has several processes, else ``None``.
    """

    name: str
    kwargs: dict[str, Any]
    index: int
    depth: int
    rank: int | None = None
    impls: list[ImplCall] = field(default_factory=list)
    result: Any = None
    error: BaseException | None = None
    seconds: float = 0.0
    _start: float = field(default=0.0, repr=False, compare=False)

    @property
    def plugins(self) -> list[str]:
        """The names of the plugins whose implementations ran, in order."""
        return [impl.plugin for impl in self.impls]


class Observation:
    """What observes the hook calls of one plugin manager and hands them to its observers."""

    def __init__(self, pm: pluggy.PluginManager):
        self.observers: list[Any] = []
        self.stack: list[HookCall] = []  # the calls under way, innermost last
        pm.add_hookcall_monitoring(self._before, self._after)
        for plugin in pm.get_plugins():
            self.instrument(pm, plugin)

    # -- calls -------------------------------------------------------------------------------

    def begin(self, name: str, kwargs: dict[str, Any]) -> HookCall:
        trainer = kwargs.get("trainer")
        rank = None
        if trainer is not None and getattr(trainer, "world_size", 1) > 1:
            rank = getattr(trainer, "global_rank", None)
        call = HookCall(name, {k: v for k, v in kwargs.items() if k != "trainer"},
                        next(_CALL_NUMBERS), len(self.stack), rank)
        self.stack.append(call)
        call._start = perf_counter()
        return call

    def end(self, call: HookCall, result: Any, error: BaseException | None) -> None:
        call.seconds = perf_counter() - call._start
        call.result, call.error = result, error
        if self.stack and self.stack[-1] is call:
            self.stack.pop()
        elif call in self.stack:
            self.stack.remove(call)
        for observer in list(self.observers):
            observer.observe_hook_call(call)

    def _before(self, hook_name: str, hook_impls: Any, kwargs: Any) -> None:
        self.begin(hook_name, dict(kwargs))

    def _after(self, outcome: Any, hook_name: str, hook_impls: Any, kwargs: Any) -> None:
        call = next((c for c in reversed(self.stack) if c.name == hook_name), None)
        if call is None:
            return
        error = outcome.exception
        self.end(call, None if error is not None else outcome.get_result(), error)

    def observed_caller(self, name: str, caller: Callable[..., Any]) -> Callable[..., Any]:
        """``caller`` (a direct caller of hook ``name``) reporting each call."""

        def observed(**kwargs: Any) -> Any:
            call = self.begin(name, kwargs)
            try:
                result = caller(**kwargs)
            except BaseException as exc:
                self.end(call, None, exc)
                raise
            self.end(call, result, None)
            return result

        return observed

    # -- implementations ---------------------------------------------------------------------

    def instrument(self, pm: pluggy.PluginManager, plugin: Any) -> None:
        """Replace the function of each of ``plugin``'s implementations by a timing wrapper
        (once; pluggy and the direct callers both call ``impl.function``)."""
        for caller in pm.get_hookcallers(plugin) or ():
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin and not getattr(impl.function, _OBSERVED, False):
                    impl.function = self._observed_impl(caller.name, impl)  # type: ignore[misc]

    def _frame(self, hook: str, argnames: tuple[str, ...], args: tuple,
               kwargs: dict[str, Any]) -> tuple[HookCall, bool]:
        """The call an implementation belongs to, and whether it is its own (a per-plugin call
        such as ``state_dict``, which the core makes on one implementation at a time)."""
        if self.stack and self.stack[-1].name == hook:
            return self.stack[-1], False
        named = dict(zip(argnames, args))
        named.update(kwargs)
        return self.begin(hook, named), True

    def _observed_impl(self, hook: str, impl: Any) -> Callable[..., Any]:
        function, plugin, argnames = impl.function, impl.plugin_name, tuple(impl.argnames)
        if impl.wrapper or impl.hookwrapper:
            def observed(*args: Any, **kwargs: Any) -> Any:
                frame, own = self._frame(hook, argnames, args, kwargs)
                entry = ImplCall(plugin, wrapper=True)
                frame.impls.append(entry)
                return self._timed(function(*args, **kwargs), entry, frame if own else None)
        else:
            def observed(*args: Any, **kwargs: Any) -> Any:
                frame, own = self._frame(hook, argnames, args, kwargs)
                entry = ImplCall(plugin)
                frame.impls.append(entry)
                start = perf_counter()
                try:
                    result = function(*args, **kwargs)
                except BaseException as exc:
                    entry.seconds, entry.error = perf_counter() - start, exc
                    if own:
                        self.end(frame, None, exc)
                    raise
                entry.seconds, entry.result = perf_counter() - start, result
                if own:
                    self.end(frame, result, None)
                return result

        setattr(observed, _OBSERVED, True)
        observed.__wrapped__ = function  # type: ignore[attr-defined]
        return observed

    def _timed(self, gen: Generator[Any, Any, Any], entry: ImplCall,
               own: HookCall | None) -> Generator[Any, Any, Any]:
        """Run wrapper generator ``gen`` as pluggy drives it (``next``, then ``send`` or
        ``throw``), adding up the time spent in its own code into ``entry``."""
        method: Callable[[Any], Any] = gen.send
        arg: Any = None
        while True:
            start = perf_counter()
            try:
                value = method(arg)
            except StopIteration as stop:
                entry.seconds += perf_counter() - start
                entry.result = stop.value
                if own is not None:
                    self.end(own, stop.value, None)
                return stop.value
            except BaseException as exc:
                entry.seconds += perf_counter() - start
                entry.error = exc
                if own is not None:
                    self.end(own, None, exc)
                raise
            entry.seconds += perf_counter() - start
            try:
                arg = yield value
            except GeneratorExit:
                gen.close()
                raise
            except BaseException as exc:  # the other implementations raised: pass it in
                method, arg = gen.throw, exc
            else:
                method = gen.send


def observation_of(pm: pluggy.PluginManager) -> Observation | None:
    return getattr(pm, _OBSERVATION, None)


def observe(pm: pluggy.PluginManager, observer: Any) -> Observation:
    """Give every later hook call of ``pm`` to ``observer.observe_hook_call(call)``."""
    observation = observation_of(pm)
    if observation is None:
        observation = Observation(pm)
        setattr(pm, _OBSERVATION, observation)
    if not any(o is observer for o in observation.observers):
        observation.observers.append(observer)
    return observation


def on_register(pm: pluggy.PluginManager, plugin: Any) -> None:
    """Called by :func:`ptrain.loading.register` after each registration: a plugin that is an
    observer starts the observation; under observation, a new plugin's implementations are
    timed too."""
    if not inspect.isclass(plugin) and callable(getattr(plugin, "observe_hook_call", None)):
        observe(pm, plugin).instrument(pm, plugin)
        return
    observation = observation_of(pm)
    if observation is not None:
        observation.instrument(pm, plugin)


# -- tracing to stderr ---------------------------------------------------------------------------


def trace_requested() -> bool:
    """Whether ``PTRAIN_TRACE`` asks for tracing; a value that is neither on nor off is a
    :class:`ConfigError`."""
    raw = os.environ.get(TRACE_ENV, "")
    value = raw.strip().lower()
    if value in _TRACE_ON:
        return True
    if value in _TRACE_OFF:
        return False
    raise ConfigError(f"{TRACE_ENV}={raw!r} is not understood: set {TRACE_ENV}=1 to print every "
                      f"hook call to stderr, or 0 (or leave it unset) for none.")


class StderrTracer:
    """Prints each hook call to stderr once it returned, one line per call::

        ptrain trace: model_step(stage='train', batch_idx=0) 0.210 ms -> Tensor | bf16-mixed
        (wrapper) 0.012 ms -> Tensor, loop-defaults 0.180 ms -> Tensor

    A nested call is indented by its depth and printed before the call that contains it (it
    ends first); ``[rank N]`` starts the lines of a multi-process run.
    """

    def observe_hook_call(self, call: HookCall) -> None:
        stream = sys.stderr
        stream.write(format_call(call) + "\n")
        stream.flush()


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _impl_text(impl: ImplCall) -> str:
    text = f"{impl.plugin}{' (wrapper)' if impl.wrapper else ''} {impl.seconds * 1e3:.3f} ms"
    if impl.error is not None:
        return f"{text} raised {_type_name(impl.error)}"
    if impl.result is not None:
        return f"{text} -> {_type_name(impl.result)}"
    return text


def format_call(call: HookCall) -> str:
    """The line :class:`StderrTracer` prints for ``call``."""
    scalars = ", ".join(f"{k}={v!r}" for k, v in call.kwargs.items()
                        if isinstance(v, (str, int, float)) and len(repr(v)) <= 80)
    outcome = (f"raised {_type_name(call.error)}" if call.error is not None
               else _type_name(call.result))
    impls = ", ".join(_impl_text(impl) for impl in call.impls) or "no implementation"
    where = f"[rank {call.rank}] " if call.rank is not None else ""
    return (f"ptrain trace: {where}{'  ' * call.depth}{call.name}({scalars}) "
            f"{call.seconds * 1e3:.3f} ms -> {outcome} | {impls}")
