"""A tiny module for ``tests/plugins/callbacks/test_profiler.py`` (importable, so that ddp workers
can unpickle it)."""

from __future__ import annotations

import torch

from tests.conftest import TinyRegressor

USER_REGION = "user.loss"


class ProfiledRegressor(TinyRegressor):
    """``TinyRegressor`` (64 samples in batches of 8: 8 training batches per epoch) whose training
    step labels its loss with a user region, notes per training batch whether a profiler is
    collecting (``enabled``), and raises ``RuntimeError`` at training batch ``fail_at`` (counted
    across epochs) when given."""

    def __init__(self, fail_at: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.fail_at = fail_at
        self.enabled: list[bool] = []

    def training_step(self, batch, batch_idx):
        self.enabled.append(torch.autograd._profiler_enabled())
        if self.fail_at is not None and len(self.enabled) - 1 == self.fail_at:
            raise RuntimeError(f"failing on purpose at step {self.fail_at}")
        with torch.profiler.record_function(USER_REGION):
            return super().training_step(batch, batch_idx)
