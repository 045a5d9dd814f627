"""The ``32-true`` precision: float32 parameters and computation, no autocast, no scaler."""

from __future__ import annotations

import torch

from ptrain.hookspecs import hookimpl
from ptrain.precision_policy import PrecisionPolicy


class FullPrecision:
    """The default precision; the reference other precisions are measured against."""

    @hookimpl
    def precision_policy(self) -> PrecisionPolicy:
        return PrecisionPolicy(torch.float32, torch.float32, torch.float32)
