"""What the adapters of ``ptrain.lightning`` share: the one message for a Lightning argument
ptrain does not take with that value, names that come from an optional distribution, and
submodules read as attributes of their package."""

from __future__ import annotations

import importlib
from typing import Any

from ptrain.errors import ConfigError


def refuse(owner: str, argument: str, value: Any, instead: str) -> ConfigError:
    """A :class:`ConfigError`: ``owner(argument=value)`` is not supported, and what to do."""
    return ConfigError(f"{owner}({argument}={value!r}) is not supported by ptrain, and ignoring "
                       f"it would silently change the run: {instead}. See \"Coming from "
                       f"Lightning\" in ptrain's documentation.")


def refuse_unless(owner: str, given: dict[str, Any], defaults: dict[str, tuple[Any, str]]) -> None:
    """Raise :func:`refuse` for the first argument in ``given`` whose value is not its accepted
    default (``defaults``: name -> (accepted value, what to do instead))."""
    for argument, (accepted, instead) in defaults.items():
        value = given.get(argument, accepted)
        if value != accepted or type(value) is not type(accepted):
            raise refuse(owner, argument, value, instead)


def submodule(namespace: str, name: str, submodules: tuple[str, ...]) -> Any:
    """A package ``__getattr__``'s answer for ``namespace.name`` where ``name`` is one of the
    package's ``submodules``: that module, imported now. Lightning's packages import their
    submodules, so a program may read ``pl.callbacks.early_stopping.EarlyStopping`` with no
    import of its own; ptrain's import them when first read. Any other name is an
    ``AttributeError``."""
    if name not in submodules:
        raise AttributeError(f"module {namespace!r} has no attribute {name!r}")
    return importlib.import_module(f"{namespace}.{name}")


def from_distribution(namespace: str, name: str,
                      table: dict[str, tuple[str, str, str]]) -> Any:
    """A module ``__getattr__``'s answer for ``namespace.name``: the object ``table[name]``
    names (``(distribution, module, attribute)``), imported now; an ``ImportError`` naming the
    distribution to install when it is missing."""
    if name not in table:
        raise AttributeError(f"module {namespace!r} has no attribute {name!r}")
    distribution, module, attribute = table[name]
    try:
        return getattr(importlib.import_module(module), attribute)
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith("ptrain_"):
            raise
        raise ImportError(f"{namespace}.{name} comes with the {distribution} distribution, which "
                          f"is not installed: pip install {distribution}") from None
