"""``lightning.pytorch.callbacks.checkpoint``: ``Checkpoint``, the base class of the callbacks
that write checkpoints."""

from __future__ import annotations

import abc

from ptrain.builtins.checkpoint import ModelCheckpoint as _BuiltinCheckpoint
from ptrain.hook_methods import Callback


class Checkpoint(Callback, metaclass=abc.ABCMeta):
    """Lightning's ``Checkpoint``: a :class:`~ptrain.hook_methods.Callback` to subclass for a
    callback that writes checkpoints. ``isinstance(callback, Checkpoint)`` holds for ptrain's
    ``checkpoint`` callback (``ModelCheckpoint``, ``trainer.checkpoint_callback``) and for
    ``OnExceptionCheckpoint``, as in Lightning."""


Checkpoint.register(_BuiltinCheckpoint)

__all__ = ["Checkpoint"]
