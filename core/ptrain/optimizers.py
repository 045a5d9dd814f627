"""Reading what ``TrainModule.configure_optimizers`` returns."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from ptrain.errors import ModelError

_FORMS = (
    "an optimizer; {'optimizer': opt, 'lr_scheduler': sched}; ([optimizers], [schedulers]); or a "
    "list of such dicts. A scheduler may be a dict {'scheduler': s, 'interval': 'step' | 'epoch', "
    "'frequency': n}"
)


@dataclass
class OptimizerSetup:
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    #: each: {"scheduler": LRScheduler, "interval": "step" | "epoch", "frequency": int}
    lr_schedulers: list[dict[str, Any]] = field(default_factory=list)


def _scheduler_entry(value: Any) -> dict[str, Any]:
    entry = dict(value) if isinstance(value, dict) else {"scheduler": value}
    unknown = set(entry) - {"scheduler", "interval", "frequency", "name", "monitor"}
    if "scheduler" not in entry or unknown:
        raise ModelError(f"a scheduler dict needs 'scheduler' and may have 'interval' and "
                         f"'frequency'; got keys {sorted(entry)}.")
    entry.setdefault("interval", "epoch")
    entry.setdefault("frequency", 1)
    if entry["interval"] not in ("step", "epoch"):
        raise ModelError(f"scheduler interval must be 'step' or 'epoch', got "
                         f"{entry['interval']!r}.")
    if not hasattr(entry["scheduler"], "step") or not hasattr(entry["scheduler"], "optimizer"):
        raise ModelError(f"{type(entry['scheduler']).__qualname__} is not an LR scheduler.")
    return entry


def configure_optimizers(module: Any) -> OptimizerSetup:
    """Call ``module.configure_optimizers()`` and normalise its result."""
    result = module.configure_optimizers()
    setup = OptimizerSetup()

    def add(item: Any) -> None:
        if isinstance(item, torch.optim.Optimizer):
            setup.optimizers.append(item)
        elif isinstance(item, dict) and isinstance(item.get("optimizer"), torch.optim.Optimizer):
            setup.optimizers.append(item["optimizer"])
            if item.get("lr_scheduler") is not None:
                setup.lr_schedulers.append(_scheduler_entry(item["lr_scheduler"]))
        else:
            raise ModelError(f"configure_optimizers returned {type(item).__qualname__}; expected "
                             f"{_FORMS}.")

    if (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], (list, tuple))
            and isinstance(result[1], (list, tuple))):
        for optimizer in result[0]:
            add(optimizer)
        setup.lr_schedulers.extend(_scheduler_entry(s) for s in result[1])
    elif isinstance(result, (list, tuple)):
        for item in result:
            add(item)
    else:
        add(result)
    if not setup.optimizers:
        raise ModelError(f"configure_optimizers returned no optimizer; expected {_FORMS}.")
    return setup


def rebind_scheduler(scheduler: Any, optimizer: torch.optim.Optimizer) -> None:
    """Point ``scheduler`` at ``optimizer``, which replaced the one it was built on (ZeRO).

    A torch scheduler marks its optimizer's ``step`` so that it can warn when it is stepped
    before the optimizer; the replacement gets the same mark, else every run would warn that
    ``optimizer.step()`` "has been overridden". (Private attribute names of torch's scheduler:
    if they change, the cost is that warning, nothing else.)"""
    scheduler.optimizer = optimizer
    step = optimizer.step
    if getattr(step, "_wrapped_by_lr_sched", False):
        return

    @functools.wraps(step)
    def tracked_step(*args: Any, **kwargs: Any) -> Any:
        optimizer._opt_called = True
        return step(*args, **kwargs)

    tracked_step._wrapped_by_lr_sched = True
    optimizer.step = tracked_step
