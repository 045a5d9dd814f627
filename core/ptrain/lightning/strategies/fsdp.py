"""``lightning.pytorch.strategies.fsdp``: the module Lightning defines ``FSDPStrategy`` in
(see :mod:`ptrain.lightning.strategies`)."""

from ptrain.lightning.strategies import FSDPStrategy

__all__ = ["FSDPStrategy"]
