"""``lightning.pytorch.strategies.ddp``: the module Lightning defines ``DDPStrategy`` in
(see :mod:`ptrain.lightning.strategies`)."""

from ptrain.lightning.strategies import DDPStrategy

__all__ = ["DDPStrategy"]
