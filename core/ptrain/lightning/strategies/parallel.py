"""``lightning.pytorch.strategies.parallel``: the module Lightning defines ``ParallelStrategy`` in
(see :mod:`ptrain.lightning.strategies`)."""

from ptrain.lightning.strategies import ParallelStrategy

__all__ = ["ParallelStrategy"]
