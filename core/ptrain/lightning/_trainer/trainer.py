"""``lightning.pytorch.trainer.trainer``'s ``Trainer``: the same class as
``ptrain.lightning.Trainer``."""

from ptrain.lightning.trainer import Trainer

__all__ = ["Trainer"]
