"""``lightning.pytorch.trainer``: the ``Trainer`` (in ``trainer.trainer``, as in Lightning) and
the state enums of ``trainer.states``."""

from ptrain.lightning.trainer.trainer import Trainer

__all__ = ["Trainer"]
