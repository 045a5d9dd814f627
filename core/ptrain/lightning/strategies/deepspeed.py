"""``lightning.pytorch.strategies.deepspeed``: the module Lightning defines ``DeepSpeedStrategy`` in
(see :mod:`ptrain.lightning.strategies`)."""

from ptrain.lightning.strategies import DeepSpeedStrategy

__all__ = ["DeepSpeedStrategy"]
