"""The module the strategy wraps: it routes a wrapper's ``forward`` to the user's step methods."""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from ptrain.module import TrainModule


class StepModule(nn.Module):
    """``forward(stage, batch, batch_idx)`` runs the user's ``training_step``,
    ``validation_step``, ``test_step`` or ``predict_step`` (``stage`` ``"train"``,
    ``"validate"``, ``"test"`` or ``"predict"``); an evaluation step also gets the trainer's
    ``dataloader_idx`` as its third argument while one of several dataloaders runs.

    Strategies wrap this module (DDP, FSDP), not the user's: a wrapper that acts in ``forward``
    then sees every step, while the user's own ``forward`` stays free for inference. Its state
    dict is the user's module's, under the prefix ``module.``.
    """

    def __init__(self, module: TrainModule):
        super().__init__()
        self.module = module
        # plain attributes: reading them per step skips nn.Module.__getattr__
        self.__dict__["_steps"] = {
            stage: (_step_caller(getattr(module, method)) if stage == "train"
                    else _evaluation_caller(module, getattr(module, method)))
            for stage, method in STEP_METHODS.items() if getattr(module, method, None) is not None}

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


def takes_dataloader_idx(method: Any) -> tuple[bool, bool]:
    """Whether ``method`` (a bound step or batch-hook method) can take a ``dataloader_idx``
    argument (a parameter of that name, or ``*args``), and whether it requires one."""
    parameters = inspect.signature(method).parameters
    named = parameters.get("dataloader_idx")
    if named is not None:
        return True, named.default is inspect.Parameter.empty and named.kind not in (
            named.VAR_POSITIONAL, named.VAR_KEYWORD)
    return any(p.kind is p.VAR_POSITIONAL for p in parameters.values()), False


def _evaluation_caller(module: TrainModule, method: Any) -> Any:
    """The caller of an evaluation step: :func:`_step_caller`'s, with the trainer's
    ``dataloader_idx`` added as the third argument while one of several dataloaders runs (the
    loop checks beforehand that the method takes it)."""
    plain = _step_caller(method)

    def call(batch: Any, batch_idx: int) -> Any:
        index = module._trainer.dataloader_idx
        if index is None:
            return plain(batch, batch_idx)
        return method(batch, batch_idx, index)

    return call