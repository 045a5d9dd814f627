"""``lightning.pytorch.core``: the module and datamodule base classes."""

from ptrain.module import DataModule as LightningDataModule
from ptrain.module import TrainModule as LightningModule

__all__ = ["LightningDataModule", "LightningModule"]
