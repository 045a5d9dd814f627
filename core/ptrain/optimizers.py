"""Reading what ``TrainModule.configure_optimizers`` returns."""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from ptrain.errors import ModelError

_FORMS = (
    "an optimizer; {'optimizer': opt, 'lr_scheduler': sched, 'monitor': metric name}; "
    "([optimizers], [schedulers]); or a list of such dicts. A scheduler may be a dict "
    "{'scheduler': s, 'interval': 'step' | 'epoch', 'frequency': n, 'monitor': metric name, "
    "'strict': bool}"
)
#: the keys of the dict form of one optimizer's setup
_SETUP_KEYS = {"optimizer", "lr_scheduler", "monitor"}


@dataclass
class OptimizerSetup:
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    #: each: {"scheduler": LRScheduler, "interval": "step" | "epoch", "frequency": int}
    lr_schedulers: list[dict[str, Any]] = field(default_factory=list)


def _scheduler_entry(value: Any, monitor: str | None = None) -> dict[str, Any]:
    """One scheduler's entry; ``monitor`` is the one given beside the optimizer (Lightning's
    top-level ``"monitor"``), used when the scheduler's own dict names none."""
    entry = dict(value) if isinstance(value, dict) else {"scheduler": value}
    unknown = set(entry) - {"scheduler", "interval", "frequency", "name", "monitor", "strict",
                            "reduce_on_plateau"}
    if "scheduler" not in entry or unknown:
        raise ModelError(f"a scheduler dict needs 'scheduler' and may have 'interval', "
                         f"'frequency', 'monitor', 'strict', 'reduce_on_plateau' and 'name'; "
                         f"got keys {sorted(entry)}.")
    entry.setdefault("interval", "epoch")
    entry.setdefault("frequency", 1)
    if entry.get("monitor") is None:
        entry["monitor"] = monitor
    entry.setdefault("strict", True)
    on_plateau = entry.pop("reduce_on_plateau", None) or isinstance(
        entry["scheduler"], torch.optim.lr_scheduler.ReduceLROnPlateau)
    if on_plateau and entry["monitor"] is None:
        raise ModelError(
            "ReduceLROnPlateau steps on a metric: return it as {'optimizer': opt, "
            "'lr_scheduler': {'scheduler': sched, 'monitor': 'val_loss'}} with the name of a "
            "metric you log.")
    if entry["interval"] not in ("step", "epoch"):
        raise ModelError(f"scheduler interval must be 'step' or 'epoch', got "
                         f"{entry['interval']!r}.")
    if not hasattr(entry["scheduler"], "step") or not hasattr(entry["scheduler"], "optimizer"):
        raise ModelError(f"{type(entry['scheduler']).__qualname__} is not an LR scheduler.")
    entry["step"] = None  # or the module's lr_scheduler_step (see configure_optimizers)
    return entry


def step_scheduler(entry: dict[str, Any], metrics: dict[str, Any]) -> None:
    """Step the scheduler of ``entry``; one with a ``monitor`` steps on that metric's value
    (one host sync: schedulers step per epoch, or per step only when configured so). A monitor
    that was not logged is a :class:`ModelError` with ``strict`` (the default), else a warning
    and no step."""
    monitor = entry["monitor"]
    if monitor is None:
        if entry["step"] is not None:
            entry["step"](entry["scheduler"], None)
        else:
            entry["scheduler"].step()
        return
    value = metrics.get(monitor)
    if value is None:
        message = (f"the LR scheduler {type(entry['scheduler']).__name__} monitors {monitor!r}, "
                   f"which was not logged; logged metrics: {', '.join(sorted(metrics)) or '(none)'}"
                   f". Log it with self.log({monitor!r}, ...) or change 'monitor'")
        if entry["strict"]:
            raise ModelError(message + " (or set 'strict': False to skip the step).")
        warnings.warn(message + "; the scheduler was not stepped.", stacklevel=2)
        return
    if entry["step"] is not None:
        entry["step"](entry["scheduler"], value)
    else:
        entry["scheduler"].step(float(value))


def configure_optimizers(module: Any, base: type | None = None) -> OptimizerSetup:
    """Call ``module.configure_optimizers()`` and normalise its result. When ``module``
    overrides ``lr_scheduler_step`` (the method ``base``, its base class, defines), every
    scheduler is stepped through it."""
    result = module.configure_optimizers()
    setup = OptimizerSetup()

    def add(item: Any) -> None:
        if isinstance(item, torch.optim.Optimizer):
            setup.optimizers.append(item)
        elif isinstance(item, dict) and isinstance(item.get("optimizer"), torch.optim.Optimizer):
            unknown = set(item) - _SETUP_KEYS
            if unknown:
                raise ModelError(f"configure_optimizers returned a dict with keys "
                                 f"{sorted(unknown)}, which ptrain does not know; expected "
                                 f"{_FORMS}.")
            setup.optimizers.append(item["optimizer"])
            if item.get("lr_scheduler") is not None:
                setup.lr_schedulers.append(_scheduler_entry(item["lr_scheduler"],
                                                            item.get("monitor")))
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
    if base is not None and type(module).lr_scheduler_step is not base.lr_scheduler_step:
        for entry in setup.lr_schedulers:
            entry["step"] = module.lr_scheduler_step
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
