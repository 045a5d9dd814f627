"""``lightning.pytorch.core``: the module and datamodule base classes (also from
``core.module`` and ``core.datamodule``, as in Lightning)."""

from ptrain.lightning.core.datamodule import LightningDataModule
from ptrain.lightning.core.module import LightningModule

__all__ = ["LightningDataModule", "LightningModule"]
