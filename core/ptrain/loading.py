"""Importing, declaring, instantiating and registering plugins.

What an entry point may refer to (the contract):

- a **class**: the core calls its ``add_options`` (a ``@staticmethod``) to learn its options, then
  instantiates it with the resolved options as keyword arguments, and registers the instance;
- a **module** whose functions carry ``@ptrain.hookimpl`` (pluggy's convention): registered as it
  is; a module takes no options (make the entry point a class to have some);
- any other **object** with ``@ptrain.hookimpl`` methods: registered as it is, without options.

``add_options`` and ``check_available`` are called on the class or module itself, once per plugin,
before anything is instantiated.
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
import inspect
import operator
import os
import sys
import sysconfig
import traceback
import warnings
from types import FunctionType, ModuleType
from typing import Any, Callable

import pluggy

from ptrain import hookspecs
from ptrain.catalog import PluginInfo
from ptrain.errors import ModelError, PluginError
from ptrain.options import OptionGroup, closest, near_names

IMPL_MARK = f"{hookspecs.PROJECT_NAME}_impl"  # the attribute pluggy's HookimplMarker sets
SPEC_MARK = f"{hookspecs.PROJECT_NAME}_spec"
HOOK_NAMES = sorted(n for n in dir(hookspecs) if hasattr(getattr(hookspecs, n), SPEC_MARK))


def import_target(info: PluginInfo) -> Any:
    """Import what the entry point refers to; any failure is a :class:`PluginError` naming the
    distribution, never a traceback."""
    module_name, _, attribute = info.target.partition(":")
    try:
        target: Any = importlib.import_module(module_name.strip())
        for part in filter(None, attribute.strip().split(".")):
            target = getattr(target, part)
    except Exception as exc:  # a broken plugin can raise anything while importing
        where = raised_at(exc, _distribution_files(info.distribution))
        raise PluginError(
            f"{info.label} failed to import: {type(exc).__name__}: {exc}{where}. Fix or reinstall "
            f"{info.distribution} (or `pip uninstall {info.distribution}`), or "
            f"{_leave_out(info)}."
        ) from exc
    return target


def _leave_out(info: PluginInfo) -> str:
    """How to run without the plugin ``info`` names: a callback is blocked, an accelerator,
    strategy or precision replaced by another of its kind."""
    if info.kind == "callback":
        return f"leave it out of this run: `-p no:{info.name}` keeps it from being imported"
    flag = f"--{info.kind}"
    return (f"choose another {info.kind} ({flag} NAME; `ptrain plugins` lists the installed "
            f"ones): only the {info.kind} a run selects is imported")


def import_object(path: str, what: str, error: type[Exception], example: str) -> Any:
    """The object ``MODULE:ATTRIBUTE`` names (``--model``, ``-p MODULE:CLASS``), imported with
    the current folder importable, as ``python -m`` does. A malformed path or a failed import is
    ``error`` naming ``what`` and the path; ``example`` shows the form. A missing module or class
    is told to check the path; a module that raised while importing, what it raised and where
    (:func:`raised_at`)."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise error(f"{what} {path!r} must be MODULE:CLASS, e.g. {example}.")
    try:
        module = _import_module(module_name)
    except Exception as exc:
        if not (isinstance(exc, ModuleNotFoundError) and exc.name is not None
                and (module_name + ".").startswith(exc.name + ".")):
            # the module was found, and its code (or what it imports) raised
            detail = exc.msg if isinstance(exc, SyntaxError) and exc.msg else exc
            raise error(f"{what} {path!r} could not be loaded: importing {module_name!r} raised "
                        f"{type(exc).__name__}: {detail}{raised_at(exc)}. Fix the error there."
                        ) from None
        raise error(f"{what} {path!r} could not be imported: {type(exc).__name__}: {exc}. "
                    f"Check the module path (relative to {os.getcwd()!r}).") from None
    try:
        return _attribute(module, attribute)
    except AttributeError as exc:
        raise error(f"{what} {path!r} could not be imported: {type(exc).__name__}: {exc}. "
                    f"Check the class name.") from None
    except Exception as exc:  # a module's __getattr__ can raise anything
        raise error(f"{what} {path!r} could not be loaded: getting {attribute!r} from "
                    f"{module_name!r} raised {type(exc).__name__}: {exc}{raised_at(exc)}."
                    ) from None


def raised_at(exc: BaseException, imported: frozenset[str] = frozenset()) -> str:
    """`` (at FILE:LINE)``: where ``exc`` was raised in the code being imported (the deepest
    frame in a file of ``imported``, real paths, or outside Python's library, the installed
    packages and ptrain; a ``SyntaxError``'s own place), or nothing where there is no such
    frame. ``imported``: the files of an installed plugin, which lie among the packages. It is
    called where the import was tried: the frame that caught ``exc`` does not count."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" (at {exc.filename}:{exc.lineno})"
    paths = sysconfig.get_paths()
    library = tuple(os.path.join(os.path.realpath(paths[k]), "") for k in
                    ("stdlib", "platstdlib", "purelib", "platlib") if k in paths)
    own = os.path.join(os.path.dirname(os.path.realpath(hookspecs.__file__)), "")
    frames = [(f, os.path.realpath(f.filename))  # the first frame is ptrain's, which caught it
              for f in traceback.extract_tb(exc.__traceback__)[1:]
              if not f.filename.startswith("<")]
    frames = [(f, path) for f, path in frames if path in imported or not path.startswith(own)]
    user = [f for f, path in frames if path in imported or not path.startswith(library)]
    frames = [f for f, _ in frames]
    frame = (user or [f for f in frames if f.name == "<module>"] or [None])[-1]
    return "" if frame is None else f" (at {frame.filename}:{frame.lineno})"


def _distribution_files(distribution: str) -> frozenset[str]:
    """The real paths of the Python files installed distribution ``distribution`` records (none
    where it records none, as an editable install)."""
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return frozenset()
    return frozenset(os.path.realpath(f.locate()) for f in files if f.suffix == ".py")


def _import_module(module_name: str) -> ModuleType:
    """``module_name``, imported with the current folder importable."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(module_name)


def _attribute(target: Any, attribute: str) -> Any:
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


def _import_path(module_name: str, attribute: str) -> Any:
    return _attribute(_import_module(module_name), attribute)


def import_saved_class(class_path: str, checkpoint: str, flag: str,
                       init_args: dict[str, Any] | None = None) -> Any:
    """The class a checkpoint names for its model (``flag`` ``--model``) or data module
    (``--data``), imported; one that can't be imported (renamed or moved since the save) is a
    :class:`ModelError` that says the checkpoint named it and that ``flag`` overrides it."""
    module_name, _, attribute = str(class_path).partition(":")
    try:
        if not module_name or not attribute:
            raise ValueError("it is not MODULE:CLASS")
        return _import_path(module_name, attribute)
    except Exception as exc:
        from ptrain.checkpoint_io import flag_value

        flags = " ".join(f"{flag}.{key} {flag_value(value)}"
                         for key, value in (init_args or {}).items())
        saved = f" (the checkpoint's are: {flags})" if flags else ""
        raise ModelError(
            f"checkpoint {checkpoint!r} names {class_path!r} as the class to build its "
            f"{flag.lstrip('-')} from, and it can't be imported here ({type(exc).__name__}: "
            f"{exc}): it was renamed or moved since the checkpoint was saved, or its module is "
            f"not importable from {os.getcwd()!r}. {flag} MODULE:CLASS overrides the "
            f"checkpoint's class: give the class as it is named now, with its init arguments "
            f"as {flag}.KEY VALUE{saved}.") from None


def plugin_label(target: Any) -> str:
    if isinstance(target, ModuleType):
        return target.__name__
    cls = target if inspect.isclass(target) else type(target)
    return f"{cls.__module__}.{cls.__qualname__}"


def _declaration(target: Any, hook_name: str, owner: str) -> Callable[..., Any] | None:
    """The ``add_options``/``check_available``/``tune_candidates`` implementation of a class or
    module, if any."""
    function = getattr(target, hook_name, None)
    if function is None or not hasattr(function, IMPL_MARK):
        return None
    if inspect.isclass(target) and not isinstance(
        inspect.getattr_static(target, hook_name), (staticmethod, classmethod)
    ):
        raise PluginError(
            f"plugin {owner!r} ({plugin_label(target)}) implements {hook_name} as an instance "
            f"method; make it a @staticmethod: it is called before the class is instantiated."
        )
    _check_declared_arguments(function, hook_name, target, owner)
    return function


def _check_declared_arguments(function: Callable[..., Any], hook_name: str, target: Any,
                              owner: str) -> None:
    """A declaration hook is called before the plugin is registered, so pluggy's check of its
    arguments comes too late: an argument the specification lacks (``opts`` for ``options``)
    would be a bare ``TypeError`` from the core. The same check, as a :class:`PluginError`."""
    spec = inspect.signature(getattr(hookspecs, hook_name)).parameters
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # no signature to read: pluggy's to judge
        return
    unknown = [p.name for p in params if p.default is p.empty and p.name not in spec
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if unknown:
        raise PluginError(
            f"plugin {owner!r} ({plugin_label(target)}) is invalid: its {hook_name} declares "
            f"{', '.join(map(repr, unknown))}, which the hook does not have; {hook_name}'s "
            f"arguments are: {', '.join(spec) or 'none'}.")


def _call_opt_in(function: Callable[..., Any], **available: Any) -> Any:
    """Call with the arguments the implementation declares (pluggy's opt-in arguments)."""
    wanted = inspect.signature(function).parameters
    return function(**{name: value for name, value in available.items() if name in wanted})


def declare_options(target: Any, owner: str) -> OptionGroup:
    """The options plugin ``owner`` declares through its ``add_options`` hook."""
    group = OptionGroup(owner)
    function = _declaration(target, "add_options", owner)
    if function is not None:
        if not inspect.isclass(target):
            raise PluginError(
                f"plugin {owner!r} ({plugin_label(target)}) declares options but is not a class; "
                f"only a class can receive options (as keyword arguments when it is instantiated)."
            )
        _call_opt_in(function, options=group)
    return group


def tune_candidates(target: Any, owner: str, trainer: Any) -> list[Any]:
    """The candidates plugin ``owner`` offers ``ptrain tune`` through its ``tune_candidates``
    hook (none without one); anything but a list of :class:`ptrain.tuning.Candidate` is a
    :class:`PluginError` naming the plugin."""
    from ptrain.tuning.candidates import Candidate

    function = _declaration(target, "tune_candidates", owner)
    if function is None:
        return []
    offered = _call_opt_in(function, trainer=trainer)
    if offered is None:
        return []
    if not (isinstance(offered, (list, tuple))
            and all(isinstance(c, Candidate) for c in offered)):
        raise PluginError(f"plugin {owner!r} ({plugin_label(target)}): tune_candidates returned "
                          f"{offered!r}; it must return a list of ptrain.tuning.Candidate.")
    return list(offered)


def check_available(target: Any, owner: str) -> str | None:
    """The plugin's own answer to "can you run here?": ``None``, or the reason it can't."""
    function = _declaration(target, "check_available", owner)
    if function is None:
        return None
    try:
        return _call_opt_in(function)
    except Exception as exc:  # an availability check must never take the caller down
        return f"its availability check raised {type(exc).__name__}: {exc}"


def instantiate(target: Any, owner: str, options: dict[str, Any]) -> Any:
    """The plugin object to register: ``target(**options)`` for a class, else ``target`` itself."""
    if not inspect.isclass(target):
        return target
    try:
        return target(**options)
    except TypeError as exc:
        raise PluginError(
            f"plugin {owner!r} ({plugin_label(target)}) could not be created with its declared "
            f"options {sorted(options)}: {exc}. Its __init__ must accept every option its "
            f"add_options declares."
        ) from exc


class _PluginManager(pluggy.PluginManager):
    """pluggy's manager, faster to register with. pluggy asks each attribute of a plugin
    whether it is a hook implementation, reading it statically (``inspect.getattr_static``,
    some 10 µs each), and a plugin object has some 80 attributes, most of them ``object``'s: an
    attribute found in a class's own ``__dict__`` is answered here at once (a plain function:
    its mark's options; anything unmarked: none), and so is a value of the instance itself that
    can't be called (none). Anything else (a module's attribute, a callable stored on the
    instance, a marked staticmethod or classmethod) is pluggy's to judge."""

    def __deepcopy__(self, memo: dict[int, Any]) -> _PluginManager:
        """A copy whose registered plugins are copies too (``copy.deepcopy`` of a trainer, as a
        Lightning trainer can be copied); modules (the hook specification, a module
        registered as a plugin) are not copied but shared, as a module is one per process."""
        for caller in vars(self.hook).values():
            if caller.spec is not None:
                memo.setdefault(id(caller.spec.namespace), caller.spec.namespace)
        for plugin in self.get_plugins():
            if isinstance(plugin, ModuleType):
                memo.setdefault(id(plugin), plugin)
        copied = memo[id(self)] = type(self).__new__(type(self))
        copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return copied

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        #: the hook each attribute of ``plugin`` marked as a hook implementation implements
        #: (its ``specname``, else its own name), by attribute: what :func:`register` checks,
        #: without a second pass over the plugin's attributes
        self.marked_names: dict[str, str] = {}
        return super().register(plugin, name)

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        opts = self._hookimpl_opts(plugin, name)
        if opts is not None:
            self.marked_names[name] = opts.get("specname") or name
        return opts

    def _hookimpl_opts(self, plugin: Any, name: str) -> Any:
        if isinstance(plugin, ModuleType):
            return super().parse_hookimpl_opts(plugin, name)
        own = {} if isinstance(plugin, type) else getattr(plugin, "__dict__", {})
        if name in own:  # the instance's own value: pluggy's to judge, unless not callable
            return None if not callable(own[name]) else super().parse_hookimpl_opts(plugin, name)
        for cls in (plugin if isinstance(plugin, type) else type(plugin)).__mro__:
            raw = cls.__dict__.get(name, _ABSENT)
            if raw is not _ABSENT:
                if isinstance(raw, FunctionType):  # a plain method: its mark, if any
                    opts = getattr(raw, IMPL_MARK, None)  # (what pluggy's lookup would read)
                    return opts if isinstance(opts, dict) else None
                # the mark is on a staticmethod/classmethod, or on the function inside it
                if not (hasattr(raw, IMPL_MARK)
                        or hasattr(getattr(raw, "__func__", None), IMPL_MARK)):
                    return None
                break
        return super().parse_hookimpl_opts(plugin, name)


_ABSENT = object()


def create_plugin_manager() -> pluggy.PluginManager:
    """A plugin manager with ptrain's hook specification; with ``PTRAIN_TRACE=1`` in the
    environment, every hook call it makes is printed to stderr (see :mod:`ptrain.hook_calls`)."""
    from ptrain import hook_calls  # it imports this module

    pm = _PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    if hook_calls.trace_requested():
        hook_calls.observe(pm, hook_calls.StderrTracer())
    return pm


#: Lightning's callback and module hook names -> the ptrain hook that means the same thing, for
#: the messages about a method that is not a ptrain hook.
LIGHTNING_HOOKS = {
    "on_fit_start": "on_loop_start (loop='fit')", "on_fit_end": "on_loop_end (loop='fit')",
    "on_sanity_check_start": "on_loop_start (loop='sanity_check')",
    "on_sanity_check_end": "on_loop_end (loop='sanity_check')",
    "on_train_start": "on_loop_start (loop='train')",
    "on_train_end": "on_loop_end (loop='train')",
    "on_validation_start": "on_loop_start (loop='validate')",
    "on_validation_epoch_start": "on_loop_start (loop='validate')",
    "on_test_start": "on_loop_start (loop='test')", "on_test_end": "on_loop_end (loop='test')",
    "on_test_epoch_start": "on_loop_start (loop='test')",
    "on_predict_start": "on_loop_start (loop='predict')",
    "on_predict_end": "on_loop_end (loop='predict')",
    "on_train_epoch_start": "on_epoch_start",
    "on_train_epoch_end": "on_epoch_metrics (stage='train')",
    "on_validation_epoch_end": "on_epoch_metrics (stage='validate')",
    "on_test_epoch_end": "on_epoch_metrics (stage='test')",
    "on_predict_epoch_end": "on_epoch_metrics (stage='predict')",
    "on_train_batch_start": "on_batch_start (stage='train')",
    "on_validation_batch_start": "on_batch_start (stage='validate')",
    "on_test_batch_start": "on_batch_start (stage='test')",
    "on_predict_batch_start": "on_batch_start (stage='predict')",
    "on_validation_batch_end": "on_evaluation_batch_end",
    "on_test_batch_end": "on_evaluation_batch_end",
    "on_predict_batch_end": "on_evaluation_batch_end",
    "on_save_checkpoint": "state_dict", "on_load_checkpoint": "load_state_dict",
    "on_exception": "teardown (trainer.exception is the error)",
}


def suggest_hook(name: str) -> str:
    """A sentence naming the ptrain hook ``name`` most likely means: the one meaning the same as
    Lightning's hook of that name, else the closest spelling, else nothing."""
    if name in LIGHTNING_HOOKS:
        return f" Did you mean {LIGHTNING_HOOKS[name]}, the hook meaning Lightning's {name!r}?"
    return closest(name, HOOK_NAMES)


def register(pm: _PluginManager, plugin: Any, name: str) -> None:
    """Register ``plugin`` under ``name``; a hook signature that does not match the specification,
    an implementation of a hook that does not exist (a typo), or a plugin that implements no hook
    at all (it would silently do nothing) is a :class:`PluginError`.
    A plugin with an ``observe_hook_call(call)`` method is an observer: from then on it receives
    every hook call of ``pm`` (see :mod:`ptrain.hook_calls`)."""
    from ptrain import hook_calls  # it imports this module

    try:
        pm.register(plugin, name=name)
    except (pluggy.PluginValidationError, ValueError) as exc:
        raise PluginError(f"plugin {name!r} ({plugin_label(plugin)}) is invalid: {exc}") from exc
    marked = pm.marked_names
    for attr, hook in marked.items():
        if hook not in HOOK_NAMES:  # a private method too: it is marked, so meant as a hook
            pm.unregister(plugin)
            how = f"{attr!r}" if hook == attr else f"{hook!r} (specname of {attr!r})"
            raise PluginError(
                f"plugin {name!r} ({plugin_label(plugin)}) implements {how}, which is not a "
                f"ptrain hook.{suggest_hook(hook.lstrip('_'))} See \"Hook reference\" in "
                f"ptrain's documentation for the hooks."
            )
    observer = not inspect.isclass(plugin) and callable(getattr(plugin, "observe_hook_call", None))
    if not marked and not observer:  # it would take part in nothing
        pm.unregister(plugin)
        unmarked = sorted(a for a in LIGHTNING_HOOKS if callable(getattr(plugin, a, None)))
        from ptrain.hook_methods import CALLBACK_METHODS, Callback

        if isinstance(plugin, Callback):  # its Lightning methods are Callback's, not its own
            below = type(plugin).__mro__[:type(plugin).__mro__.index(Callback)]
            own = sorted({n for klass in below for n, v in vars(klass).items()
                          if callable(v) and not n.startswith("_")})
            said = ", ".join(n + "".join(f" (did you mean {m}?)" for m in
                                         near_names(n, CALLBACK_METHODS)[:1]) for n in own)
            hint = (" It is a Callback that overrides none of Callback's methods"
                    + (f"; its own: {said}" if own else "") + ". Override the methods it "
                    "should run (on_train_epoch_end, ...), or leave it out of callbacks.")
        elif unmarked:
            how = "; ".join(f"{a} -> {LIGHTNING_HOOKS[a]}" for a in unmarked)
            hint = (f" Its methods {', '.join(unmarked)} are named like Lightning's hooks; "
                    f"ptrain calls methods marked @ptrain.hookimpl, under its own hook names "
                    f"({how}).")
        else:
            named = unmarked_hook_methods(plugin, {})
            hint = (f" Its {_methods(named)} not marked: put @ptrain.hookimpl above "
                    f"{'it' if len(named) == 1 else 'each'}."
                    if named else " Mark its hook methods with @ptrain.hookimpl.")
        raise PluginError(
            f"plugin {name!r} ({plugin_label(plugin)}) implements no ptrain hook, so it would "
            f"take no part in the run.{hint} See \"Hook reference\" in ptrain's "
            f"documentation.")
    unmarked = unmarked_hook_methods(plugin, marked)
    if unmarked:
        one = len(unmarked) == 1
        warnings.warn(
            f"plugin {name!r} ({plugin_label(plugin)}): its {_methods(unmarked)} not marked "
            f"@ptrain.hookimpl, so ptrain never calls {'it' if one else 'them'}. Put "
            f"@ptrain.hookimpl above {'it' if one else 'each'}; if "
            f"{'it is' if one else 'one is'} a helper, not a hook, rename it (or name it in "
            f"the plugin's attribute `{NOT_HOOKS}`, a tuple of method names).", stacklevel=2)
    hook_calls.on_register(pm, plugin)


#: a plugin's attribute naming methods that have hook names but are not hooks on purpose (a
#: helper, or methods called through another route, as :class:`ptrain.hook_methods.Callback`'s
#: Lightning methods): :func:`register` does not warn that they lack ``@ptrain.hookimpl``
NOT_HOOKS = "not_ptrain_hooks"


def declared_not_hooks(plugin: Any) -> set[str]:
    """The method names ``plugin``'s :data:`NOT_HOOKS` attribute declares (read statically,
    not a ``__getattr__``'s answer; one name or a collection of names)."""
    declared = inspect.getattr_static(plugin, NOT_HOOKS, ())
    if isinstance(declared, str):
        return {declared}
    return set(declared) if isinstance(declared, (tuple, list, set, frozenset)) else set()


def unmarked_hook_methods(plugin: Any, marked: dict[str, str]) -> list[str]:
    """The methods of ``plugin`` (of its class, or a module's own functions) named like a
    ptrain hook but without ``@ptrain.hookimpl``: pluggy passes them over, so they would never
    be called. ``marked`` (attribute -> hook, see :class:`_PluginManager`) and the names in the
    plugin's :data:`NOT_HOOKS` attribute are left out."""
    skip = set(marked) | set(marked.values()) | declared_not_hooks(plugin)
    names = [n for n in HOOK_NAMES if n not in skip]
    if isinstance(plugin, ModuleType):
        return [n for n in names if isinstance(vars(plugin).get(n), FunctionType)
                and vars(plugin)[n].__module__ == plugin.__name__
                and not hasattr(vars(plugin)[n], IMPL_MARK)]
    found = []
    for hook in names:
        for cls in (plugin if inspect.isclass(plugin) else type(plugin)).__mro__[:-1]:
            raw = cls.__dict__.get(hook, _ABSENT)
            if raw is _ABSENT:
                continue
            function = getattr(raw, "__func__", raw)  # a staticmethod's or classmethod's
            if isinstance(function, FunctionType) and not hasattr(function, IMPL_MARK) \
                    and not hasattr(raw, IMPL_MARK):
                found.append(f"{cls.__qualname__}.{hook}")
            break
    return found


def _methods(names: list[str]) -> str:
    if len(names) == 1:
        return f"method {names[0]}, named like a ptrain hook, is"
    return f"methods {', '.join(names)}, named like ptrain hooks, are"


def bind_impl(impl: Any, spec_args: tuple[str, ...] = ()) -> Callable[..., Any]:
    """``impl``'s function as a callable taking a hook call's keyword arguments, of which it
    receives only those it declares (pluggy's opt-in arguments). When it declares exactly
    ``spec_args``, the function itself is returned: no adapter on the per-step path."""
    function, wanted = impl.function, tuple(impl.argnames)
    if not wanted:
        return lambda **kwargs: function()
    if wanted == spec_args:
        return function
    pick = operator.itemgetter(*wanted)
    if len(wanted) == 1:
        return lambda **kwargs: function(pick(kwargs))
    return lambda **kwargs: function(*pick(kwargs))


def call_impl(impl: Any, **kwargs: Any) -> Any:
    """Call one hook implementation with the arguments it declares."""
    return bind_impl(impl)(**kwargs)


def call_per_plugin(pm: pluggy.PluginManager, hook_name: str, **kwargs: Any) -> dict[str, Any]:
    """Call each plugin's implementation of ``hook_name`` on its own; results keyed by plugin."""
    return {impl.plugin_name: call_impl(impl, **kwargs)
            for impl in getattr(pm.hook, hook_name).get_hookimpls()}
