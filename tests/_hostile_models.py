"""Modules for ``tests/test_hostile_inputs.py`` (issue 35, second round): each gets one thing
wrong that a user could write, and ptrain must name it or train as documented."""

from __future__ import annotations

import torch

from tests._input_models import Base


class NoOptimizers(Base):
    """``configure_optimizers`` returns an empty list."""

    def configure_optimizers(self):
        return []


class OptimizerIsAString(Base):
    """``configure_optimizers`` returns the optimizer's name instead of an optimizer."""

    def configure_optimizers(self):
        return "adam"


class SchedulerWithoutOptimizer(Base):
    """A dict with a scheduler but no ``"optimizer"`` key."""

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}
