"""``lightning.pytorch.callbacks.lr_monitor``: ``LearningRateMonitor``, from the
``ptrain-lr-monitor`` distribution (importing it without that distribution is an
``ImportError`` naming it)."""

from __future__ import annotations

from typing import Any

from ptrain.lightning._common import from_distribution


def __getattr__(name: str) -> Any:
    return from_distribution(__name__, name, _FROM_DISTRIBUTIONS)


_FROM_DISTRIBUTIONS = {
    "LearningRateMonitor": ("ptrain-lr-monitor", "ptrain_lr_monitor", "LearningRateMonitor")}

__all__ = [*_FROM_DISTRIBUTIONS]
