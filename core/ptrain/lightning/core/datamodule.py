"""``lightning.pytorch.core.datamodule``: ``LightningDataModule`` is :class:`ptrain.DataModule`."""

from ptrain.module import DataModule as LightningDataModule

__all__ = ["LightningDataModule"]
