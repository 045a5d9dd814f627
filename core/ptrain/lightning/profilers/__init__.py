"""``lightning.pytorch.profilers``' names over ptrain.

- ``SimpleProfiler``: the time of every hook call of the run, by hook and by the plugin whose
  implementation ran (``model_step``, ``model_step [loop-defaults]``, ``on_train_batch_end
  [checkpoint]``, ...), and of the regions a program times itself (``with
  trainer.profiler.profile("name"):``), read from ptrain's hook observation (the one
  ``--trace`` prints). A report like Lightning's is logged when each stage ends, and written to
  ``dirpath/<stage>-<filename>.txt`` when ``filename`` is given.
- ``AdvancedProfiler``: ``cProfile`` over the whole stage, reported with ``pstats`` (sorted by
  cumulative time); Lightning reports one ``cProfile`` per action instead.
- ``PyTorchProfiler``: ptrain's ``profiler`` callback (``ptrain-profiler``, ``torch.profiler``
  over chosen training steps) with the same settings.
- ``PassThroughProfiler``: no profiling (Lightning's default).

Observation times every hook implementation, so a profiled run's steps are slower, as under
Lightning's profilers. A program's own ``Profiler`` subclass is refused by the Trainer: ptrain
has no point at which to call its ``start``/``stop`` around each hook.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import os
import pstats
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Iterator

from ptrain.errors import ConfigError
from ptrain.hookspecs import hookimpl
from ptrain.lightning._common import refuse

__all__ = ["AdvancedProfiler", "PassThroughProfiler", "Profiler", "PyTorchProfiler",
           "SimpleProfiler", "XLAProfiler"]


class Profiler:
    """The base of Lightning's profilers: ``start(action)``, ``stop(action)`` and ``summary()``
    (a subclass defines them), ``profile(action)`` (a block between the two),
    ``describe()`` (the summary logged, or written to ``dirpath/<stage>-<filename>.txt``)."""

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None) -> None:
        self.dirpath = dirpath
        self.filename = filename
        self._stage: str | None = None
        self._local_rank: int | None = None

    def start(self, action_name: str) -> None:
        raise NotImplementedError

    def stop(self, action_name: str) -> None:
        raise NotImplementedError

    def summary(self) -> str:
        raise NotImplementedError

    @contextlib.contextmanager
    def profile(self, action_name: str) -> Iterator[str]:
        """Profile the block as ``action_name``."""
        try:
            self.start(action_name)
            yield action_name
        finally:
            self.stop(action_name)

    def profile_iterable(self, iterable: Iterable, action_name: str) -> Iterator:
        """Each ``next`` of ``iterable`` profiled as ``action_name``."""
        iterator = iter(iterable)
        while True:
            try:
                self.start(action_name)
                value = next(iterator)
                self.stop(action_name)
                yield value
            except StopIteration:
                self.stop(action_name)
                break

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """Before ``stage`` runs: ``local_rank`` is given under several processes (it goes into
        the file name), ``log_dir`` is the default for ``dirpath``."""
        self._stage, self._local_rank = stage, local_rank
        self.dirpath = self.dirpath or log_dir

    def teardown(self, stage: str | None) -> None:
        """After the stage."""

    def _stage_started(self) -> None:
        """In a run: the stage's hooks start (after :meth:`setup`)."""

    def _stage_ended(self) -> None:
        """In a run: the stage's hooks ended (before :meth:`describe`)."""

    @property
    def local_rank(self) -> int:
        return 0 if self._local_rank is None else self._local_rank

    def _file_name(self, action_name: str | None = None, extension: str = ".txt") -> str:
        parts = [p for p in (self._stage, self.filename,
                             None if self._local_rank is None else str(self._local_rank),
                             action_name) if p is not None]
        base = re.sub(r"_+", "_", re.sub(r"[\\/:*?\"<>|\n\r\t]", "_", "-".join(parts))).strip()
        return base + extension

    def describe(self) -> None:
        """Write the summary: to ``dirpath/<stage>-<filename>[-<rank>].txt`` (appended) when a
        ``filename`` was given, else logged on global rank 0."""
        summary = self.summary()
        if summary:
            if self.filename and self.dirpath:
                path = Path(self.dirpath) / self._file_name()
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "a", encoding="utf-8") as file:
                    file.write(summary)
            else:
                from ptrain.lightning.utilities.rank_zero import rank_zero_info

                rank_zero_info(summary)
        self.teardown(stage=self._stage)

    def ptrain_plugin(self) -> Any:
        """What this profiler adds to a ptrain run: a callback entry (an object, or a plugin
        name with its options as ``(name, options)``), or ``None`` for nothing."""
        raise ConfigError(
            f"{type(self).__name__} is a profiler written against Lightning's Profiler API "
            f"(start/stop around each hook), which ptrain's loop does not call. Use "
            f"SimpleProfiler (hook times), AdvancedProfiler (cProfile) or PyTorchProfiler, or "
            f"observe the hook calls yourself: a ptrain callback with an observe_hook_call(call) "
            f"method receives every hook call with its time (docs/plugins.md). See \"Coming "
            f"from Lightning\" in ptrain's documentation.")


class PassThroughProfiler(Profiler):
    """No profiling: ``start``/``stop`` do nothing and the summary is empty."""

    def start(self, action_name: str) -> None:
        return None

    def stop(self, action_name: str) -> None:
        return None

    def summary(self) -> str:
        return ""

    def ptrain_plugin(self) -> Any:
        return None


class _ProfilerCallback:
    """A Lightning profiler in a ptrain run: sets it up when a stage starts, gives it each
    observed hook call (when it takes them), and has it describe itself when the stage ends."""

    def __init__(self, profiler: Profiler, name: str):
        self.profiler, self.name = profiler, name

    @hookimpl(tryfirst=True)
    def setup(self, trainer: Any, stage: str) -> None:
        local_rank = trainer.local_rank if trainer.world_size > 1 else None
        log_dir = str(trainer.log_dir) if trainer.log_dir is not None else None
        self.profiler.setup(stage, local_rank, log_dir)
        self.profiler._stage_started()

    @hookimpl(trylast=True)
    def teardown(self) -> None:
        self.profiler._stage_ended()
        self.profiler.describe()


class _ObservingProfilerCallback(_ProfilerCallback):
    """:class:`_ProfilerCallback` that also receives every hook call, timed (an observer, see
    :mod:`ptrain.hook_calls`): registering it turns the run's hook observation on."""

    def observe_hook_call(self, call: Any) -> None:
        if call.name not in ("setup", "teardown"):
            self.profiler._observe(call)


class SimpleProfiler(Profiler):
    """The time of each action: each hook of the run (``model_step``), each plugin's
    implementation of it (``model_step [loop-defaults]``; a module's Lightning-named methods run
    in the plugin named after the module class), the wait for the next batch
    (``dataloader_next [train]``), and what a program times with ``profile(name)``.
    ``recorded_durations`` holds each action's durations in seconds. The report lists, per
    action, the mean duration, the number of calls, the total and its share of the stage's
    time (``extended=False``: mean and total only), longest first."""

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None,
                 extended: bool = True) -> None:
        super().__init__(dirpath, filename)
        self.extended = extended
        self.current_actions: dict[str, float] = {}
        self.recorded_durations: dict[str, list[float]] = defaultdict(list)
        self.start_time = time.monotonic()
        self._batch_end: tuple[float, str] | None = None  # (when, stage) the last batch ended

    def start(self, action_name: str) -> None:
        if action_name in self.current_actions:
            raise ValueError(f"Attempted to start {action_name} which has already started.")
        self.current_actions[action_name] = time.monotonic()

    def stop(self, action_name: str) -> None:
        started = self.current_actions.pop(action_name, None)
        if started is None:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which "
                             f"was never started.")
        self.recorded_durations[action_name].append(time.monotonic() - started)

    def ptrain_plugin(self) -> Any:
        return _ObservingProfilerCallback(self, "simple-profiler")

    def _stage_started(self) -> None:
        self.start_time = time.monotonic()
        self.recorded_durations = defaultdict(list)
        self._batch_end = None

    def _stage_ended(self) -> None:
        self._batch_end = None

    def _observe(self, call: Any) -> None:
        stage = call.kwargs.get("stage", call.kwargs.get("loop"))
        label = f"{call.name} [{stage}]" if isinstance(stage, str) else call.name
        self.recorded_durations[label].append(call.seconds)
        for impl in call.impls:
            self.recorded_durations[f"{call.name} [{impl.plugin}]"].append(impl.seconds)
        if call.depth:
            return
        if call.name == "transfer_batch" and self._batch_end is not None:
            ended, batch_stage = self._batch_end
            self.recorded_durations[f"dataloader_next [{batch_stage}]"].append(
                max(0.0, call._start - ended))
        if call.name in ("on_train_batch_end", "on_evaluation_batch_end"):
            self._batch_end = (call._start + call.seconds, stage or "train")
        elif call.name != "transfer_batch":
            self._batch_end = None  # an epoch or a loop ended: the next fetch starts a pass

    def _report(self) -> tuple[list[tuple[str, float, int, float, float]], int, float]:
        total = time.monotonic() - self.start_time
        rows = [(action, sum(durations) / len(durations), len(durations), sum(durations),
                 100.0 * sum(durations) / total if total else 0.0)
                for action, durations in self.recorded_durations.items() if durations]
        rows.sort(key=lambda row: row[3], reverse=True)
        return rows, sum(row[2] for row in rows), total

    def summary(self) -> str:
        stage = f"{self._stage.upper()} " if self._stage else ""
        text = f"{stage}Profiler Report{os.linesep}"
        if not self.recorded_durations:
            return text
        rows, calls, total = self._report()
        width = max(len(row[0]) for row in rows)
        if self.extended:
            header = ("Action", "Mean duration (s)", "Num calls", "Total time (s)",
                      "Percentage %")
            body = [("Total", "-", str(calls), f"{total:.5}", "100 %")] + [
                (a, f"{m:.5}", str(n), f"{t:.5}", f"{p:.5}") for a, m, n, t, p in rows]
        else:
            header = ("Action", "Mean duration (s)", "Total time (s)")
            body = [(a, f"{m:.5}", f"{t:.5}") for a, m, _, t, _ in rows]
        widths = [max(width, 6)] + [max(17, len(h)) for h in header[1:]]

        def line(cells: tuple[str, ...]) -> str:
            return "|  " + "  |  ".join(c.ljust(w) for c, w in zip(cells, widths)) + "  |"

        rule = "-" * len(line(header))
        lines = [rule, line(header), rule, line(body[0]), rule] if self.extended else \
            [rule, line(header), rule, line(body[0])]
        lines += [line(cells) for cells in body[1:]] + [rule]
        return text + os.linesep.join(lines) + os.linesep


class AdvancedProfiler(Profiler):
    """``cProfile``: during a run, one profile over each whole stage (from ``setup`` to
    ``teardown``), reported as ``Profile stats for: <stage>`` with ``pstats`` sorted by
    cumulative time, ``line_count_restriction`` (a count, or a fraction of the lines) lines
    long; ``dump_stats=True`` also writes the raw profile as ``<stage>-...-<stage>.prof`` in
    ``dirpath``. Lightning profiles each action on its own instead; blocks a program times with
    ``profile(name)`` during a run are in the stage's profile. Outside a run, ``profile(name)``
    profiles that block alone, as in Lightning."""

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None,
                 line_count_restriction: float = 1.0, dump_stats: bool = False) -> None:
        super().__init__(dirpath, filename)
        self.profiled_actions: dict[str, cProfile.Profile] = {}
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats
        self._in_stage = False

    def start(self, action_name: str) -> None:
        if self._in_stage:
            return  # the stage's profile is running (cProfile does not nest)
        profile = self.profiled_actions.setdefault(action_name, cProfile.Profile())
        profile.enable()

    def stop(self, action_name: str) -> None:
        if self._in_stage:
            return
        profile = self.profiled_actions.get(action_name)
        if profile is None:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which "
                             f"was never started.")
        profile.disable()

    def ptrain_plugin(self) -> Any:
        return _ProfilerCallback(self, "advanced-profiler")

    def _stage_started(self) -> None:
        self.profiled_actions = {self._stage: cProfile.Profile()}
        self.profiled_actions[self._stage].enable()
        self._in_stage = True

    def _stage_ended(self) -> None:
        if self._in_stage:
            self.profiled_actions[self._stage].disable()
            self._in_stage = False

    def summary(self) -> str:
        stage = f"{self._stage.upper()} " if self._stage else ""
        parts = [f"{stage}Profiler Report"]
        for action, profile in self.profiled_actions.items():
            if self.dump_stats and self.dirpath:
                path = Path(self.dirpath) / self._file_name(action, ".prof")
                path.parent.mkdir(parents=True, exist_ok=True)
                profile.dump_stats(str(path))
            stream = io.StringIO()
            pstats.Stats(profile, stream=stream).strip_dirs().sort_stats(
                "cumulative").print_stats(self.line_count_restriction)
            rank = f"rank: {self._local_rank}, " if self._local_rank is not None else ""
            parts.append(f"Profile stats for: {action} {rank}".rstrip() + os.linesep +
                         stream.getvalue())
        return (os.linesep * 2).join(parts)

    def teardown(self, stage: str | None) -> None:
        super().teardown(stage)
        self.profiled_actions = {}

    def __getstate__(self) -> dict[str, Any]:  # a cProfile.Profile can't be pickled
        return {**self.__dict__, "profiled_actions": {}}


def _activities(values: Any) -> str:
    names = sorted({str(getattr(v, "name", v)).lower() for v in values})
    if not set(names) <= {"cpu", "cuda"} or not names:
        raise ValueError(values)
    return ",".join(names)


def _schedule_options(schedule: Any) -> dict[str, int]:
    """The settings of a ``torch.profiler.schedule(...)`` (read from the function it made)."""
    cells = dict(zip(getattr(getattr(schedule, "__code__", None), "co_freevars", ()),
                     (c.cell_contents for c in getattr(schedule, "__closure__", None) or ())))
    wanted = ("wait", "warmup", "active", "repeat", "skip_first")
    if not set(wanted) <= set(cells) or cells.get("skip_first_wait", 0):
        raise ValueError(schedule)
    return {name: int(cells[name]) for name in wanted}


#: torch.profiler.profile's arguments PyTorchProfiler passes on, as ptrain's options
_PROFILE_FLAGS = ("record_shapes", "profile_memory", "with_stack")


class PyTorchProfiler(Profiler):
    """ptrain's ``profiler`` callback (``ptrain-profiler``): ``torch.profiler`` over a schedule
    of training steps, traces (Chrome/TensorBoard format) in ``dirpath`` (default
    ``<run folder>/profiler``), and the table of the most expensive operators printed when
    ``fit`` ends. ``row_limit``, ``sort_by_key``, and ``torch.profiler.profile``'s
    ``activities``, ``schedule``, ``record_shapes``, ``profile_memory``, ``with_stack`` become
    its options, and ``record_module_names`` (on by default, as in Lightning) labels each
    submodule's forward (``[module] Linear: net.0``) besides the loop's parts
    (``ptrain.forward``, ``ptrain.backward``...). Differences: ptrain profiles the training
    steps of ``fit`` (Lightning: every stage's steps); it names its trace files itself
    (``filename`` is refused). ``profile(name)`` labels a block
    as a ``torch.profiler.record_function`` region."""

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None,
                 group_by_input_shapes: bool = False, emit_nvtx: bool = False,
                 export_to_chrome: bool = True, row_limit: int = 20,
                 sort_by_key: str | None = None, record_module_names: bool = True,
                 table_kwargs: dict[str, Any] | None = None, **profiler_kwargs: Any) -> None:
        super().__init__(dirpath, filename)
        owner = "PyTorchProfiler"
        if filename is not None:
            raise refuse(owner, "filename", filename,
                         "ptrain names its trace files itself (rank<R>.<time>.pt.trace.json in "
                         "dirpath) and prints the operator table; leave filename out")
        for argument, value, default, instead in (
                ("group_by_input_shapes", group_by_input_shapes, False,
                 "ptrain's table groups operators by name; leave it out"),
                ("emit_nvtx", emit_nvtx, False,
                 "run under nsys with torch.autograd.profiler.emit_nvtx() yourself"),
                ("export_to_chrome", export_to_chrome, True,
                 "ptrain always writes the trace (TensorBoard's profiler reads it); leave it "
                 "out"),
                ("table_kwargs", table_kwargs, None,
                 "ptrain's table takes row_limit and sort_by_key only")):
            if value != default:
                raise refuse(owner, argument, value, instead)
        self.record_module_names = record_module_names
        self.options: dict[str, Any] = {"row_limit": row_limit,
                                        "record_module_names": bool(record_module_names)}
        if dirpath is not None:
            self.options["dir"] = str(dirpath)
        if sort_by_key is not None:
            self.options["sort_by"] = sort_by_key
        for argument, value in profiler_kwargs.items():
            if argument in _PROFILE_FLAGS:
                self.options[argument] = bool(value)
            elif argument == "activities":
                try:
                    self.options["activities"] = _activities(value)
                except (ValueError, TypeError):
                    raise refuse(owner, "activities", value,
                                 "give torch.profiler.ProfilerActivity.CPU and/or CUDA") from None
            elif argument == "schedule":
                try:
                    self.options.update(_schedule_options(value))
                except ValueError:
                    raise refuse(owner, "schedule", value,
                                 "give torch.profiler.schedule(wait=, warmup=, active=, repeat=, "
                                 "skip_first=)") from None
            else:
                raise refuse(owner, argument, value,
                             f"ptrain's profiler takes {', '.join(_PROFILE_FLAGS)}, activities "
                             f"and schedule of torch.profiler.profile's arguments; leave the "
                             f"others out")
        self._regions: dict[str, Any] = {}

    def start(self, action_name: str) -> None:
        import torch

        region = torch.profiler.record_function(action_name)
        region.__enter__()
        self._regions[action_name] = region

    def stop(self, action_name: str) -> None:
        region = self._regions.pop(action_name, None)
        if region is not None:
            region.__exit__(None, None, None)

    def summary(self) -> str:
        return ""

    def ptrain_plugin(self) -> Any:
        return ("profiler", dict(self.options))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_regions": {}}


class XLAProfiler(Profiler):
    """Lightning's profiler server for TPUs. ptrain's ``tpu`` accelerator has none: made, it
    is refused."""

    def __init__(self, port: int = 9012) -> None:
        super().__init__()
        raise refuse("XLAProfiler", "port", port,
                     "ptrain-xla starts no profiler server; start it yourself in a callback's "
                     "setup with torch_xla.debug.profiler.start_server(port), or use "
                     "PyTorchProfiler")


#: Trainer(profiler=NAME): Lightning's names
PROFILERS = {"simple": SimpleProfiler, "advanced": AdvancedProfiler, "pytorch": PyTorchProfiler,
             "xla": XLAProfiler}


#: modules here that Lightning's package has imported and that this one imports when first read
_SUBMODULES = ("advanced", "base", "profiler", "pytorch", "simple", "xla")


def __getattr__(name: str) -> Any:
    from ptrain.lightning._common import submodule

    return submodule(__name__, name, _SUBMODULES)
