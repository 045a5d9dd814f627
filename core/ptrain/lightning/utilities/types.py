"""The type names Lightning programs annotate with (``lightning.pytorch.utilities.types``):
what a step returns, what ``configure_optimizers`` may return, what dataloader hooks return.
They describe what ptrain accepts in the same places."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional, TypedDict, Union

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

try:
    from typing import NotRequired, Required  # Python 3.11
except ImportError:  # pragma: no cover - Python 3.10
    from typing_extensions import NotRequired, Required

#: what ``training_step`` & co. may return: a loss tensor, a dict holding ``"loss"``, or None
STEP_OUTPUT = Optional[Union[torch.Tensor, Mapping[str, Any]]]
#: what ``train_dataloader()`` / ``val_dataloader()`` & co. return: any iterable of batches
TRAIN_DATALOADERS = Any
EVAL_DATALOADERS = Any

LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerTypeUnion = Union[LRScheduler, ReduceLROnPlateau]
LRSchedulerType = Union[type[LRScheduler], type[ReduceLROnPlateau]]
LRSchedulerPLType = Union[LRScheduler, ReduceLROnPlateau]


@dataclass
class LRSchedulerConfig:
    """A scheduler with how it is stepped, as ``configure_optimizers``' ``lr_scheduler`` dict
    gives it."""

    scheduler: Union[LRScheduler, ReduceLROnPlateau]
    name: Optional[str] = None
    interval: str = "epoch"
    frequency: int = 1
    reduce_on_plateau: bool = False
    monitor: Optional[str] = None
    strict: bool = True


class LRSchedulerConfigType(TypedDict, total=False):
    scheduler: Required[LRSchedulerTypeUnion]
    name: Optional[str]
    interval: str
    frequency: int
    reduce_on_plateau: bool
    monitor: Optional[str]
    strict: bool


class OptimizerConfig(TypedDict):
    optimizer: Optimizer


class OptimizerLRSchedulerConfig(TypedDict):
    optimizer: Optimizer
    lr_scheduler: Union[LRSchedulerTypeUnion, LRSchedulerConfigType]
    monitor: NotRequired[str]


#: every shape ``configure_optimizers`` may return
OptimizerLRScheduler = Optional[Union[
    Optimizer,
    Sequence[Optimizer],
    tuple[Sequence[Optimizer], Sequence[Union[LRSchedulerTypeUnion, LRSchedulerConfig]]],
    OptimizerConfig,
    OptimizerLRSchedulerConfig,
    Sequence[OptimizerConfig],
    Sequence[OptimizerLRSchedulerConfig],
]]
