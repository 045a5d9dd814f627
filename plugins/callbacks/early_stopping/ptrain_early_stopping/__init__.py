"""The ``early-stopping`` callback: stop training when a monitored metric stops improving.

At each check (after every validation within ``fit`` by default; at the end of each training
epoch with ``check_on = "train_epoch_end"``, or when the run has no validation) it reads the
monitored metric from ``trainer.callback_metrics``, already reduced across processes, so every
rank reaches the same decision; the core agrees on it at the check point. The first reason that
holds stops the run, in this order: a non-finite value (``check_finite``), the
``stopping_threshold`` reached, the ``divergence_threshold`` crossed, ``patience`` checks without
an improvement of more than ``min_delta``. ``min_epochs``/``min_steps`` are the core's: a stop
asked for earlier takes effect once they are met.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

from ptrain import ConfigError, hookimpl
from ptrain.options import to_bool

log = logging.getLogger(__name__)

#: when the checks can be made (``check_on``)
CHECK_POINTS = ("auto", "validation", "train_epoch_end")


class EarlyStopping:
    """``-p early-stopping --early-stopping-monitor val_loss``."""

    def __init__(self, monitor: str, mode: str = "min", min_delta: float = 0.0, patience: int = 3,
                 strict: bool = True, check_finite: bool = True,
                 stopping_threshold: float | None = None,
                 divergence_threshold: float | None = None, check_on: str = "auto"):
        if mode not in ("min", "max"):
            raise ConfigError(f"early stopping's `mode` can be min or max (whether a lower or a "
                              f"higher value of the monitored metric is better), got {mode}.")
        if check_on not in CHECK_POINTS:
            raise ConfigError(f"early stopping's `check_on` can be {', '.join(CHECK_POINTS)} "
                              f"(after each validation, at the end of each training epoch, or "
                              f"the first when the run validates), got {check_on}.")
        if patience < 0:
            raise ConfigError(f"early-stopping patience must be at least 0 (0: stop at the first "
                              f"check without improvement), got {patience}.")
        self.monitor, self.mode = monitor, mode
        self.min_delta, self.patience = abs(min_delta), patience
        self.strict, self.check_finite = strict, check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.check_on = check_on
        self.wait = 0
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.best_step: int | None = None
        self.stopped_epoch: int | None = None
        self.reason: str | None = None
        #: why it stopped, as a word: "non_finite", "stopping_threshold",
        #: "divergence_threshold", "patience"; None while it has not
        self.reason_kind: str | None = None
        self._last_epoch: int | None = None
        self._checks_after_validation = True
        self._warned_missing = False

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("monitor", str, required=True, help="the logged metric to watch, e.g. val_loss")
        options.add("mode", str, default="min", choices=("min", "max"),
                    help="whether lower (min) or higher (max) values are better")
        options.add("min_delta", float, default=0.0,
                    help="a change smaller than this does not count as an improvement")
        options.add("patience", int, default=3,
                    help="checks without improvement before stopping (checks, not epochs)")
        options.add("strict", to_bool, default=True,
                    help="a missing monitored metric is an error (off: a warning, no check)")
        options.add("check_finite", to_bool, default=True,
                    help="stop when the monitored value is NaN or infinite")
        options.add("stopping_threshold", float,
                    help="stop as soon as the value is better than this")
        options.add("divergence_threshold", float,
                    help="stop as soon as the value is worse than this")
        options.add("check_on", str, default="auto",
                    choices=CHECK_POINTS,
                    help="when to check: after each validation, at the end of each training "
                         "epoch, or auto (after validation when the run validates)")

    # -- when to check ---------------------------------------------------------------------

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        validates = trainer.val_dataloader is not None and trainer.limit_val_batches != 0
        self._checks_after_validation = (self.check_on == "validation" or
                                         (self.check_on == "auto" and validates))
        self._last_epoch = None  # the index of the last epoch that ended

    @hookimpl
    def on_epoch_start(self, trainer) -> None:
        if self.reason is not None:  # asked before min_epochs/min_steps, or before a resume
            trainer.should_stop = True

    @hookimpl
    def on_validation_end(self, trainer) -> None:
        if trainer.stage == "train" and self._checks_after_validation:
            self._check(trainer)

    @hookimpl
    def on_epoch_end(self, trainer) -> None:
        self._last_epoch = trainer.current_epoch  # after fit, current_epoch counts the epochs
        if not self._checks_after_validation:
            self._check(trainer)

    # -- the decision --------------------------------------------------------------------------

    def _better(self, value: float, than: float) -> bool:
        return value < than if self.mode == "min" else value > than

    def _check(self, trainer) -> None:
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            message = (f"early stopping monitors {self.monitor!r}, which was not logged; logged "
                       f"metrics: {', '.join(sorted(metrics)) or '(none)'}. Log it with "
                       f"self.log({self.monitor!r}, ...) or change --early-stopping-monitor.")
            if self.strict:
                raise ConfigError(message)
            if not self._warned_missing:
                warnings.warn(message + " (strict is off: not checking)", stacklevel=2)
                self._warned_missing = True
            return
        value = float(metrics[self.monitor])
        reason = kind = None
        if self.check_finite and not math.isfinite(value):
            reason, kind = f"{self.monitor} = {value} is not finite", "non_finite"
        elif self.stopping_threshold is not None and self._better(value, self.stopping_threshold):
            reason, kind = (f"{self.monitor} = {value:.6g} reached the stopping threshold "
                            f"{self.stopping_threshold:g}"), "stopping_threshold"
        elif (self.divergence_threshold is not None
              and self._better(self.divergence_threshold, value)):
            reason, kind = (f"{self.monitor} = {value:.6g} diverged past the threshold "
                            f"{self.divergence_threshold:g}"), "divergence_threshold"
        if math.isfinite(value) and (self.best is None or self._better(
                value, self.best - self.min_delta if self.mode == "min"
                else self.best + self.min_delta)):
            self.best, self.best_epoch, self.best_step = value, trainer.current_epoch, \
                trainer.global_step
            self.wait = 0
        elif reason is None:
            self.wait += 1
            if self.wait >= self.patience:
                reason, kind = (f"{self.monitor} did not improve by more than "
                                f"{self.min_delta:g} in {self.wait} checks"), "patience"
        if reason is not None and self.reason is None:
            self.reason, self.stopped_epoch = reason, trainer.current_epoch
            self.reason_kind = kind
            trainer.should_stop = True
            if trainer.is_global_zero:
                log.info("early stopping asked at epoch %d (epochs count from 0): %s",
                         trainer.current_epoch, reason)

    def summary(self, last_epoch: int | None = None) -> str | None:
        """One line on why the run stopped (``None`` when early stopping asked for no stop).
        ``last_epoch``: the index of the epoch the run ended in, when known; if that is later
        than the one the stop was asked in (``min_epochs``/``min_steps`` held it), the line
        says so. Its epochs are indices counted from 0, as ``stopped_epoch``, ``best_epoch``,
        checkpoint names (``epoch=7-step=360.ckpt``) and Lightning's count them, and the line
        says so: the "Training finished: N epoch(s)" line after it counts the epochs run."""
        if self.reason is None:
            return None
        best = (f"; best {self.monitor} = {self.best:.6g} at epoch {self.best_epoch} (step "
                f"{self.best_step})" if self.best is not None else "")
        when = f"at epoch {self.stopped_epoch} (epochs count from 0)"
        if last_epoch is not None and last_epoch != self.stopped_epoch:
            when = (f"asked at epoch {self.stopped_epoch} (epochs count from 0; the run ended "
                    f"at epoch {last_epoch})")
        return f"Early stopping {when}: {self.reason}{best}."

    @hookimpl
    def teardown(self, trainer, stage: str) -> None:
        line = self.summary(self._last_epoch)
        if stage == "fit" and line is not None and trainer.is_global_zero:
            print(line, flush=True)

    # -- checkpoints -------------------------------------------------------------------------

    @hookimpl
    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor, "mode": self.mode, "wait": self.wait,
                "best": self.best, "best_epoch": self.best_epoch, "best_step": self.best_step,
                "stopped_epoch": self.stopped_epoch, "reason": self.reason,
                "reason_kind": self.reason_kind}

    @hookimpl
    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("monitor") != self.monitor or state.get("mode") != self.mode:
            return  # watching something else now: start afresh
        self.wait, self.best = state["wait"], state["best"]
        self.best_epoch, self.best_step = state["best_epoch"], state["best_step"]
        self.stopped_epoch, self.reason = state["stopped_epoch"], state["reason"]
        self.reason_kind = state.get("reason_kind")
