"""``lightning.pytorch.loggers.litlogger``: ``LitLogger``, refused when made (ptrain has no plugin for
its service; see :mod:`ptrain.lightning.loggers`)."""

from ptrain.lightning.loggers import LitLogger

__all__ = ["LitLogger"]
