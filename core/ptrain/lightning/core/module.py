"""``lightning.pytorch.core.module``: ``LightningModule`` is :class:`ptrain.TrainModule`."""

from ptrain.module import TrainModule as LightningModule

__all__ = ["LightningModule"]
