"""The module the strategy wraps: it routes a wrapper's ``forward`` to the user's step methods."""

from __future__ import annotations

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
        # a plain attribute as well: reading it per step skips nn.Module.__getattr__
        self.__dict__["_user_module"] = module

    def forward(self, stage: str, batch: Any, batch_idx: int) -> Any:
        module = self._user_module
        if stage == "train":
            return module.training_step(batch, batch_idx)
        if stage == "validate":
            return module.validation_step(batch, batch_idx)
        if stage == "test":
            return module.test_step(batch, batch_idx)
        return module.predict_step(batch, batch_idx)
