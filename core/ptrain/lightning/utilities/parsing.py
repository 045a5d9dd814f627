"""``AttributeDict`` (a dict read and written with dots), ``is_picklable`` and the init-argument
readers ``get_init_args``, ``collect_init_args`` and ``parse_class_init_keys``, as Lightning's
``lightning.pytorch.utilities.parsing`` has them (pytorch-forecasting's models read their
``__init__`` arguments with ``get_init_args(inspect.currentframe())``)."""

from __future__ import annotations

import inspect
import pickle
from types import FrameType
from typing import Any, Optional


class AttributeDict(dict):
    """A dict whose keys are also attributes: ``d.lr`` reads ``d["lr"]``, ``d.lr = 0.1`` writes
    it, ``del d.lr`` removes it. Its ``repr`` lists one ``"key": value`` line per key, sorted,
    values aligned (empty text for an empty dict), as Lightning prints hyperparameters."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as missing:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute "
                                 f"'{key}'") from missing

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        del self[key]

    def __repr__(self) -> str:
        if not self:
            return ""
        width = max(len(str(key)) for key in self) + 3
        return "\n".join(f"{chr(34) + str(key) + chr(34) + ':':{width}s} {self[key]}"
                         for key in sorted(self))


def is_picklable(obj: object) -> bool:
    """Whether ``pickle.dumps(obj)`` succeeds (``False`` for the errors an unpicklable object
    raises: a lambda, a lock, an open file...)."""
    try:
        pickle.dumps(obj)
    except (pickle.PickleError, AttributeError, RuntimeError, TypeError):
        return False
    return True


def parse_class_init_keys(cls: type) -> tuple[str, Optional[str], Optional[str]]:
    """The names of ``cls.__init__``'s first parameter (``self``), of its ``*args`` and of its
    ``**kwargs`` parameters (``None`` for one it does not have)."""
    params = list(inspect.signature(cls.__init__).parameters.values())
    if not params:
        raise TypeError(f"{cls.__qualname__}.__init__ takes no arguments, not even self")
    kinds = {p.kind: p.name for p in params[1:]}
    return (params[0].name, kinds.get(inspect.Parameter.VAR_POSITIONAL),
            kinds.get(inspect.Parameter.VAR_KEYWORD))


def get_init_args(frame: FrameType) -> dict[str, Any]:
    """The arguments of the ``__init__`` running in ``frame`` (``inspect.currentframe()``
    called there), by name, with its ``**kwargs`` spread in and without ``self`` and
    ``*args``. The class is the frame's ``__class__`` cell, which Python makes for a method
    that calls ``super()``; a frame without one gives ``{}``."""
    local = frame.f_locals
    if "__class__" not in local:
        return {}
    cls = local["__class__"]
    self_name, args_name, kwargs_name = parse_class_init_keys(cls)
    left_out = {self_name, args_name, kwargs_name, "__class__", "frame", "frame_args"}
    found = {name: local[name] for name in inspect.signature(cls.__init__).parameters}
    if kwargs_name:
        found.update(found.get(kwargs_name, {}))
    return {name: value for name, value in found.items() if name not in left_out}


def collect_init_args(frame: FrameType, path_args: list[dict[str, Any]], inside: bool = False,
                      classes: tuple[type, ...] = ()) -> list[dict[str, Any]]:
    """Append to ``path_args`` the :func:`get_init_args` of ``frame`` and of each caller's
    frame, outward, while they are ``__init__`` frames of a class (whose object is one of
    ``classes``, when given); frames before the first such one are skipped. Returns
    ``path_args``, outermost last."""
    while frame is not None:
        local = frame.f_locals
        if "__class__" in local and (not classes or isinstance(
                local.get(parse_class_init_keys(local["__class__"])[0]), classes)):
            path_args.append(get_init_args(frame))
            inside = True
        elif inside:
            break
        frame = frame.f_back
    return path_args
