"""Setting a value a finder found where a Lightning program keeps it: an attribute of the module
or its ``hparams``, or of the datamodule or its ``hparams``, as Lightning's finders do."""

from __future__ import annotations

from typing import Any


def set_found_value(trainer: Any, names: tuple[str, ...], value: Any) -> str | None:
    """Set the first of ``names`` found on the module, its hparams, the datamodule or its
    hparams to ``value``; the name set, or ``None`` when none is there."""
    for name in names:
        for owner in (trainer.module, trainer.datamodule):
            if owner is None:
                continue
            if name in getattr(owner, "hparams", {}):
                owner.hparams[name] = value
                if hasattr(owner, name):
                    setattr(owner, name, value)
                return name
            if hasattr(owner, name):
                setattr(owner, name, value)
                return name
    return None
