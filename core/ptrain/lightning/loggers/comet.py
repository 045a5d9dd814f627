"""``lightning.pytorch.loggers.comet``: ``CometLogger``, refused when made (ptrain has no plugin for
its service; see :mod:`ptrain.lightning.loggers`)."""

from ptrain.lightning.loggers import CometLogger

__all__ = ["CometLogger"]
