"""``lightning.pytorch.callbacks.callback``: ``Callback``, the base class of a program's callbacks
(ptrain's :class:`ptrain.hook_methods.Callback`)."""

from ptrain.hook_methods import Callback

__all__ = ["Callback"]
