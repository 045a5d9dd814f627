"""``lightning.pytorch.strategies.single_device``: the module Lightning defines
``SingleDeviceStrategy`` in (see :mod:`ptrain.lightning.strategies`)."""

from ptrain.lightning.strategies import SingleDeviceStrategy

__all__ = ["SingleDeviceStrategy"]
