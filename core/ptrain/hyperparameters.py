"""``save_hyperparameters()``/``hparams``: what a module or datamodule records of its init
arguments, how it travels in checkpoints and to the loggers, and how it comes back.

``self.hparams`` holds the values as given, whatever they are. Checkpoints are read with
torch's weights-only loader, so they hold a *saved form* made of plain values (None, bool, int,
float, str, and lists/dicts of them):

- a plain value as it is; a value of a subclass of int, float or str (numpy's ``float64``) as
  the plain value it holds; an OmegaConf container or an ``argparse.Namespace`` as the plain
  dict it holds;
- a class or function importable by its name, as ``{"__ptrain_reference__": "module:qualname"}``,
  and a member of such an ``Enum`` (a ``StrEnum`` option too) as ``"module:Class.MEMBER"``;
- a ``functools.partial`` of one, with saveable arguments (what Hydra's ``_partial_: true``
  makes), as ``{"__ptrain_partial__": reference, "args": [...], "kwargs": {...}}``;
- a dataclass instance with saveable fields, as ``{"__ptrain_dataclass__": reference,
  "fields": {...}}``;
- an object of a class the program let the loader build
  (``torch.serialization.add_safe_globals``), as it is.

:func:`restored_hyperparameters` turns the saved form back into those objects, so
``load_from_checkpoint`` rebuilds the module with them. Any other object (a model passed in, an
open file) stays in ``self.hparams`` but is left out of checkpoints, with a warning when it is
recorded: ``load_from_checkpoint`` then needs it passed again. The loggers receive every value,
a non-plain one as readable text.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import enum
import functools
import importlib
import inspect
import warnings
from typing import Any, Mapping

import torch
from torch import nn

from ptrain.errors import ModelError

#: Types a saved hyperparameter may have: they travel in checkpoints (safe loading) and to loggers.
PLAIN = (type(None), bool, int, float, str)
REFERENCE, PARTIAL, DATACLASS = "__ptrain_reference__", "__ptrain_partial__", \
    "__ptrain_dataclass__"
#: How a value of a subclass of int, float or str is turned into the exact type (its own
#: ``__str__``... may say something else).
_EXACT = {int: int.__int__, float: float.__float__, str: str.__str__}


class Unsaveable(Exception):
    """A value has no saved form (see the module docstring)."""


def is_plain(value: Any) -> bool:
    """Whether ``value`` is made of :data:`PLAIN` values, lists and str-keyed dicts only. The
    types must be exact: a subclass (an ``Enum`` member of ``StrEnum``, numpy's ``float64``)
    would be pickled as itself, which the weights-only loader refuses."""
    if type(value) in PLAIN:
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    return False


def _reference(value: Any) -> str:
    """``module:qualname`` of an importable class or function, else :class:`Unsaveable`."""
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
    if module is None or "<" in qualname:  # a lambda or a class made inside a function
        raise Unsaveable(value)
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        raise Unsaveable(value) from None
    if found is not value:
        raise Unsaveable(value)
    return f"{module}:{qualname}"


def saved_form(value: Any) -> Any:
    """The plain form of ``value`` a checkpoint holds, or :class:`Unsaveable`."""
    if is_plain(value):
        return value
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value) or any(
                k in (REFERENCE, PARTIAL, DATACLASS) for k in value):
            raise Unsaveable(value)
        return {k: saved_form(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [saved_form(v) for v in value]
    if inspect.isclass(value) or inspect.isroutine(value):
        return {REFERENCE: _reference(value)}
    if isinstance(value, enum.Enum):
        reference = f"{_reference(type(value))}.{value.name}"
        try:
            if _resolve(reference) is value:
                return {REFERENCE: reference}
        except AttributeError:  # a combination of flags has no name of its own
            pass
        raise Unsaveable(value)
    for base, exact in _EXACT.items():  # a subclass's value (numpy's float64) as the base type
        if isinstance(value, base):
            return exact(value)
    if isinstance(value, functools.partial):
        return {PARTIAL: _reference(value.func), "args": [saved_form(a) for a in value.args],
                "kwargs": {k: saved_form(v) for k, v in value.keywords.items()}}
    if dataclasses.is_dataclass(value) and not inspect.isclass(value):
        fields = {f.name: saved_form(getattr(value, f.name))
                  for f in dataclasses.fields(value) if f.init}
        return {DATACLASS: _reference(type(value)), "fields": fields}
    if _allowed_by_program(value):
        return value
    raise Unsaveable(value)


def _allowed_by_program(value: Any) -> bool:
    """Whether the program let torch's weights-only loader build objects of ``value``'s class
    (``torch.serialization.add_safe_globals``): such a value is kept as it is (the first
    save reads the whole checkpoint back, so what it holds beyond that class must load too)."""
    cls = type(value)
    return any(entry is cls or (isinstance(entry, tuple) and entry[0] is cls)
               for entry in torch.serialization.get_safe_globals())


def _resolve(reference: str) -> Any:
    module, _, qualname = reference.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def restored(value: Any) -> Any:
    """The object a saved form stands for (the inverse of :func:`saved_form`)."""
    if isinstance(value, list):
        return [restored(v) for v in value]
    if not isinstance(value, dict):
        return value
    if REFERENCE in value:
        return _resolve(value[REFERENCE])
    if PARTIAL in value:
        return functools.partial(_resolve(value[PARTIAL]), *restored(value["args"]),
                                 **restored(value["kwargs"]))
    if DATACLASS in value:
        return _resolve(value[DATACLASS])(**restored(value["fields"]))
    return {k: restored(v) for k, v in value.items()}


def saved_hyperparameters(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """``hparams`` in the saved form, the values without one left out."""
    saved = {}
    for key, value in hparams.items():
        try:
            saved[key] = saved_form(value)
        except Unsaveable:
            continue
    return saved


def restored_hyperparameters(saved: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a checkpoint's saved hyperparameters stand for (classes, partials... rebuilt)."""
    return {k: restored(v) for k, v in (saved or {}).items()}


def logged_hyperparameters(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """``hparams`` for the loggers: plain values (and containers of them) as they are, any
    other as readable text."""
    logged = {}
    for key, value in hparams.items():
        try:
            form = saved_form(value)
        except Unsaveable:
            logged[key] = _text(value)
            continue
        logged[key] = _text(value) if _tagged(form) else form
    return logged


def _tagged(form: Any) -> bool:
    """Whether a saved form stands for an object (it holds one of the tags)."""
    if isinstance(form, list):
        return any(_tagged(v) for v in form)
    if isinstance(form, dict):
        return any(k in (REFERENCE, PARTIAL, DATACLASS) for k in form) or any(
            _tagged(v) for v in form.values())
    return False


def _text(value: Any) -> str:
    if inspect.isclass(value) or inspect.isroutine(value):
        return f"{getattr(value, '__module__', '?')}.{value.__qualname__}"
    if isinstance(value, functools.partial):
        arguments = [repr(a) for a in value.args] + [f"{k}={v!r}"
                                                     for k, v in value.keywords.items()]
        return f"partial({_text(value.func)}{''.join(', ' + a for a in arguments)})"
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


class HyperparameterError(ModelError, ValueError):
    """``save_hyperparameters`` was given something it can't record (a ``ValueError``, as
    Lightning raises)."""


class HyperParameters(dict):
    """``self.hparams``: a dict whose keys also read as attributes (``self.hparams.lr``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no hyperparameter {name!r}; saved: "
                                 f"{', '.join(self) or '(none)'}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


class HyperParametersMixin:
    """``save_hyperparameters()``, ``hparams`` and ``hparams_initial``, shared by
    :class:`~ptrain.TrainModule` and :class:`~ptrain.DataModule`."""

    def save_hyperparameters(self, *args: Any, ignore: str | list[str] | None = None,
                             frame: Any = None, logger: bool = True) -> None:
        """Record the ``__init__`` arguments as ``self.hparams``: they go into every checkpoint
        (so ``ptrain test --ckpt-path PATH`` and ``load_from_checkpoint`` rebuild the module
        without its arguments), into the run folder's ``hparams.toml`` and to the loggers.

        Call it in ``__init__`` (or pass ``frame``, the frame of the ``__init__`` to read).
        With no arguments every init argument is kept; with names only those; with one dict
        (or ``argparse.Namespace``, or OmegaConf ``DictConfig``), its entries (a DictConfig's
        nested configs stay DictConfig/ListConfig objects, as given). ``ignore`` leaves
        names out. ``logger=False`` keeps them from the loggers and ``hparams.toml`` (they
        still go into checkpoints). An ``nn.Module`` argument is left out with a warning (its
        weights are in the checkpoint already); a value without a saved form (see
        :mod:`ptrain.hyperparameters`) stays in ``hparams`` but not in checkpoints, with a
        warning.
        """
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        name = None
        if any(isinstance(a, PLAIN[1:]) and not isinstance(a, str) for a in args):
            raise HyperparameterError(
                f"save_hyperparameters({', '.join(map(repr, args))}): plain values (bool, int, "
                f"float) can't be recorded on their own, since they carry no name. Pass the "
                f"names of __init__ arguments (save_hyperparameters('lr')), one dict or "
                f"argparse.Namespace of values, or nothing to record every init argument.")
        if len(args) == 1 and not isinstance(args[0], str):
            given = args[0]
            try:  # the init argument the container came in (load_from_checkpoint passes it so)
                arguments = self._init_arguments(frame or inspect.currentframe().f_back)
                name = next((k for k, v in arguments.items() if v is given), None)
            except ModelError:
                pass
            if isinstance(given, argparse.Namespace):
                given = vars(given)
            if type(given).__module__.startswith("omegaconf") and hasattr(given, "items"):
                # its entries as OmegaConf gives them: a nested config stays a DictConfig or
                # ListConfig, read and written with dots (self.hparams.head.dim = 4), as
                # Lightning keeps the container itself; checkpoints hold their plain form
                given = dict(given.items())
            if not isinstance(given, Mapping):
                raise HyperparameterError(
                    f"save_hyperparameters({type(given).__qualname__}) takes names of __init__ "
                    f"arguments, or one dict (or argparse.Namespace) of values.")
            values = dict(given)
        else:
            values = self._init_arguments(frame or inspect.currentframe().f_back)
            unknown = [a for a in args if a not in values]
            if unknown:
                raise HyperparameterError(
                    f"save_hyperparameters({', '.join(map(repr, args))}) names no init argument "
                    f"of {type(self).__qualname__} for {unknown}; its init arguments: "
                    f"{', '.join(values) or '(none)'}. Pass names of __init__ arguments, or one "
                    f"dict.")
            if args:
                values = {k: values[k] for k in args}
        kept = {}
        for key, value in values.items():
            if key in ignored:
                continue
            if isinstance(value, nn.Module):
                warnings.warn(
                    f"{type(self).__qualname__}.save_hyperparameters keeps {key!r} in "
                    f"self.hparams, but not in checkpoints: it is an nn.Module, whose weights "
                    f"are in the checkpoint already (load_from_checkpoint needs it passed "
                    f"again); pass ignore=[{key!r}] to say so and silence this.", stacklevel=2)
                kept[key] = value
                continue
            try:
                saved_form(value)
            except Unsaveable:
                warnings.warn(
                    f"{type(self).__qualname__}.save_hyperparameters keeps {key!r} (a "
                    f"{type(value).__qualname__}) in self.hparams, but checkpoints can't hold it: "
                    f"they keep plain values, importable classes and functions, partials and "
                    f"dataclasses of those, and objects of the classes the program allowed "
                    f"(torch.serialization.add_safe_globals), so that they load safely. "
                    f"load_from_checkpoint needs "
                    f"it passed again ({type(self).__qualname__}.load_from_checkpoint(path, "
                    f"{key}=...)); pass ignore=[{key!r}] to say so and silence this.",
                    stacklevel=2)
            kept[key] = value
        # a second call (a subclass's after its base's) adds to what the first recorded, and
        # its ignore list removes from it, as in Lightning
        merged = {k: v for k, v in self.__dict__.get("_hparams", {}).items() if k not in ignored}
        merged.update(kept)
        self.__dict__["_hparams"] = HyperParameters(merged)
        # a copy all the way down, as Lightning's: a change to a nested config is not seen here
        self.__dict__["_hparams_initial"] = copy.deepcopy(HyperParameters(merged))
        self.__dict__["_log_hyperparams"] = logger
        self.__dict__["_hparams_name"] = name

    def _init_arguments(self, frame: Any) -> dict[str, Any]:
        """The arguments of the ``__init__`` calls on the stack (``frame`` and its callers)
        that are constructing ``self``: from the first one found, each enclosing ``__init__``
        of an object with hyperparameters counts too (a subclass's ``__init__`` calling
        ``super().__init__``, and, as in Lightning, a module built inside another module's
        ``__init__`` records that one's arguments as well); the outermost decides a shared
        name."""
        found: dict[str, Any] = {}
        inside = adjacent = False
        while frame is not None:
            code = frame.f_code
            local = frame.f_locals
            owner = local.get(code.co_varnames[0]) if code.co_argcount else None
            adjacent = code.co_name == "__init__" and (owner is self or (
                adjacent and isinstance(owner, HyperParametersMixin)))
            if adjacent:
                inside = True
                names = code.co_varnames[1:code.co_argcount + code.co_kwonlyargcount]
                values = {n: local[n] for n in names if n in local}
                if code.co_flags & inspect.CO_VARKEYWORDS:
                    values.update(local.get(code.co_varnames[code.co_argcount
                                                             + code.co_kwonlyargcount
                                                             + bool(code.co_flags
                                                                    & inspect.CO_VARARGS)], {}))
                found = {**found, **values}  # the outermost __init__ decides a shared name
            frame = frame.f_back
        if not inside:
            raise ModelError(f"{type(self).__qualname__}.save_hyperparameters() must be called "
                             f"inside __init__ (it reads the init arguments); elsewhere pass a "
                             f"dict.")
        return found

    @property
    def hparams(self) -> HyperParameters:
        """The hyperparameters :meth:`save_hyperparameters` recorded (empty before)."""
        if "_hparams" not in self.__dict__:
            self.__dict__["_hparams"] = HyperParameters()
        return self.__dict__["_hparams"]

    @property
    def hparams_initial(self) -> HyperParameters:
        """The hyperparameters as :meth:`save_hyperparameters` recorded them: a copy, all the
        way down, of what it recorded (later changes to :attr:`hparams`, or to what this
        returns, are not seen here), as Lightning's."""
        return copy.deepcopy(HyperParameters(self.__dict__.get("_hparams_initial", {})))

    @property
    def logs_hyperparameters(self) -> bool:
        """Whether the hyperparameters go to the loggers (``save_hyperparameters(logger=...)``)."""
        return self.__dict__.get("_log_hyperparams", True)


#: the checkpoint keys of a module's and a datamodule's hyperparameters (Lightning's):
#: (values, the name of the init argument they came in as one container)
MODULE_KEYS = ("hyper_parameters", "hparams_name")
DATAMODULE_KEYS = ("datamodule_hyper_parameters", "datamodule_hparams_name")


def checkpoint_entries(obj: Any, keys: tuple[str, str]) -> dict[str, Any]:
    """What a checkpoint holds of ``obj``'s hyperparameters, under ``keys``: the saved values
    and, when they were recorded from one container argument
    (``save_hyperparameters(config)``), that argument's name."""
    entries = {keys[0]: saved_hyperparameters(obj.hparams)}
    name = obj.__dict__.get("_hparams_name")
    if name is not None:
        entries[keys[1]] = name
    return entries


def init_arguments_from(cls: type, checkpoint: Mapping[str, Any], keys: tuple[str, str],
                        overrides: Mapping[str, Any],
                        hparams_file: Any = None) -> dict[str, Any]:
    """The keyword arguments that rebuild ``cls`` from a checkpoint's hyperparameters (under
    ``keys``), as ``load_from_checkpoint`` takes them: those of ``hparams_file`` (a YAML or
    TOML file, as the loggers write them) replace the checkpoint's; values recorded from one
    container argument go back into that argument, when it is a named one (a name that is
    ``__init__``'s ``*args`` or ``**kwargs``, as pytorch-forecasting's checkpoints hold, passes
    them as keywords, as Lightning does); ``overrides`` replace or add init arguments; and
    those ``__init__`` does not take are left out unless it has ``**kwargs``."""
    saved = restored_hyperparameters(checkpoint.get(keys[0]))
    if hparams_file is not None:
        saved.update(read_hyperparameters_file(hparams_file))
    params = inspect.signature(cls).parameters
    name = checkpoint.get(keys[1])
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    if name is not None and name in params and params[name].kind not in variadic:
        arguments = {name: saved, **overrides}
    else:
        arguments = {**saved, **overrides}
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        # hyperparameters recorded by a base class's __init__ that this class does not take
        arguments = {k: v for k, v in arguments.items() if k in params}
    return arguments


def loading_arguments(cls: type, checkpoint: Mapping[str, Any], keys: tuple[str, str],
                      overrides: Mapping[str, Any], hparams_file: Any = None) -> dict[str, Any]:
    """:func:`init_arguments_from`, for ``load_from_checkpoint``: a required init argument that
    neither the checkpoint nor ``overrides`` gives (a value checkpoints can't hold, such as an
    ``nn.Module``, is left out of them) is a ``TypeError`` that names it and the fix, before
    ``cls`` is called."""
    arguments = init_arguments_from(cls, checkpoint, keys, overrides, hparams_file)
    missing = unset_arguments(cls, arguments, required=True)
    if missing:
        s = "s" if len(missing) > 1 else ""
        raise TypeError(
            f"{cls.__qualname__}.load_from_checkpoint: the checkpoint holds no value for its "
            f"required init argument{s} {', '.join(missing)} (a hyperparameter checkpoints "
            f"can't hold, such as an nn.Module, is left out of them, or it was never saved). "
            f"Pass {'them' if s else 'it'}: {cls.__qualname__}.load_from_checkpoint(path, "
            f"{', '.join(f'{m}=...' for m in missing)}).")
    return arguments


def unset_arguments(cls: type, arguments: Mapping[str, Any], required: bool) -> list[str]:
    """The named init arguments of ``cls`` that ``arguments`` does not give: those without a
    default (``required``), or those with one (``cls(**arguments)`` uses their defaults)."""
    return [name for name, p in inspect.signature(cls).parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and (p.default is p.empty) == required and name not in arguments]


def read_hyperparameters_file(path: Any) -> dict[str, Any]:
    """The hyperparameters in a ``hparams.yaml`` (Lightning's loggers) or ``hparams.toml``
    (ptrain's run folder) file."""
    import pathlib

    path = pathlib.Path(path)
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ModelError(f"reading {str(path)!r} needs PyYAML: pip install pyyaml (or "
                             f"pass the run folder's hparams.toml).") from None
        loaded = yaml.safe_load(path.read_text()) or {}
    elif path.suffix == ".toml":
        from ptrain.config import tomllib

        loaded = tomllib.loads(path.read_text())
    else:
        raise ModelError(f"hparams_file={str(path)!r}: give a .yaml file (Lightning's loggers "
                         f"write hparams.yaml) or ptrain's hparams.toml.")
    if not isinstance(loaded, dict):
        raise ModelError(f"{str(path)!r} holds {type(loaded).__qualname__}, not a mapping of "
                         f"hyperparameter names to values.")
    return loaded
