"""Reading what ``TrainModule.configure_optimizers`` returns."""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from ptrain.errors import ConfigError, ModelError
from ptrain.hook_methods import overridden

_FORMS = (
    "an optimizer; {'optimizer': opt, 'lr_scheduler': sched, 'monitor': metric name}; a list "
    "or tuple of optimizers, or of such dicts; ([optimizers], [schedulers]). A scheduler may "
    "be a dict {'scheduler': s, 'interval': 'step' | 'epoch', 'frequency': n, 'monitor': "
    "metric name, 'strict': bool, 'name': str}"
)
#: the keys of the dict form of one optimizer's setup
_SETUP_KEYS = {"optimizer", "lr_scheduler", "monitor"}
#: the keys of a scheduler's dict
_SCHEDULER_KEYS = {"scheduler", "interval", "frequency", "name", "monitor", "strict",
                   "reduce_on_plateau"}


class OptimizerConfigError(ModelError, ConfigError):
    """What ``configure_optimizers`` returned can't be used (Lightning raises its
    ``MisconfigurationException``, which is ptrain's :class:`ConfigError`, for these)."""


@dataclass
class OptimizerSetup:
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    #: each: {"scheduler": LRScheduler, "interval": "step" | "epoch", "frequency": int,
    #: "monitor", "strict", "name", "reduce_on_plateau", "step"}
    lr_schedulers: list[dict[str, Any]] = field(default_factory=list)


def _warn_unknown(unknown: set[str], where: str) -> None:
    warnings.warn(f"{where} has keys ptrain does not know, which are ignored: "
                  f"{sorted(unknown)}; expected {_FORMS}.", RuntimeWarning, stacklevel=4)


def _scheduler_entry(value: Any, monitor: str | None, automatic: bool) -> dict[str, Any]:
    """One scheduler's entry; ``monitor`` is the one given beside the optimizer (Lightning's
    top-level ``"monitor"``), used when the scheduler's own dict names none. Under manual
    optimization (``automatic`` false) the module steps it itself: only ``scheduler`` counts,
    and the other keys are said to be ignored."""
    entry = dict(value) if isinstance(value, dict) else {"scheduler": value}
    if "scheduler" not in entry:
        raise OptimizerConfigError(
            f"a scheduler dict needs the key 'scheduler' (the scheduler object); got keys "
            f"{sorted(entry)}. Expected {_FORMS}.")
    unknown = set(entry) - _SCHEDULER_KEYS
    if unknown:
        _warn_unknown(unknown, "a scheduler dict")
    scheduler = entry["scheduler"]
    if not automatic and set(entry) - {"scheduler", "name"}:
        warnings.warn(f"under manual optimization the module steps its schedulers itself, so "
                      f"these keys of its scheduler dict are ignored: "
                      f"{sorted(set(entry) - {'scheduler', 'name'})}.", RuntimeWarning,
                      stacklevel=4)
    entry.setdefault("interval", "epoch")
    entry.setdefault("frequency", 1)
    entry.setdefault("name", None)
    if entry.get("monitor") is None:
        entry["monitor"] = monitor
    entry.setdefault("strict", True)
    entry["reduce_on_plateau"] = bool(entry.get("reduce_on_plateau")) or isinstance(
        scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    entry["step"] = None  # or the module's lr_scheduler_step (see configure_optimizers)
    for method in ("state_dict", "load_state_dict"):
        if not callable(getattr(scheduler, method, None)):
            raise OptimizerConfigError(
                f"the scheduler {type(scheduler).__qualname__} has no {method}() method, so its "
                f"state can't go into checkpoints; give it state_dict() and load_state_dict(), "
                f"as torch's schedulers have.")
    if not automatic:
        return entry
    if entry["reduce_on_plateau"] and entry["monitor"] is None:
        raise OptimizerConfigError(
            "ReduceLROnPlateau steps on a metric: return it as {'optimizer': opt, "
            "'lr_scheduler': {'scheduler': sched, 'monitor': 'val_loss'}} with the name of a "
            "metric you log.")
    if entry["interval"] not in ("step", "epoch"):
        raise OptimizerConfigError(f"scheduler interval must be 'step' or 'epoch', got "
                                   f"{entry['interval']!r}.")
    if not callable(getattr(scheduler, "step", None)) or not hasattr(scheduler, "optimizer"):
        raise OptimizerConfigError(
            f"{type(scheduler).__qualname__} is not an LR scheduler: the run steps its "
            f"schedulers with scheduler.step() (scheduler.step(metric) with a monitor), and "
            f"finds its optimizer as scheduler.optimizer. Override lr_scheduler_step(scheduler, "
            f"metric) to step one of your own, or step it yourself under manual optimization.")
    return entry


def step_scheduler(entry: dict[str, Any], metrics: dict[str, Any]) -> None:
    """Step the scheduler of ``entry``; one with a ``monitor`` steps on that metric's value
    (one host sync: schedulers step per epoch, or per step only when configured so). A monitor
    that was not logged is an :class:`OptimizerConfigError` with ``strict`` (the default), else a warning
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
            raise OptimizerConfigError(message + " (or set 'strict': False to skip the step).")
        warnings.warn(message + "; the scheduler was not stepped.", RuntimeWarning, stacklevel=2)
        return
    if entry["step"] is not None:
        entry["step"](entry["scheduler"], value)
    else:
        entry["scheduler"].step(float(value))


def configure_optimizers(module: Any, base: type | None = None) -> OptimizerSetup:
    """Call ``module.configure_optimizers()`` and normalise its result. When ``module``
    overrides ``lr_scheduler_step`` (the method ``base``, its base class, defines; also on the
    instance), every scheduler is stepped through it."""
    result = module.configure_optimizers()
    automatic = getattr(module, "automatic_optimization", True)
    stepped_by_module = base is not None and overridden(module, ("lr_scheduler_step",), base)
    setup = OptimizerSetup()

    def add(item: Any) -> None:
        if isinstance(item, torch.optim.Optimizer):
            setup.optimizers.append(item)
        elif isinstance(item, dict) and isinstance(item.get("optimizer"), torch.optim.Optimizer):
            unknown = set(item) - _SETUP_KEYS
            if unknown:
                _warn_unknown(unknown, "the dict configure_optimizers returned")
            setup.optimizers.append(item["optimizer"])
            if item.get("lr_scheduler") is not None:
                setup.lr_schedulers.append(_scheduler_entry(
                    item["lr_scheduler"], item.get("monitor"), automatic or stepped_by_module))
        else:
            raise OptimizerConfigError(f"configure_optimizers returned "
                                       f"{type(item).__qualname__}; expected {_FORMS}.")

    if (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], (list, tuple))
            and not isinstance(result[1], torch.optim.Optimizer)
            and not (isinstance(result[1], dict) and "optimizer" in result[1])):
        for optimizer in result[0]:
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise OptimizerConfigError(f"configure_optimizers returned ([...], [...]) whose "
                                           f"first list holds {type(optimizer).__qualname__}; "
                                           f"expected {_FORMS}.")
            add(optimizer)
        schedulers = result[1] if isinstance(result[1], (list, tuple)) else [result[1]]
        setup.lr_schedulers.extend(_scheduler_entry(s, None, automatic or stepped_by_module)
                                   for s in schedulers)
    elif isinstance(result, (list, tuple)):
        kinds = {isinstance(item, dict) for item in result}
        if len(kinds) > 1:
            raise OptimizerConfigError(
                f"configure_optimizers returned a {type(result).__name__} mixing optimizers and "
                f"dicts; return optimizers only or dicts only. Expected {_FORMS}.")
        for item in result:
            add(item)
    elif result is not None:
        add(result)
    if not setup.optimizers:
        raise OptimizerConfigError(f"configure_optimizers returned no optimizer ({result!r}); "
                                   f"expected {_FORMS}.")
    for entry in setup.lr_schedulers:
        optimizer = getattr(entry["scheduler"], "optimizer", None)
        if optimizer is not None and not any(optimizer is o for o in setup.optimizers):
            raise OptimizerConfigError(
                f"the scheduler {type(entry['scheduler']).__qualname__} steps an optimizer that "
                f"configure_optimizers did not return, so that optimizer would never train and "
                f"the scheduler would change nothing that trains. Return its optimizer too, or "
                f"build the scheduler on one of those returned.")
        if stepped_by_module:
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


def check_gradients_reach(optimizers: list[torch.optim.Optimizer], module: Any,
                          stop: bool = True) -> None:
    """Called once, before a fit's first optimizer step under automatic optimization: the
    optimizer's trainable parameters must have got a gradient from the loss, or every step
    changes nothing (say, an optimizer over a registered submodule the loss never uses), and
    the run would end as if it had trained. A :class:`ModelError` naming them, the fix, and
    that nothing was stepped; with ``stop=False`` the same paragraph as a warning, and the fit
    goes on. Automatic optimization steps one optimizer, so nothing else would train. Reads
    ``.grad is not None`` only: no device sync."""
    names = {id(p): name for name, p in module.named_parameters()}
    for index, optimizer in enumerate(optimizers):
        trainable = [p for group in optimizer.param_groups for p in group["params"]
                     if p.requires_grad]
        if not trainable or any(p.grad is not None for p in trainable):
            continue
        listed = [names.get(id(p), "?") for p in trainable]
        shown = ", ".join(listed[:3]) + (f" and {len(listed) - 3} more" if len(listed) > 3
                                         else "")
        what = (f"optimizer {index} ({type(optimizer).__name__}) holds {len(listed)} trainable "
                f"parameter(s) of {type(module).__qualname__} ({shown}) and none of them got a "
                f"gradient from the first batch's loss: the loss does not use them. Give "
                f"configure_optimizers the parameters the loss uses (self.parameters()), or use "
                f"those parameters in training_step.")
        if stop:
            raise ModelError(f"{what} Nothing would train, so the fit stops before its first "
                             f"step.")
        warnings.warn(f"{what} The fit goes on; its steps change nothing until a loss uses "
                      f"them.", stacklevel=2)
