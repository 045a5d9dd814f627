"""``LearningRateMonitor`` over the ``ptrain-lr-monitor`` plugin (the same arguments)."""

from ptrain_lr_monitor import LearningRateMonitor

__all__ = ["LearningRateMonitor"]
