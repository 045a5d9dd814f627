"""What both finders share: the ``then`` option, ending a run before its first epoch, reporting,
and changing the learning rates of every param group by one factor."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import torch

from ptrain import ConfigError, hookimpl

log = logging.getLogger("ptrain_finders")

THEN = ("fit", "stop")


class Finder:
    """Base of the finder callbacks: ``then="fit"`` trains after the search, ``then="stop"`` ends
    the run right after it (nothing trained, no checkpoint written).

    Ending the run: the loop runs epochs while ``current epoch < max_epochs``; the finder sets
    ``trainer.max_epochs = 0`` for this run (the loop then ends before its first epoch, with no
    step, no validation and no ``on_epoch_end``, so the checkpoint callback writes nothing, also
    into a resumed run's folder) and puts the value back in ``teardown``. ``should_stop`` can't
    do it: the loop clears it when it starts."""

    #: the plugin's name (the entry point's), used when it is given as an object from Python
    name = "finder"
    #: whether :meth:`report` prints its line (it logs it always); off for a search run for
    #: someone who says what the search found in words of their own (the Lightning Tuner)
    prints = True

    def __init__(self, then: str = "fit"):
        if then not in THEN:
            raise ConfigError(f"{self.name}: then={then!r} is not one of {', '.join(THEN)}: "
                              f"'fit' trains after the search, 'stop' ends the run after it.")
        self.then = then
        self._max_epochs_before: tuple[Any] | None = None
        #: what a checkpoint of this run held for this finder (set when resuming)
        self.resumed_state: dict[str, Any] | None = None
        #: whether this fit resumes from a checkpoint, whatever it holds of this finder (set by
        #: :meth:`applied_optimizer_settings`, which fires on every resume of ``fit``)
        self.resuming = False

    @staticmethod
    def add_then_option(options: Any) -> None:
        options.add("then", str, default="fit", choices=THEN,
                    help="fit: train after the search with its result; stop: end the run "
                         "after it (nothing trained, no checkpoint written)")

    def stop_before_training(self, trainer: Any) -> None:
        self._max_epochs_before = (trainer.max_epochs,)
        trainer.max_epochs = 0

    @hookimpl
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resumed_state = dict(state)

    @hookimpl
    def applied_optimizer_settings(self, trainer: Any,
                                   settings: list[list[dict[str, Any]]]) -> None:
        """Fires on every resume of ``fit`` (after every ``load_state_dict``, before ``setup``),
        also when the checkpoint holds nothing of this finder: the run resumes. A finder that
        applies optimizer settings itself extends it (and calls this)."""
        self.resuming = True

    @hookimpl
    def teardown(self, trainer: Any) -> None:
        if self._max_epochs_before is not None:
            trainer.max_epochs = self._max_epochs_before[0]
            self._max_epochs_before = None
        self.resumed_state = None
        self.resuming = False

    @staticmethod
    def finders(trainer: Any) -> tuple[Any, ...]:
        """The run's finder plugins: their own state is the search's result, not training
        state, so a snapshot leaves it out."""
        return tuple(p for p in trainer.plugins.values() if isinstance(p, Finder))

    def report(self, trainer: Any, line: str) -> None:
        """Print ``line`` once (global rank 0; unless :attr:`prints` is off) and log it."""
        if trainer.is_global_zero:
            log.info(line)
            if self.prints:
                print(line, flush=True)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, allow_nan=True) + "\n", encoding="utf-8")


# -- learning rates ---------------------------------------------------------------------------


def base_lr(group: dict[str, Any]) -> float:
    """The learning rate a param group was configured with: ``initial_lr`` where a scheduler
    recorded it (its ``lr`` may already be warmed down), else ``lr``."""
    return float(group.get("initial_lr", group["lr"]))


def set_lr(group: dict[str, Any], value: float) -> None:
    if isinstance(group["lr"], torch.Tensor):  # a tensor lr (capturable/fused optimizers)
        group["lr"].fill_(value)
    else:
        group["lr"] = value


#: Schedulers whose learning rates come from their own settings (``max_lr``), not from the
#: param groups' initial LR, so that scaling the initial LR would not scale the schedule.
_OWN_LR_SCHEDULERS = (torch.optim.lr_scheduler.OneCycleLR, torch.optim.lr_scheduler.CyclicLR)


def _nested(scheduler: Any) -> list[Any]:
    """``scheduler`` and the schedulers it chains (SequentialLR, ChainedScheduler)."""
    found = [scheduler]
    for child in getattr(scheduler, "_schedulers", []) or []:
        found.extend(_nested(child))
    return found


def check_scalable(trainer: Any, who: str, fix: str) -> None:
    """Raise :class:`ConfigError` when a scheduler sets its own learning rates (see above)."""
    for entry in trainer.lr_schedulers:
        for scheduler in _nested(entry["scheduler"]):
            if isinstance(scheduler, _OWN_LR_SCHEDULERS):
                raise ConfigError(
                    f"{who}: the module's {type(scheduler).__name__} computes its learning rates "
                    f"from its own max_lr/base_lr settings, which {who} can't rescale; {fix}.")


def scale_learning_rates(trainer: Any, factor: float) -> None:
    """Multiply the learning rate of every param group of every optimizer by ``factor``, and
    what schedulers derive it from (``initial_lr``, ``base_lrs``, the last LR they report), so
    the ratios between groups and the shape of every schedule stay as configured."""
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError(f"a learning-rate factor must be a positive number, got {factor}")
    for optimizer in trainer.optimizers:
        for group in optimizer.param_groups:
            set_lr(group, float(group["lr"]) * factor)
            if "initial_lr" in group:
                group["initial_lr"] = group["initial_lr"] * factor
    for entry in trainer.lr_schedulers:
        for scheduler in _nested(entry["scheduler"]):
            if hasattr(scheduler, "base_lrs"):
                scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]
            # what get_last_lr() reports until the next step (torch keeps it in _last_lr)
            if isinstance(getattr(scheduler, "_last_lr", None), list):
                scheduler._last_lr = [float(g["lr"]) for g in scheduler.optimizer.param_groups]
