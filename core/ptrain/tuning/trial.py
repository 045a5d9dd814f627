"""One measured run of ``ptrain tune``: the user's model and data, trained for a few warm-up and
measured optimizer steps through the normal loop, with one configuration.

Nothing of a trial is kept: it writes into a temporary folder that is removed, the callbacks
that save or print (checkpoints, TensorBoard, the progress bar, the model summary) are left out,
validation is off, and every random generator is put back as it was. Each trial builds the
model and data anew from the same seed, so every configuration starts from the same weights
and sees the same batches.

The host waits for the device twice per trial (at the end of the warm-up and at the end), never
per step: the measured time is that of the steps as the loop runs them.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ptrain.checkpoint_io import preserved_rng_states
from ptrain.hookspecs import hookimpl
from ptrain.tuning.candidates import RunConfig

#: the default callbacks a trial runs without: they save or print, and the measurement is not
#: a run of the user's (``stop-signals`` would turn a Ctrl-C into a failed trial, its checkpoint
#: in a folder deleted with it: the signal stops the tune itself instead)
QUIET = ("no:checkpoint", "no:tensorboard", "no:progress-bar", "no:results", "no:model-summary",
         "no:stop-signals")

#: builds the user's module and datamodule (``None`` when there is none), after seeding
Components = Callable[[], tuple[Any, Any]]


@dataclass
class Measurement:
    """What one trial saw. ``samples_per_s``: samples of the measured steps over their wall
    time, ``measured_s``; ``warmup_s``: the warm-up steps' time, compile time and finder
    searches included;
    ``losses``: the loss of every batch (warm-up included), ``nan`` for a skipped batch, and
    ``trained`` the samples trained before each (the weights its loss was computed with had
    seen that many: runs with different batch sizes are compared over the same samples);
    ``peak_bytes``: the accelerator's peak allocated memory during the trial, or the process's
    peak resident memory on the CPU (``None`` where neither can be read); ``memory_kind``
    says which. ``error``: why the trial failed, in one line (then nothing else holds), and
    ``exception`` the error itself; ``stopped``: the failure was the tune's budget running out
    (:class:`TrialStopped`), not the configuration's."""

    samples_per_s: float = 0.0
    measured_s: float = 0.0
    warmup_s: float = 0.0
    losses: list[float] = field(default_factory=list)
    trained: list[int] = field(default_factory=list)
    peak_bytes: int | None = None
    memory_kind: str = ""
    error: str | None = None
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    stopped: bool = False


class TrialStopped(Exception):
    """A trial ran past its deadline (the tune's budget): it ends as a failed measurement."""


class TuneProbe:
    """The callback a trial measures with: the time of the steps after the warm-up, the samples
    they trained, and every loss (kept on the device until the end)."""

    name = "tune-probe"

    def __init__(self, warmup: int, steps: int, deadline: float | None = None):
        self.warmup, self.steps, self.deadline = warmup, steps, deadline
        self.losses: list[torch.Tensor | None] = []
        self.trained: list[int] = []
        self.total = 0  # samples of the batches so far
        self.samples = 0
        self.started = self.warm = self.ended = None
        self.memory: _PeakMemory | None = None

    @hookimpl(tryfirst=True)  # before the finders, which search in their `setup`
    def setup(self, trainer, stage: str) -> None:
        if stage == "fit":
            self.memory = _PeakMemory(trainer.device)
            self.started = time.perf_counter()

    @hookimpl
    def on_train_batch_end(self, trainer, batch: Any, batch_idx: int, loss: Any) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TrialStopped("stopped: the tune's budget ran out during this trial")
        self.losses.append(None if loss is None else loss.detach())
        size = batch_size(batch)
        self.trained.append(self.total)
        self.total += size
        step = trainer.global_step
        if self.warm is None:
            if step >= self.warmup and trainer.sync_gradients:
                self._wait()
                self.warm = time.perf_counter()
            return
        self.samples += size
        if step >= self.warmup + self.steps and self.ended is None:
            self._wait()
            self.ended = time.perf_counter()

    def _wait(self) -> None:
        """Wait until the device has done the work queued so far (one host sync)."""
        for loss in reversed(self.losses):
            if loss is not None:
                loss.item()
                return
        torch.accelerator.synchronize() if torch.accelerator.is_available() else None


def batch_size(batch: Any) -> int:
    """The number of samples in ``batch``: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            found = batch_size(item)
            if found:
                return found
    return 0


def run_trial(config: RunConfig, components: Components, *, seed: int, warmup: int,
              steps: int, catalog: Any = None, deadline: float | None = None) -> Measurement:
    """Train ``warmup + steps`` optimizer steps with ``config`` and measure the last ``steps``;
    past ``deadline`` (``time.monotonic()``) the trial stops at its next step. A failure of the
    run is returned as the measurement's ``error``, not raised."""
    from ptrain.trainer import Trainer

    probe = TuneProbe(warmup, steps, deadline)
    # torch.compile's caches belong to earlier trials' models: each trial compiles afresh, and
    # a frame compiled more often than dynamo's cache limit would otherwise run uncompiled
    torch.compiler.reset()
    try:
        with preserved_rng_states(), tempfile.TemporaryDirectory(prefix="ptrain-tune-") as root, \
                warnings.catch_warnings(), open(os.devnull, "w") as devnull, \
                contextlib.redirect_stdout(devnull):
            # each trial would repeat the run's warnings and the plugins' reports
            warnings.simplefilter("ignore")
            options = dict(config.trainer)
            quieted = {entry.removeprefix("no:") for entry in QUIET}
            callbacks = [c for c in options.get("callbacks") or []
                         if c not in quieted and c not in QUIET]
            options.update(
                callbacks=[*callbacks, *QUIET, probe], max_steps=warmup + steps,
                max_epochs=None, max_time=None, min_epochs=None, min_steps=None,
                limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=root, seed=seed)
            trainer = Trainer(plugin_options={k: dict(v) for k, v in
                                              config.plugin_options.items()},
                              catalog=catalog, **options)
            module, datamodule = components()
            trainer.fit(module, datamodule=datamodule)
            return _measured(probe, warmup, steps)
    except Exception as exc:  # the trial's failure is a row of the table
        text = " ".join(str(exc).split())
        return Measurement(error=f"{type(exc).__name__}: {text}"[:400], exception=exc,
                           stopped=_stopped(exc))


def _stopped(exc: BaseException | None) -> bool:
    """Whether ``exc`` is, or was raised from, the probe's :class:`TrialStopped`."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, TrialStopped):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _measured(probe: TuneProbe, warmup: int, steps: int) -> Measurement:
    if probe.ended is None or probe.warm is None:
        return Measurement(error=f"the run ended before {warmup + steps} optimizer steps "
                                 f"(the training data is too short for this many steps)")
    losses = [math.nan if loss is None else float(loss) for loss in probe.losses]
    peak, kind = probe.memory.read() if probe.memory is not None else (None, "")
    measured = probe.ended - probe.warm
    return Measurement(samples_per_s=probe.samples / measured if measured > 0 else 0.0,
                       measured_s=measured, warmup_s=probe.warm - (probe.started or probe.warm),
                       losses=losses, trained=list(probe.trained), peak_bytes=peak,
                       memory_kind=kind)


class _PeakMemory:
    """The trial's peak memory: the accelerator's allocator peak where the run's device has one,
    else the process's peak resident set (Linux resets it through ``/proc/self/clear_refs``)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.on_accelerator = (self.device.type != "cpu" and torch.accelerator.is_available()
                               and torch.accelerator.current_accelerator().type
                               == self.device.type)
        if self.on_accelerator:
            torch.accelerator.memory.reset_peak_memory_stats()
        else:
            try:
                Path("/proc/self/clear_refs").write_text("5")
                self.resettable = True
            except OSError:
                self.resettable = False

    def read(self) -> tuple[int | None, str]:
        if self.on_accelerator:
            return torch.accelerator.memory.max_memory_allocated(), f"{self.device.type} allocated"
        if not self.resettable:
            return None, ""
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024, "process RSS"
        return None, ""


__all__ = ["Measurement", "QUIET", "TrialStopped", "TuneProbe", "batch_size", "run_trial"]
