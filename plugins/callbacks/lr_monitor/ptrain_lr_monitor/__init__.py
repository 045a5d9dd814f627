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
  (every ``log_every_n_steps`` training batches that took an optimizer step, as in Lightning:
  a batch stepping two optimizers counts once); ``"epoch"``: every optimizer, when each
  training epoch starts; unset: an optimizer whose scheduler has interval ``"step"`` per step,
  one whose scheduler has interval ``"epoch"`` per epoch, and an optimizer without a scheduler
  at both.
- **Value at step ``s``:** the rate the optimizer step that reached ``s`` trained with (read at
  the start of its batch, before the step and its schedulers), on the same row as that
  batch's loss; at an epoch's start, the rate its first step will use. These are the values
  Lightning's callback logs (and keeps in ``lrs``).

Values go through the ``log_metrics`` hook, so every logger records them (loggers write on rank 0
only), and into ``trainer.callback_metrics`` (a checkpoint or early-stopping callback can
monitor them). Reading a param group's ``lr`` is a Python number: no host-device sync.
"""

from __future__ import annotations

import warnings

import torch

from ptrain import ConfigError, hookimpl
from ptrain.options import to_bool

INTERVALS = ("step", "epoch")


class LearningRateMonitor:
    """``-p learning-rate-monitor [--learning-rate-monitor-logging-interval step|epoch]``.

    What it logged, for code to read after (or during) ``fit``, as Lightning's callback keeps
    it: ``lrs`` (metric name -> every rate logged, in order), ``last_momentum_values`` and
    ``last_weight_decay_values`` (``NAME-momentum`` / ``NAME-weight_decay`` -> the last value
    logged, ``None`` before the first or without ``log_momentum`` / ``log_weight_decay``).
    The names are made when training starts and again at each log, so a param group added
    during training (a finetuning callback) gets its own entry: an optimizer's only group
    ``lr-SGD`` becomes ``lr-SGD/pg1`` (its history moves with it) beside the new
    ``lr-SGD/pg2``."""

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
        self.lrs: dict[str, list[float]] = {}
        self.last_momentum_values: dict[str, float | None] = {}
        self.last_weight_decay_values: dict[str, float | None] = {}
        self.history: list[tuple[int, dict[str, float]]] = []  # (step, what was logged)
        # training batches that took an optimizer step (log_every_n_steps counts those, as in
        # Lightning: a batch stepping two optimizers counts once), and the global step last seen
        self._stepped = self._seen_step = 0
        # the values read at the start of the batch whose step makes the next log point
        self._captured: tuple[dict[str, float], list[str]] | None = None

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

    def _follow_names(self, names: list[str]) -> None:
        """Give each of ``names`` an entry in :attr:`lrs` (and the momentum and weight decay
        records): a name ``BASE/pg1`` takes over the history of ``BASE`` (the optimizer had one
        group and got more)."""
        for name in names:
            if name in self.lrs:
                continue
            old = name.replace("/pg1", "") if "/pg1" in name else None
            self.lrs[name] = self.lrs.pop(old) if old in self.lrs else []
            for record, suffix in ((self.last_momentum_values, "-momentum"),
                                   (self.last_weight_decay_values, "-weight_decay")):
                record[name + suffix] = (record.pop(old + suffix, None)
                                         if old is not None else None)

    # -- hooks -------------------------------------------------------------------------------

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        if stage != "fit":
            return
        named = self.assign_names(trainer)
        self.lrs, self.last_momentum_values, self.last_weight_decay_values = {}, {}, {}
        self._follow_names([n for _, _, names in named for n in names])
        loggers = [impl.plugin_name for impl in trainer.hook.log_metrics.get_hookimpls()
                   if impl.plugin is not self]
        if not loggers:
            warnings.warn(
                "learning-rate-monitor: no logger is part of this run (no plugin implements "
                "log_metrics), so the learning rates reach only trainer.callback_metrics. Keep "
                "the tensorboard callback (remove -p no:tensorboard) or add a logger plugin.",
                stacklevel=1)
        if self.log_momentum:
            without = sorted({type(o).__name__ for o, _, _ in named
                              if "betas" not in o.defaults and "momentum" not in o.defaults})
            if without:
                warnings.warn(f"learning-rate-monitor: log_momentum is on, but these optimizers "
                              f"do not have momentum: {', '.join(without)}; 0 is logged for "
                              f"each.", RuntimeWarning, stacklevel=1)

    @hookimpl
    def on_loop_start(self, trainer, loop: str) -> None:
        if loop == "train":  # after a resume, the restored count
            self._stepped = self._seen_step = trainer.global_step
            self._captured = None

    def _wanted(self, interval: str, when: str) -> bool:
        """Whether an optimizer whose scheduler has ``interval`` is logged ``when`` ("step" or
        "epoch")."""
        if self.logging_interval is not None:
            return self.logging_interval == when
        return interval in (when, "none")

    @hookimpl
    def on_epoch_start(self, trainer) -> None:
        if self.logging_interval != "step":
            self._log(trainer, "epoch", self._current(trainer, "epoch"))

    @hookimpl
    def on_batch_start(self, trainer, stage: str) -> None:
        # the rates the batch whose optimizer step makes the next log point trains with, read
        # before that step (and its schedulers) change them
        if (stage == "train" and self._captured is None and self.logging_interval != "epoch"
                and (self._stepped + 1) % trainer.log_every_n_steps == 0):
            self._captured = self._current(trainer, "step")

    @hookimpl
    def on_train_step_end(self, trainer) -> None:
        # before the validation the batch triggers, as Lightning's (which logs at the batch's
        # start), so that validation's callbacks find the rate in trainer.callback_metrics
        if trainer.global_step == self._seen_step:  # no optimizer stepped in this batch
            return
        self._seen_step = trainer.global_step
        self._stepped += 1
        if self._captured is not None and self._stepped % trainer.log_every_n_steps == 0:
            captured, self._captured = self._captured, None
            self._log(trainer, "step", captured)

    def _current(self, trainer, when: str) -> tuple[dict[str, float], list[str]]:
        """The values to log ``when``, and every name the optimizers have now."""
        named = self.assign_names(trainer)  # again: param groups may have been added
        stats = self.stats([(o, names) for o, interval, names in named
                            if self._wanted(interval, when)])
        return stats, [n for _, _, names in named for n in names]

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

    def _log(self, trainer, when: str, current: tuple[dict[str, float], list[str]]) -> None:
        stats, names = current
        self._follow_names(names)
        if not stats:
            return
        for name, value in stats.items():
            if name in self.lrs:
                self.lrs[name].append(value)
            elif name in self.last_momentum_values:
                self.last_momentum_values[name] = value
            else:
                self.last_weight_decay_values[name] = value
        self.history.append((trainer.global_step, stats))
        trainer.callback_metrics.update({k: torch.tensor(v) for k, v in stats.items()})
        trainer.hook.log_metrics(trainer=trainer, metrics=stats, step=trainer.global_step)


__all__ = ["LearningRateMonitor"]
