"""The ``lr-finder`` callback: an LR range test before training, and a suggested learning rate.

In ``setup(stage="fit")``, once everything else is set up (its ``setup`` is a wrapper that works
after ``yield``, so it runs after every other plugin's, the ``batch-size-finder`` included), on
every rank: ``num_steps`` real optimizer steps on training batches (see :mod:`.steps`), the
learning rate raised exponentially from ``min_lr`` to ``max_lr``; the training state is then put
back exactly (see :mod:`.snapshot`) and, with ``then="fit"``, the run trains with the
suggestion as its initial learning rate.
"""

from __future__ import annotations

import contextlib
import math
import time
from importlib.util import find_spec
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader

from ptrain import ConfigError, hookimpl
from ptrain.data import rebuild_dataloader
from ptrain.evaluation_loop import run_validation
from ptrain_finders.common import (Finder, base_lr, check_scalable, scale_learning_rates,
                                   set_lr, write_json)
from ptrain_finders.snapshot import TrainingSnapshot
from ptrain_finders.steps import StepRunner, batches_per_pass, cycle

PLOT_NAME = "lr_finder.png"
DATA_NAME = "lr_finder.json"


def smooth(losses: list[float], smoothing: float) -> list[float]:
    """The exponential moving average of ``losses`` (weight ``smoothing`` on the past), with the
    bias correction that keeps its first values from being pulled towards 0."""
    average, smoothed = 0.0, []
    for index, loss in enumerate(losses):
        average = smoothing * average + (1 - smoothing) * loss
        smoothed.append(average / (1 - smoothing ** (index + 1)))
    return smoothed


#: The smoothed loss must fall this fraction below where the search starts for a suggestion: a
#: flatter curve has its minimum, and its "steepest descent", wherever the noise puts them.
MIN_DROP = 0.01


def warm_up_points(smoothing: float) -> int:
    """How many of the curve's first points the suggestion leaves out: the moving average's
    time constant, ``1 / (1 - smoothing)`` steps (10 at 0.9), at least 1. Before that the
    bias-corrected average rests on a handful of batches, and the drop from the first, noisy
    batch to the next is often the steepest of the whole curve (measured: on 4 cycled batches
    of a tiny regression, keeping them suggested min_lr itself)."""
    return max(1, round(1 / (1 - smoothing)))


def steepest_descent(lrs: list[float], smoothed: list[float], skip: int) -> int | None:
    """The index of the suggested learning rate: where the smoothed loss falls fastest against
    log10(lr), searched from point ``skip`` up to the smoothed loss's minimum after it (the
    slope is taken with ``numpy.gradient``: central differences, one-sided at both ends).
    ``None`` when the loss never went down there: its minimum is at ``skip`` itself, or less
    than :data:`MIN_DROP` below the value there, or the curve ended before two more points."""
    if len(smoothed) < skip + 2:
        return None
    start = smoothed[skip]
    lowest = skip + int(np.argmin(smoothed[skip:]))
    if lowest == skip or smoothed[lowest] > start - MIN_DROP * abs(start):
        return None
    slopes = np.gradient(np.asarray(smoothed[skip:lowest + 1]), np.log10(lrs[skip:lowest + 1]))
    return skip + int(np.argmin(slopes))


@contextlib.contextmanager
def held_schedulers(trainer) -> Iterator[None]:
    """The run's LR schedulers do nothing when stepped, inside: a manually optimizing module
    steps its own (``self.lr_schedulers()``) in ``training_step``, and one that does so before
    its optimizer step would otherwise replace the rate under test. Their state is the
    snapshot's to put back; this only puts their ``step`` back."""
    schedulers = [entry["scheduler"] for entry in trainer.lr_schedulers]
    for scheduler in schedulers:
        scheduler.step = _held_step  # an instance attribute, shadowing the class's method
    try:
        yield
    finally:
        for scheduler in schedulers:
            del scheduler.step


def _held_step(*args: Any, **kwargs: Any) -> None:
    return None


class LRFinder(Finder):
    """``-p lr-finder``: the LR range test, then training at the suggested learning rate.

    :param min_lr: the learning rate of the first step (of the first param group; other groups
        keep their configured ratio to it).
    :param max_lr: the learning rate of the last step.
    :param num_steps: optimizer steps in the test (each one accumulation window when
        ``accumulate_grad_batches`` > 1); the training batches are cycled if there are fewer.
    :param diverge_factor: stop early once the smoothed loss exceeds this multiple of its minimum.
    :param smoothing: weight of the past in the loss's moving average (0: raw losses).
    :param then: ``fit`` (train with the suggestion) or ``stop`` (end the run after the test).

    A module that optimizes manually is tested with its one optimizer (several are refused):
    the rate is set before each ``training_step``, which steps it, and the step's loss is what
    ``training_step`` returns (none in the whole test is refused); the run's LR schedulers do
    nothing during the test (:func:`held_schedulers`).

    After the search: ``lrs``, ``losses``, ``smoothed``, ``suggestion`` (``None`` when the loss
    never went down), ``configured_lr`` and ``seconds`` (wall time of the test), on every rank.
    """

    name = "lr-finder"
    #: whether the test runs the trainer's validation between passes over the training
    #: batches, where an epoch of the run would end and validate (``ptrain.lightning``'s
    #: ``Tuner`` sets it: Lightning's test runs as epochs of a fit, so a validation loader
    #: is iterated between them, which moves the random generators the next pass shuffles with)
    validates_between_passes = False
    #: the learning rate of step ``k`` (from 0), where it is not ``min_lr`` raised
    #: geometrically to ``max_lr`` (``ptrain.lightning``'s ``Tuner`` computes Lightning's
    #: rates as Lightning writes them, so the suggestion is Lightning's to the last digit)
    rate_of_step: Callable[[int], float] | None = None

    def __init__(self, min_lr: float = 1e-7, max_lr: float = 1.0, num_steps: int = 100,
                 diverge_factor: float = 4.0, smoothing: float = 0.9, then: str = "fit"):
        super().__init__(then)
        if not min_lr > 0:
            raise ConfigError(f"lr-finder: min_lr={min_lr} must be positive (the learning "
                              f"rates are spaced on a log scale); e.g. 1e-7.")
        if not min_lr < max_lr:
            raise ConfigError(f"lr-finder: min_lr ({min_lr:g}) must be below max_lr "
                              f"({max_lr:g}); the test raises the learning rate from min_lr to "
                              f"max_lr. Swap them or widen the range (defaults 1e-7 and 1).")
        if not diverge_factor > 1:
            raise ConfigError(f"lr-finder: diverge_factor={diverge_factor} must be above 1 (the "
                              f"test stops when the smoothed loss exceeds diverge_factor x its "
                              f"minimum; default 4).")
        if not 0 <= smoothing < 1:
            raise ConfigError(f"lr-finder: smoothing={smoothing} must be in [0, 1) (0: no "
                              f"smoothing; default 0.9).")
        fewest = warm_up_points(smoothing) + 2
        if num_steps < fewest:
            raise ConfigError(
                f"lr-finder: num_steps={num_steps} is too few; use at least {fewest} (default "
                f"100): the suggestion leaves out the curve's first "
                f"{warm_up_points(smoothing)} points (the moving average's time constant at "
                f"smoothing {smoothing:g}) and needs 2 more. Lower --lr-finder-smoothing to "
                f"test fewer steps.")
        self.min_lr, self.max_lr, self.num_steps = min_lr, max_lr, num_steps
        self.diverge_factor, self.smoothing = diverge_factor, smoothing
        self._reset_results()

    def _reset_results(self) -> None:
        self.lrs: list[float] = []
        self.losses: list[float] = []
        self.smoothed: list[float] = []
        self.suggestion: float | None = None
        self.configured_lr: float | None = None
        self.diverged = False
        self.seconds = 0.0
        self.applied: dict[str, Any] | None = None

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("min_lr", float, default=1e-7, help="learning rate of the test's first step")
        options.add("max_lr", float, default=1.0, help="learning rate of the test's last step")
        options.add("num_steps", int, default=100,
                    help="optimizer steps in the test (the training batches are cycled if "
                         "there are fewer)")
        options.add("diverge_factor", float, default=4.0,
                    help="stop the test once the smoothed loss exceeds this multiple of its "
                         "minimum")
        options.add("smoothing", float, default=0.9,
                    help="weight of the past in the loss's exponential moving average (0: raw)")
        Finder.add_then_option(options)

    # -- the hooks --------------------------------------------------------------------------

    @hookimpl(wrapper=True)
    def setup(self, trainer, stage: str):
        result = yield  # every other plugin's setup first: the test trains the run as set up
        if stage == "fit":
            self.run(trainer)
        return result

    @hookimpl
    def state_dict(self) -> dict[str, Any] | None:
        return self.applied

    @hookimpl
    def applied_optimizer_settings(self, trainer, settings: list[list[dict[str, Any]]]) -> None:
        """A resumed run that trains with the suggestion (:meth:`run` reuses it) applies it:
        the first group's learning rate is the suggestion and every other group's keeps its
        ratio to it, as :meth:`run` scales them. That, not the configured learning rate, is what
        the checkpoint's is compared with.

        It fires on every resume of ``fit``, so it also tells :meth:`run` that the run resumes
        when the checkpoint holds nothing of this finder (:attr:`Finder.resuming`)."""
        super().applied_optimizer_settings(trainer, settings)
        if self.resumed_state is None or self.then != "fit" or not settings or not settings[0]:
            return
        configured = float(settings[0][0]["lr"])
        if not configured > 0:  # not a run the search could have scaled
            return
        factor = self.resumed_state["suggestion"] / configured
        for groups, optimizer in zip(settings, trainer.optimizers):
            for setting, group in zip(groups, optimizer.param_groups):
                applied, resumed = setting["lr"] * factor, base_lr(group)
                # the checkpoint's, where it is that up to rounding (it was scaled from the
                # learning rate configured then)
                setting["lr"] = resumed if math.isclose(applied, resumed, rel_tol=1e-9) \
                    else applied

    # -- the test -----------------------------------------------------------------------------

    def run(self, trainer) -> None:
        """Check, search, restore, report; then apply the suggestion or stop the run."""
        self._reset_results()
        module = trainer.module
        manual = not module.automatic_optimization
        if manual and len(trainer.optimizers) > 1:
            raise ConfigError(
                f"lr-finder: {type(module).__name__} optimizes manually with "
                f"{len(trainer.optimizers)} optimizers: its training_step decides when each "
                f"steps, so no one learning rate gives a step's loss. The test needs one "
                f"optimizer under manual optimization; find each one's rate in a run of its "
                f"own, or leave out -p lr-finder.")
        if self.resumed_state is not None and self.then == "fit":
            self.applied = self.resumed_state
            self.suggestion = float(self.applied["suggestion"])
            self.report(trainer, f"lr-finder: resumed a run that trains with the suggested lr "
                                 f"{self.applied['suggestion']:.3g}; no new search.")
            return
        if self.resuming and self.then == "fit":  # a resume continues the run, its lr too
            lr = float(trainer.optimizers[0].param_groups[0]["lr"])
            self.report(trainer, f"lr-finder: no search: this run resumes from a checkpoint "
                                 f"without an lr-finder suggestion, and continues with its lr "
                                 f"{lr:.3g}; to search, start a fresh run (without "
                                 f"--ckpt-path), or see the curve with --lr-finder-then stop.")
            return
        groups = trainer.optimizers[0].param_groups
        self.configured_lr = configured = base_lr(groups[0])
        if not configured > 0:
            raise ConfigError(f"lr-finder: the first param group's learning rate is "
                              f"{configured}; the other groups are tested at their ratio to it, "
                              f"so it must be positive.")
        if self.then == "fit":
            check_scalable(trainer, "lr-finder", "run the test with --lr-finder-then stop and "
                           "set the scheduler's max_lr from the suggestion")
        ratios = [base_lr(group) / configured for group in groups]
        snapshot = TrainingSnapshot(trainer, skip=self.finders(trainer))
        loader = trainer.train_dataloader
        if isinstance(loader, DataLoader) and loader.persistent_workers:
            # a copy with its own workers, so the run's persistent ones are not advanced
            loader = rebuild_dataloader(loader, persistent_workers=False)
        source = cycle(loader, batches_per_pass(loader, trainer.limit_train_batches),
                       self._validation_between_passes(trainer))
        started = time.perf_counter()
        try:
            with held_schedulers(trainer) if manual else contextlib.nullcontext():
                self._range_test(trainer, StepRunner(trainer), source, groups, ratios)
        finally:
            source.close()  # ends the loader's iterator (and its worker processes)
            snapshot.restore()
        if manual and not self.lrs and not self.diverged:
            raise ConfigError(
                f"lr-finder: {type(module).__name__}.training_step returned no loss in "
                f"{self.num_steps} steps; under manual optimization the test reads the loss "
                f"training_step returns. Return it (return loss), or leave out -p lr-finder.")
        self.seconds = time.perf_counter() - started
        index = steepest_descent(self.lrs, self.smoothed, warm_up_points(self.smoothing))
        self.suggestion = self.lrs[index] if index is not None else None
        self._write_results(trainer, len(groups))
        if self.then == "stop":
            self.stop_before_training(trainer)
        elif self.suggestion is not None:
            scale_learning_rates(trainer, self.suggestion / configured)
            self.applied = {"suggestion": self.suggestion, "configured_lr": configured}

    def _validation_between_passes(self, trainer) -> Any:
        """What :func:`cycle` calls between passes: the validation an epoch of the run that
        ends after ``passes`` epochs would run (``None`` when there is none to run)."""
        every = trainer.check_val_every_n_epoch
        if (not self.validates_between_passes or trainer.val_dataloader is None
                or trainer.limit_val_batches == 0):
            return None
        first = trainer.current_epoch

        def validate(passes: int) -> None:
            if every is None or (first + passes) % every == 0:
                run_validation(trainer)
        return validate

    def _range_test(self, trainer, runner: StepRunner, source, groups: list[dict],
                    ratios: list[float]) -> None:
        """Fill ``lrs``, ``losses``, ``smoothed``: one point per step, the loss averaged over
        every rank (one reduction and one host sync per step: every rank must take the same
        decision to stop, else the others would wait for it in the next step's collectives)."""
        growth = (self.max_lr / self.min_lr) ** (1 / (self.num_steps - 1))
        accumulate = trainer.accumulate_grad_batches
        average, lowest = 0.0, math.inf
        for step in range(self.num_steps):
            lr = self.min_lr * growth ** step if self.rate_of_step is None \
                else self.rate_of_step(step)
            for group, ratio in zip(groups, ratios):
                set_lr(group, lr * ratio)
            total, count = runner.step(source, accumulate)
            pair = torch.zeros(2, device=trainer.device)
            if total is not None:
                pair[0] = total.float()
            pair[1] = count
            reduced = trainer.hook.reduce_metrics(trainer=trainer, metrics={"loss": pair},
                                                  op="sum")["loss"]
            loss_sum, batches = reduced.tolist()
            if batches == 0:  # the module skipped every batch of this step, on every rank
                continue
            loss = loss_sum / batches
            if not math.isfinite(loss):
                self.diverged = True
                break
            average = self.smoothing * average + (1 - self.smoothing) * loss
            smoothed = average / (1 - self.smoothing ** (len(self.losses) + 1))
            self.lrs.append(lr)
            self.losses.append(loss)
            self.smoothed.append(smoothed)
            lowest = min(lowest, smoothed)
            # a loss that can be negative has no meaningful multiple: only non-finite stops it
            if lowest > 0 and smoothed > self.diverge_factor * lowest:
                self.diverged = True
                break

    def _write_results(self, trainer, num_groups: int) -> None:
        if not trainer.is_global_zero:
            return
        folder = trainer.run_dir
        data = {"lrs": self.lrs, "losses": self.losses, "smoothed": self.smoothed,
                "suggestion": self.suggestion, "configured_lr": self.configured_lr,
                "min_lr": self.min_lr, "max_lr": self.max_lr, "num_steps": self.num_steps,
                "steps_run": len(self.lrs), "diverged": self.diverged,
                "seconds": self.seconds, "then": self.then}
        write_json(folder / DATA_NAME, data)
        plot = folder / PLOT_NAME
        where = f"; the curve: {folder / DATA_NAME}"
        if self.lrs and find_spec("matplotlib") is not None:
            from ptrain_finders.plot import plot_lr_curve

            plot_lr_curve(plot, self.lrs, self.losses, self.smoothed, self.suggestion,
                          self.configured_lr)
            where = f"; plot: {plot}"
        elif self.lrs:  # the plot is optional: the search and its numbers need no matplotlib
            where += f" (pip install matplotlib to get the plot {PLOT_NAME} too)"
        groups = f" ({num_groups} param groups, scaled together)" if num_groups > 1 else ""
        if self.suggestion is None:
            what = (f"lr-finder: no suggestion: the smoothed loss did not go down (by "
                    f"{MIN_DROP:.0%} or more, after its first "
                    f"{warm_up_points(self.smoothing)} points) in {len(self.lrs)} steps from lr "
                    f"{self.min_lr:g} (raise "
                    f"--lr-finder-max-lr or --lr-finder-num-steps, or check the model); "
                    f"configured lr {self.configured_lr:.3g}")
            if self.then == "fit":
                what += ", kept"
        else:
            what = (f"lr-finder: suggested lr {self.suggestion:.3g}{groups}, configured lr "
                    f"{self.configured_lr:.3g}")
            if self.then == "fit":
                what += "; training with the suggestion"
        self.report(trainer, f"{what} ({len(self.lrs)} steps, {self.seconds:.1f} s){where}")
