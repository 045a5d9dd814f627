"""The module the strategy wraps: it routes a wrapper's ``forward`` to the user's step methods."""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from ptrain.module import TrainModule


class StepModule(nn.Module):
    """``forward(stage, batch, batch_idx)`` runs the user's ``training_step``,
    ``validation_step``, ``test_step`` or ``predict_step`` (``stage`` ``"train"``,
    ``"validate"``, ``"test"`` or ``"predict"``).

    Strategies wrap this module (DDP, FSDP), not the user's: a wrapper that acts in ``forward``
    then sees every step, while the user's own ``forward`` stays free for inference. Its state
    dict is the user's module's, under the prefix ``module.``.
    """

    def __init__(self, module: TrainModule):
        super().__init__()
        self.module = module
        # plain attributes: reading them per step skips nn.Module.__getattr__
        self.__dict__["_steps"] = {stage: _step_caller(getattr(module, method))
                                   for stage, method in STEP_METHODS.items()
                                   if getattr(module, method, None) is not None}

    def forward(self, stage: str, batch: Any, batch_idx: int) -> Any:
        return self._steps[stage](batch, batch_idx)


#: stage -> the module's method for one batch of it
STEP_METHODS = {"train": "training_step", "validate": "validation_step", "test": "test_step",
                "predict": "predict_step"}


def _step_caller(method: Any) -> Any:
    """``method`` itself when it takes ``(batch, batch_idx)``; a caller that drops ``batch_idx``
    for one written as ``(self, batch)`` (Lightning allows both)."""
    positional = [p for p in inspect.signature(method).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in positional):
        return method
    return lambda batch, batch_idx: method(batch)
