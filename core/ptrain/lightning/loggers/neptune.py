"""``lightning.pytorch.loggers.neptune``: ``NeptuneLogger``, refused when made (ptrain has no plugin for
its service; see :mod:`ptrain.lightning.loggers`)."""

from ptrain.lightning.loggers import NeptuneLogger

__all__ = ["NeptuneLogger"]
