"""``lightning.pytorch.tuner.tuning``, the module Lightning defines ``Tuner`` in, which programs
import it from: the same class as ``ptrain.lightning.tuner.Tuner``."""

from __future__ import annotations

from ptrain.lightning.tuner import Tuner

__all__ = ["Tuner"]
