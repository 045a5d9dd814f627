"""The ``learning-rate-monitor`` callback: log the learning rate of every optimizer's param groups.

What is logged, under which names, and when:

- **Names** are those Lightning's ``LearningRateMonitor`` uses, so dashboards carry over:
  ``lr-<OptimizerClass>`` (``lr-SGD``), or the scheduler's ``"name"`` when its dict has one; a
  second, third ... optimizer of the same class ``lr-SGD-1``, ``lr-SGD-2`` (optimizers with a
  scheduler are named first, in the order of the schedulers, then the others in the order of
  ``configure_optimizers``); with several param groups ``/pg1``, ``/pg2`` ... after it, or
  ``/<name>`` for a group that has a ``"name"`` key (also for a single group); with
  ``log_momentum`` ``<that>-momentum`` (``betas[0]`` for Adam-style optimizers, else the
  group's ``momentum``, else 0) and with ``log_weight_decay`` ``<that>-weight_decay``.
- **When:** ``logging_interval="step"``: every optimizer, at the trainer's step publish points
  (each ``log_every_n_steps`` optimizer steps, the same steps as the module's step metrics);
  ``"epoch"``: every optimizer, when each training epoch starts; unset: an optimizer whose
  scheduler has interval ``"step"`` per step, one whose scheduler has interval ``"epoch"`` per
  epoch, and an optimizer without a scheduler at both.
- **Value at step ``s``:** the rate the optimizer's next step uses after ``s`` optimizer steps
  (after the schedulers stepped), as Lightning pairs them.

Values go through the ``log_metrics`` hook, so every logger records them (loggers write on rank 0
only), and into ``trainer.callback_metrics`` (a checkpoint or early-stopping callback can
monitor them). Reading a param group's ``lr`` is a Python number: no host-device sync.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ptrain import ConfigError, hookimpl
from ptrain.options import to_bool

INTERVALS = ("step", "epoch")


class LearningRateMonitor:
    """``-p learning-rate-monitor [--learning-rate-monitor-logging-interval step|epoch]``."""

    name = "learning-rate-monitor"

    def __init__(self, logging_interval: str | None = None, log_momentum: bool = False,
                 log_weight_decay: bool = False):
        if logging_interval not in (None, *INTERVALS):
            raise ConfigError(
                f"learning-rate-monitor logging_interval must be 'step', 'epoch' or unset (each "
                f"scheduler's own interval), got {logging_interval!r}. Set "
                f"--learning-rate-monitor-logging-interval step or epoch, or leave it out.")
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        # (optimizer, names of its param groups) to log per step / per epoch; set in setup
        self.per_step: list[tuple[torch.optim.Optimizer, list[str]]] = []
        self.per_epoch: list[tuple[torch.optim.Optimizer, list[str]]] = []
        self.last_logged_step = 0
        self.pending = False  # a step log waiting for the end of the epoch
        self.history: list[tuple[int, dict[str, float]]] = []  # what was logged, for code to read

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("logging_interval", str, choices=INTERVALS,
                    help="log at every step publish point (step) or at each epoch start (epoch); "
                         "unset: follow each scheduler's interval")
        options.add("log_momentum", to_bool, default=False,
                    help="also log each group's momentum (betas[0] for Adam-style optimizers)")
        options.add("log_weight_decay", to_bool, default=False,
                    help="also log each group's weight decay")

    # -- names -----------------------------------------------------------------------------

    @staticmethod
    def _group_names(base: str, optimizer: torch.optim.Optimizer) -> list[str]:
        groups = optimizer.param_groups
        given = [g.get("name") for g in groups]
        named = [n for n in given if n is not None]
        if len(set(named)) != len(named):
            raise ConfigError(
                f"learning-rate-monitor: {type(optimizer).__name__} has param groups with the "
                f"same 'name' ({', '.join(sorted({n for n in named if named.count(n) > 1}))}); "
                f"their rates would be logged under one metric. Give each group its own name.")
        if len(groups) == 1:
            return [f"{base}/{given[0]}" if given[0] is not None else base]
        return [f"{base}/{name if name is not None else f'pg{i + 1}'}"
                for i, name in enumerate(given)]

    def assign_names(self, trainer) -> list[tuple[torch.optim.Optimizer, str, list[str]]]:
        """(optimizer, interval or ``"none"``, param-group names) for every optimizer, named as
        Lightning names them: scheduled optimizers first, a per-class counter giving ``-1``,
        ``-2`` to later optimizers of a class already seen (a scheduler's own ``name`` does not
        advance the counter, but takes the suffix when its class was seen twice before)."""
        seen_per_class: dict[type, int] = {}
        result = []

        def base_name(optimizer, explicit: str | None) -> str:
            cls = type(optimizer)
            if explicit is None:
                seen_per_class[cls] = seen_per_class.get(cls, 0) + 1
            count = seen_per_class.get(cls, 0)
            name = explicit if explicit is not None else f"lr-{cls.__name__}"
            return f"{name}-{count - 1}" if count > 1 else name

        scheduled = []
        for entry in trainer.lr_schedulers:
            optimizer = entry["scheduler"].optimizer
            scheduled.append(optimizer)
            base = base_name(optimizer, entry.get("name"))
            result.append((optimizer, entry["interval"], self._group_names(base, optimizer)))
        for optimizer in trainer.optimizers:
            if any(optimizer is s for s in scheduled):
                continue
            result.append((optimizer, "none", self._group_names(base_name(optimizer, None),
                                                               optimizer)))
        return result

    # -- hooks -------------------------------------------------------------------------------

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        self.per_step, self.per_epoch = [], []
        self.pending = False
        if stage != "fit":
            return
        for optimizer, interval, names in self.assign_names(trainer):
            if self.logging_interval == "step" or (self.logging_interval is None
                                                   and interval in ("step", "none")):
                self.per_step.append((optimizer, names))
            if self.logging_interval == "epoch" or (self.logging_interval is None
                                                    and interval in ("epoch", "none")):
                self.per_epoch.append((optimizer, names))
        self.last_logged_step = trainer.global_step  # after a resume, the restored count
        loggers = [impl.plugin_name for impl in trainer.hook.log_metrics.get_hookimpls()
                   if impl.plugin is not self]
        if not loggers:
            warnings.warn(
                "learning-rate-monitor: no logger is part of this run (no plugin implements "
                "log_metrics), so the learning rates reach only trainer.callback_metrics. Keep "
                "the tensorboard callback (remove -p no:tensorboard) or add a logger plugin.",
                stacklevel=2)
        if self.log_momentum:
            without = sorted({type(o).__name__ for o, _ in self.per_step + self.per_epoch
                              if "betas" not in o.defaults and "momentum" not in o.defaults})
            if without:
                warnings.warn(f"learning-rate-monitor: log_momentum is on, but {', '.join(without)}"
                              f" has no momentum; 0 is logged for it.", stacklevel=2)

    @hookimpl
    def on_epoch_start(self, trainer) -> None:
        if self.per_epoch:
            self._log(trainer, self.per_epoch)

    @hookimpl
    def on_train_batch_end(self, trainer, batch_idx: int) -> None:
        # the core's rule for its step publish points (see FitLoop.run_epoch), applied after
        # the same batch: the rows land on the steps of the module's own step metrics
        n = trainer.log_every_n_steps
        if self.per_step and trainer.global_step // n > self.last_logged_step // n:
            self.last_logged_step = trainer.global_step
            if batch_idx + 1 >= trainer.num_training_batches:
                # epoch-interval schedulers step after the epoch's last batch: log the rate
                # the next step will use once they did, at the same step
                self.pending = True
            else:
                self._log(trainer, self.per_step)

    @hookimpl
    def on_epoch_end(self, trainer) -> None:
        if self.pending:
            self.pending = False
            self._log(trainer, self.per_step)

    def stats(self, optimizers: list[tuple[torch.optim.Optimizer, list[str]]]) -> dict[str, float]:
        """The current values, by metric name."""
        stats: dict[str, float] = {}
        for optimizer, names in optimizers:
            betas = "betas" in optimizer.defaults
            for group, name in zip(optimizer.param_groups, names):
                stats[name] = float(group["lr"])
                if self.log_momentum:
                    stats[f"{name}-momentum"] = float(group["betas"][0] if betas
                                                      else group.get("momentum", 0))
                if self.log_weight_decay:
                    stats[f"{name}-weight_decay"] = float(group.get("weight_decay", 0))
        return stats

    def _log(self, trainer, optimizers: list[tuple[torch.optim.Optimizer, list[str]]]) -> None:
        stats = self.stats(optimizers)
        self.history.append((trainer.global_step, stats))
        trainer.callback_metrics.update({k: torch.tensor(v) for k, v in stats.items()})
        trainer.hook.log_metrics(trainer=trainer, metrics=stats, step=trainer.global_step)


__all__ = ["LearningRateMonitor"]
