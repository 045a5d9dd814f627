"""The one message for a Lightning argument ptrain does not take with that value."""

from __future__ import annotations

from typing import Any

from ptrain.errors import ConfigError


def refuse(owner: str, argument: str, value: Any, instead: str) -> ConfigError:
    """A :class:`ConfigError`: ``owner(argument=value)`` is not supported, and what to do."""
    return ConfigError(f"{owner}({argument}={value!r}) is not supported by ptrain, and ignoring "
                       f"it would silently change the run: {instead}. See "
                       f"docs/from-lightning.md.")


def refuse_unless(owner: str, given: dict[str, Any], defaults: dict[str, tuple[Any, str]]) -> None:
    """Raise :func:`refuse` for the first argument in ``given`` whose value is not its accepted
    default (``defaults``: name -> (accepted value, what to do instead))."""
    for argument, (accepted, instead) in defaults.items():
        value = given.get(argument, accepted)
        if value != accepted or type(value) is not type(accepted):
            raise refuse(owner, argument, value, instead)
