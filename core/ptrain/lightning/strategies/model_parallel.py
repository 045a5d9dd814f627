"""``lightning.pytorch.strategies.model_parallel``: the module Lightning defines
``ModelParallelStrategy`` in (see :mod:`ptrain.lightning.strategies`)."""

from ptrain.lightning.strategies import ModelParallelStrategy

__all__ = ["ModelParallelStrategy"]
