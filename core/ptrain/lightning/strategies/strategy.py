"""``lightning.pytorch.strategies.strategy``: the module Lightning defines ``Strategy`` in
(see :mod:`ptrain.lightning.strategies`)."""

from ptrain.lightning.strategies import Strategy

__all__ = ["Strategy"]
