"""The ``profiler`` callback: ``torch.profiler`` over chosen training steps.

A training step is one training batch, counted from 0 at the start of ``fit`` across epochs; step
``N`` runs from the end of batch ``N - 1`` to the end of batch ``N``, so it includes the fetch of
its batch. The profiler is started in ``setup`` and advanced (``prof.step()``) once per training
batch, after every other ``on_train_batch_end``; a ``wait``/``warmup``/``active`` schedule (after
``skip_first`` steps, ``repeat`` times) chooses the steps recorded. Each recorded cycle is written
once, by ``torch.profiler.tensorboard_trace_handler``, to
``<dir>/rank<R>.<timestamp>.pt.trace.json``: that file is what TensorBoard's PyTorch Profiler
plugin reads and is also a Chrome trace (``export_chrome_trace`` writes it), so no second copy is
made.

While a step is profiled, the loop's parts are labelled with ``torch.profiler.record_function``
regions named by the constants below (``DATA_LOADING``: from the end of the previous batch, or the
start of the epoch, to this batch's ``transfer_batch``, so it holds the dataloader's fetch).
Outside profiled steps the hooks do no more than check a flag, and after the schedule's last
cycle the profiler is stopped. Nothing here syncs the host with the device.

At ``teardown`` (also after an error) the profiler is stopped, and global rank 0 prints where the
traces are, the median step time with and without recording, and a table of the most expensive
operators of the last recorded cycle (``key_averages().table``). Only ``fit`` is profiled.
"""

from __future__ import annotations

import statistics
import time
import warnings
from pathlib import Path
from typing import Any

from ptrain import ConfigError, hookimpl
from ptrain.options import to_bool

#: Names of the labelled regions in the traces and in the operator table.
DATA_LOADING = "ptrain.data_loading"
TRANSFER_BATCH = "ptrain.transfer_batch"
FORWARD = "ptrain.forward"
BACKWARD = "ptrain.backward"
CLIP_GRADIENTS = "ptrain.clip_gradients"
OPTIMIZER_STEP = "ptrain.optimizer_step"
VALIDATION_STEP = "ptrain.validation_step"

ACTIVITIES = ("auto", "cpu", "cuda", "cpu,cuda")
SORT_KEYS = ("auto", "self_cpu_time_total", "cpu_time_total", "self_device_time_total",
             "device_time_total", "self_cpu_memory_usage", "cpu_memory_usage",
             "self_device_memory_usage", "device_memory_usage", "count")

_MAX_TIMES = 10_000  # step times kept per kind, so a long run's memory stays bounded


def to_activities(value: Any) -> str:
    """``"auto"``, or the activities as ``"cpu"``, ``"cuda"`` or ``"cpu,cuda"``, from text
    (comma-separated, any order and case) or a TOML array. Raises ``ValueError`` naming the valid
    choices."""
    parts = value.split(",") if isinstance(value, str) else value
    if not isinstance(parts, (list, tuple)) or not all(isinstance(p, str) for p in parts):
        raise ValueError(f"expected activity names, got {value!r}")
    names = {p.strip().lower() for p in parts if p.strip()}
    unknown = sorted(names - {"auto", "cpu", "cuda"})
    if unknown or not names or ("auto" in names and len(names) > 1):
        raise ValueError(f"{value!r} is not a set of activities; valid choices: auto (cpu, plus "
                         f"cuda when training on a CUDA device), cpu, cuda, cpu,cuda")
    return ",".join(sorted(names))


def to_sort_key(value: Any) -> str:
    """A ``key_averages().table`` sort key; torch's ``cuda`` spellings become ``device``."""
    if not isinstance(value, str):
        raise ValueError(f"expected text, got {value!r}")
    return value.strip().replace("cuda", "device")


def _last_batch(trainer, batch_idx: int) -> bool:
    """Whether the loop ends after this training batch by its limits (``max_epochs``,
    ``max_steps``); a stop asked for by a plugin is not foreseen."""
    if trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps:
        return True  # -1: no limit
    return (trainer.max_epochs not in (None, -1)
            and trainer.current_epoch + 1 >= trainer.max_epochs
            and batch_idx + 1 >= getattr(trainer, "num_training_batches", float("inf")))


def _spans(steps: list[int]) -> str:
    """``[2, 3, 4, 9, 10]`` -> ``"2-4, 9-10"``."""
    out, start = [], None
    for i, step in enumerate(steps):
        if start is None:
            start = step
        if i + 1 == len(steps) or steps[i + 1] != step + 1:
            out.append(str(start) if start == step else f"{start}-{step}")
            start = None
    return ", ".join(out)


class Profiler:
    """``-p profiler``: profile training steps with ``torch.profiler`` (see the module doc).

    Every argument is validated here, so a bad value is a :class:`ptrain.ConfigError` (a usage
    error, exit code 2, from the CLI) before anything runs; ``activities = "cuda"`` or a device
    sort key without CUDA is refused in ``setup``, once the device is known.
    """

    def __init__(self, skip_first: int = 5, wait: int = 1, warmup: int = 1, active: int = 3,
                 repeat: int = 1, activities: str = "auto", record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False, dir: str | None = None,
                 gzip: bool = False, row_limit: int = 15, sort_by: str = "auto",
                 record_module_names: bool = False):
        for name, value, minimum, meaning in (
                ("skip_first", skip_first, 0, "steps ignored before the schedule starts"),
                ("wait", wait, 0, "steps not recorded at the start of each cycle"),
                ("warmup", warmup, 0, "steps the profiler runs but discards, before recording"),
                ("active", active, 1, "steps recorded per cycle"),
                ("repeat", repeat, 0, "cycles to record (0: until the end of training)"),
                ("row_limit", row_limit, 0, "rows of the operator table (0: no table)")):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(
                    f"profiler {name} must be an integer >= {minimum} ({meaning}), got {value!r}."
                    f" Set --profiler-{name.replace('_', '-')} (config key {name!r} in "
                    f"[plugins.profiler]) to {max(minimum, 1)} or more.")
        try:
            activities = to_activities(activities)
        except ValueError as exc:
            raise ConfigError(f"profiler activities: {exc}. Set --profiler-activities (config "
                              f"key 'activities' in [plugins.profiler]).") from None
        sort_key = to_sort_key(sort_by) if isinstance(sort_by, str) else sort_by
        if sort_key not in SORT_KEYS:
            raise ConfigError(f"profiler sort_by {sort_by!r} is not a sort key; valid choices: "
                              f"{', '.join(SORT_KEYS)}. Set --profiler-sort-by.")
        if "memory" in sort_key and not profile_memory:
            raise ConfigError(f"profiler sort_by {sort_key} sorts by memory, which is recorded "
                              f"only with profile_memory on: add --profiler-profile-memory, or "
                              f"sort by time (--profiler-sort-by self_cpu_time_total).")
        self.skip_first, self.wait, self.warmup = skip_first, wait, warmup
        self.active, self.repeat = active, repeat
        self.activities, self.sort_by = activities, sort_key
        self.record_shapes, self.profile_memory = record_shapes, profile_memory
        self.with_stack, self.dir, self.gzip, self.row_limit = with_stack, dir, gzip, row_limit
        self.record_module_names = record_module_names
        self._module_hooks: list[Any] = []  # the forward hooks that label each module's call
        self._module_regions: dict[int, list[Any]] = {}  # id(module) -> its open regions
        self._prof = None
        self._active = False  # the current step is profiled (warmup or recorded)
        self._region = None  # the open DATA_LOADING region, if any
        self._finished_at: int | None = None
        self.trace_dir: Path | None = None
        self.traces: list[tuple[Path, list[int]]] = []  # (file, steps recorded in it)

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("skip_first", int, default=5,
                    help="training steps (batches) to leave out before the schedule starts: "
                         "the first steps carry one-off costs")
        options.add("wait", int, default=1, help="steps not profiled at the start of each cycle")
        options.add("warmup", int, default=1,
                    help="steps profiled but discarded before recording (profiler start-up cost)")
        options.add("active", int, default=3, help="steps recorded per cycle (at least 1)")
        options.add("repeat", int, default=1,
                    help="cycles to record; 0 repeats until the end of training")
        options.add("activities", to_activities, default="auto", choices=ACTIVITIES,
                    help="what to record: cpu, cuda, cpu,cuda, or auto (cpu, plus cuda when "
                         "training on a CUDA device)")
        options.add("record_shapes", to_bool, default=False,
                    help="record operators' input shapes")
        options.add("profile_memory", to_bool, default=False,
                    help="record tensor memory allocations and frees")
        options.add("with_stack", to_bool, default=False,
                    help="record Python source locations of operators (bigger traces)")
        options.add("dir", str, help="folder for the traces (default: <run folder>/profiler)")
        options.add("gzip", to_bool, default=False, help="write .pt.trace.json.gz files")
        options.add("row_limit", int, default=15,
                    help="rows of the operator table printed at the end (0: none)")
        options.add("sort_by", to_sort_key, default="auto", choices=SORT_KEYS,
                    help="sort key of the operator table; auto: self_device_time_total when "
                         "cuda is recorded, else self_cpu_time_total")
        options.add("record_module_names", to_bool, default=False,
                    help="label each submodule's forward in the traces ('[module] Linear: "
                         "net.0'); forward hooks on every submodule, which cost a little on "
                         "every forward until the schedule ends")

    # -- start and stop --------------------------------------------------------------------------

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        self._prof, self._active, self._region = None, False, None
        self._finished_at: int | None = None  # the step at which the schedule ended
        self.traces = []
        if stage != "fit":
            return
        from torch.profiler import (ProfilerAction, ProfilerActivity, profile, record_function,
                                    schedule, tensorboard_trace_handler)

        on_cuda = trainer.device.type == "cuda"
        names = (["cpu", "cuda"] if on_cuda else ["cpu"]) if self.activities == "auto" \
            else self.activities.split(",")
        if "cuda" in names and not on_cuda:
            raise ConfigError(f"profiler activities {self.activities!r} records CUDA, but this "
                              f"run trains on {trainer.device}; use --profiler-activities cpu "
                              f"(or auto), or train on a CUDA accelerator.")
        sort_key = self.sort_by
        if sort_key == "auto":
            sort_key = "self_device_time_total" if "cuda" in names else "self_cpu_time_total"
        if "device" in sort_key and "cuda" not in names:
            raise ConfigError(f"profiler sort_by {sort_key} needs device times, which are "
                              f"recorded only with the cuda activity; sort by "
                              f"self_cpu_time_total, or record cuda on a CUDA device.")
        self._sort_key = sort_key
        self._profiled_actions = (ProfilerAction.WARMUP, ProfilerAction.RECORD,
                                  ProfilerAction.RECORD_AND_SAVE)
        self._recorded_actions = self._profiled_actions[1:]
        self._record_function = record_function
        self._schedule = schedule(skip_first=self.skip_first, wait=self.wait,
                                  warmup=self.warmup, active=self.active, repeat=self.repeat)
        # After this step the schedule records nothing more (None: it never ends).
        self._last_step = (self.skip_first + self.repeat * (self.wait + self.warmup + self.active)
                           if self.repeat else None)
        base = trainer.run_dir if trainer.run_dir is not None else trainer.run_root
        self.trace_dir = Path(self.dir) if self.dir else Path(base) / "profiler"
        self._worker = f"rank{trainer.global_rank}"
        self._write = tensorboard_trace_handler(str(self.trace_dir), worker_name=self._worker,
                                                use_gzip=self.gzip)
        self._is_global_zero, self._world_size = trainer.is_global_zero, trainer.world_size
        self._step, self._cycle_steps, self._export_s = 0, [], []
        self._times = {"recorded": [], "other": []}
        self._last_end: float | None = None
        activity = {"cpu": ProfilerActivity.CPU, "cuda": ProfilerActivity.CUDA}
        self._prof = profile(activities=[activity[n] for n in names], schedule=self._schedule,
                             on_trace_ready=self._trace_ready, record_shapes=self.record_shapes,
                             profile_memory=self.profile_memory, with_stack=self.with_stack)
        self._prof.start()
        self._action = self._schedule(0)
        self._active = self._action in self._profiled_actions
        if self.record_module_names:
            self._label_modules(trainer.module)

    def _label_modules(self, root) -> None:
        """Forward hooks on each submodule of ``root``: while a step is profiled, its call is a
        ``record_function`` region named ``[module] <class>: <name>``."""
        def enter(module, args):
            if self._active:
                region = self._record_function(f"[module] {type(module).__qualname__}: "
                                               f"{names[id(module)]}")
                region.__enter__()
                self._module_regions.setdefault(id(module), []).append(region)

        def leave(module, args, output):
            regions = self._module_regions.get(id(module))
            if regions:
                regions.pop().__exit__(None, None, None)

        names = {id(m): name for name, m in root.named_modules() if name}
        for name, module in root.named_modules():
            if name:
                self._module_hooks.append(module.register_forward_pre_hook(enter))
                self._module_hooks.append(module.register_forward_hook(leave))

    def _unlabel_modules(self) -> None:
        for handle in self._module_hooks:
            handle.remove()
        self._module_hooks = []
        for regions in self._module_regions.values():  # a forward that raised
            while regions:
                regions.pop().__exit__(None, None, None)
        self._module_regions = {}

    def _trace_ready(self, prof) -> None:
        """Called by torch at the end of each recorded cycle (and by ``stop`` mid-cycle)."""
        pattern = f"{self._worker}.*.pt.trace.json*"
        before = set(self.trace_dir.glob(pattern)) if self.trace_dir.is_dir() else set()
        start = time.perf_counter()
        self._write(prof)
        self._export_s.append(time.perf_counter() - start)
        for path in sorted(set(self.trace_dir.glob(pattern)) - before):
            self.traces.append((path, self._cycle_steps))
        self._cycle_steps = []

    @hookimpl
    def teardown(self, trainer) -> None:
        """Stop the profiler, whether the run ended normally or with an error; on rank 0, after a
        normal end, print the summary and the operator table."""
        prof, self._prof = self._prof, None
        self._close_data()
        self._unlabel_modules()
        self._active = False
        if prof is None:
            return
        failed = trainer.exception is not None
        try:
            if self._finished_at is None:
                prof.stop()  # writes a cycle cut short by the end of training
        except Exception as exc:
            if not failed:
                raise
            warnings.warn(f"the profiler could not write its last trace after the run failed: "
                          f"{type(exc).__name__}: {exc}", stacklevel=1)
        if self._is_global_zero and not failed:
            print(self.summary(prof), flush=True)

    # -- per step ------------------------------------------------------------------------------

    def _close_data(self) -> None:
        if self._region is not None:
            self._region.__exit__(None, None, None)
            self._region = None

    def _open_data(self) -> None:
        self._region = self._record_function(DATA_LOADING)
        self._region.__enter__()

    @hookimpl(trylast=True)
    def on_epoch_start(self) -> None:
        self._last_end = None
        if self._active:
            self._open_data()

    @hookimpl(tryfirst=True)
    def on_epoch_end(self) -> None:
        self._close_data()

    @hookimpl(wrapper=True)
    def transfer_batch(self, trainer):
        self._close_data()
        if not self._active or trainer.stage != "train":
            return (yield)
        with self._record_function(TRANSFER_BATCH):
            return (yield)

    @hookimpl(wrapper=True)
    def model_step(self, stage: str):
        if not self._active:
            return (yield)
        with self._record_function(FORWARD if stage == "train" else VALIDATION_STEP):
            return (yield)

    @hookimpl(wrapper=True)
    def backward(self):
        if not self._active:
            return (yield)
        with self._record_function(BACKWARD):
            return (yield)

    @hookimpl(wrapper=True)
    def clip_gradients(self):
        if not self._active:
            return (yield)
        with self._record_function(CLIP_GRADIENTS):
            return (yield)

    @hookimpl(wrapper=True)
    def optimizer_step(self):
        if not self._active:
            return (yield)
        with self._record_function(OPTIMIZER_STEP):
            return (yield)

    @hookimpl(trylast=True)
    def on_train_batch_end(self, trainer, batch_idx: int) -> None:
        prof = self._prof
        if prof is None:
            return
        now = time.perf_counter()
        if self._last_end is not None:
            kind = ("recorded" if self._action in self._recorded_actions
                    else None if self._action in self._profiled_actions else "other")
            if kind is not None and len(self._times[kind]) < _MAX_TIMES:
                self._times[kind].append(now - self._last_end)
        self._close_data()
        if self._finished_at is None:
            if self._action in self._recorded_actions:
                self._cycle_steps.append(self._step)
            # Stopping (rather than stepping) after the schedule's last step leaves the rest of
            # the run without profiler cost; after the run's last batch, it keeps the end of the
            # run out of the trace as a step that holds no batch.
            if (self._last_step is not None and self._step + 1 >= self._last_step) \
                    or _last_batch(trainer, batch_idx):
                prof.stop()
                self._finished_at = self._step + 1
                self._unlabel_modules()  # no cost once nothing more is recorded
            else:
                prof.step()
        self._step += 1
        self._action = self._schedule(self._step)
        self._active = self._finished_at is None and self._action in self._profiled_actions
        if self._active and batch_idx + 1 < getattr(trainer, "num_training_batches", float("inf")):
            self._open_data()
        self._last_end = time.perf_counter()

    # -- the report ----------------------------------------------------------------------------

    def summary(self, prof=None) -> str:
        """What rank 0 prints at the end of ``fit``: the recorded steps and trace files, the
        median host step times, and (with ``prof``, ``row_limit`` > 0) the operator table of
        the last recorded cycle."""
        steps = [s for _, cycle in self.traces for s in cycle]
        if not steps:
            return (f"Profiler: no training step was recorded: the run had {self._step} steps "
                    f"and the schedule records from step "
                    f"{self.skip_first + self.wait + self.warmup}. Lower --profiler-skip-first, "
                    f"--profiler-wait or --profiler-warmup.")
        cycles = len(self.traces)
        lines = [(f"Profiler: recorded training steps {_spans(sorted(set(steps)))} "
                  f"({cycles} cycle{'s' if cycles != 1 else ''}); traces in {self.trace_dir}:")]
        lines += [f"  {path.name} (steps {_spans(cycle)})" for path, cycle in self.traces]
        if self._world_size > 1:
            lines.append(f"  (each of the {self._world_size} ranks writes rank<N>.*.pt.trace.json)")
        recorded, other = self._times["recorded"], self._times["other"]
        if recorded and other:
            lines.append(
                f"Step time (host wall clock, median): {statistics.median(recorded) * 1e3:.2f} "
                f"ms recorded ({len(recorded)} steps), {statistics.median(other) * 1e3:.2f} ms "
                f"not profiled ({len(other)} steps); writing a trace took "
                f"{statistics.mean(self._export_s) * 1e3:.0f} ms per cycle.")
        if prof is not None and self.row_limit > 0 and prof.profiler is not None:
            last = self.traces[-1][1]
            lines.append(f"Most expensive operators of the last recorded cycle (steps "
                         f"{_spans(last)}), by {self._sort_key}:")
            lines.append(prof.key_averages().table(sort_by=self._sort_key,
                                                   row_limit=self.row_limit))
        return "\n".join(lines)
