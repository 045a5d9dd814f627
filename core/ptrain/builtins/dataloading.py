"""The ``dataloading`` callback: checks each dataloader once at start-up and says how to feed the
model faster; on request applies the advice, or holds the whole dataset in memory.

On by default; ``-p no:dataloading`` turns it off. Everything happens in ``prepare_dataloader``,
once per loader per run, never per step. The rules (documented in ``docs/data-loading.md``):

- **workers**: a map-style dataset loaded with fewer workers than this process's share of the
  cores minus one (:func:`ptrain.data.suggested_num_workers`), when that share allows at least
  :data:`MIN_ADVISED_WORKERS`. Skipped when workers cannot help:
  the dataset is already in memory (a ``TensorDataset``, or one this callback preloaded, also
  inside ``Subset``/``ConcatDataset``), or, with ``num_workers=0``, fetching one batch in this
  process takes less than ``cheap_batch_ms``. IterableDatasets are not checked: more workers
  only help one that splits its stream by ``get_worker_info()``, which can't be seen from here.
- **persistent_workers**: workers that are started again for every pass over a short loader
  (fewer than ``short_epoch_batches`` batches) that is iterated more than once in the run.
- **pin_memory**: an unpinned loader on a CUDA device, unless the accelerator has a
  ``pin_memory`` setting of its own (``ptrain-cuda`` pins by default; its
  ``--no-cuda-pin-memory`` is respected).

Advice is one :class:`ptrain.data.DataLoaderWarning` per loader, on global rank 0 only. With
``apply`` the changes are made with :func:`ptrain.data.rebuild_dataloader` instead and printed.
``num_workers`` sets the workers whatever the rule above says (and keeps them between passes
as that rule would), also without ``apply``: ``ptrain tune`` measures 2 and 4 this way.
"""

from __future__ import annotations

import math
import os
import random
import sys
import time
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, IterableDataset, Subset, \
    TensorDataset

from ptrain.data import DataLoaderWarning, available_cpus, rebuild_dataloader, \
    suggested_num_workers
from ptrain.errors import ConfigError
from ptrain.hookspecs import hookimpl
from ptrain.options import to_bool

_GIB = 1024**3
PROBE_BUDGET_S = 0.25  # the worker check measures at most this long, then extrapolates
#: Fewer workers than this are never advised: a single worker only overlaps fetching with the
#: step, whose own intra-op threads already use the spare core (no gain measured on 2 cores).
MIN_ADVISED_WORKERS = 2
#: the worker counts ``ptrain tune`` measures besides the advice
TUNED_WORKERS = (2, 4)
#: --dataloading-num-workers above this many per CPU core is refused: torch would start them all
WORKERS_PER_CPU = 16


class PreloadedDataset(Dataset):
    """A map-style dataset whose items were all fetched once and are held in this process's
    memory: ``dataset[i]`` returns the stored item ``i`` (tensors cloned, arrays copied)."""

    def __init__(self, items: list[Any], nbytes: int, source: str):
        self.items, self.nbytes, self.source = items, nbytes, source

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]


class Plan:
    """What the checks found for one loader: why (``reasons``), and the ``DataLoader`` keyword
    arguments that fix it (``changes``). (A plain class: making a dataclass costs a few tenths of
    a millisecond at import, on the path to the first training step.)"""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.changes: dict[str, Any] = {}


def in_memory(dataset: Any) -> bool:
    """Whether every item of ``dataset`` is a slice of tensors already in memory, so that
    worker processes would only add copying: a ``TensorDataset`` or a :class:`PreloadedDataset`,
    also wrapped in ``Subset`` or ``ConcatDataset``."""
    if isinstance(dataset, Subset):
        return in_memory(dataset.dataset)
    if isinstance(dataset, ConcatDataset):
        return all(in_memory(d) for d in dataset.datasets)
    return isinstance(dataset, (TensorDataset, PreloadedDataset))


def processes_per_node(trainer) -> int:
    """Training processes on this machine: torchrun's (and ptrain's launcher's)
    ``LOCAL_WORLD_SIZE``, else the world size spread over ``num_nodes``."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local and local.isdigit() and int(local) > 0:
        return int(local)
    return max(1, math.ceil(trainer.world_size / max(1, trainer.num_nodes or 1)))


@contextmanager
def _rng_untouched() -> Iterator[None]:
    """Fetching items may draw random numbers (augmentations); the callback must not move the
    generators, else a seeded run would change by turning it on or off."""
    py_state = random.getstate()
    np_random = sys.modules["numpy"].random if "numpy" in sys.modules else None
    np_state = np_random.get_state() if np_random is not None else None
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(py_state)
            if np_random is not None:
                np_random.set_state(np_state)


def _materialise(item: Any) -> tuple[Any, int]:
    """``item`` with every tensor cloned and every NumPy array copied (so nothing is a view of
    a file mapping or of a larger buffer), and the bytes those hold."""
    if isinstance(item, torch.Tensor):
        return item.clone(), item.nelement() * item.element_size()
    if type(item).__module__ == "numpy" and hasattr(item, "nbytes"):
        copy = item.copy()
        return copy, int(copy.nbytes)
    if isinstance(item, (bytes, bytearray, str)):
        return item, len(item)
    if isinstance(item, (list, tuple)):
        parts = [_materialise(x) for x in item]
        values = [v for v, _ in parts]
        if hasattr(item, "_fields"):  # namedtuple
            values = type(item)(*values)
        else:
            values = type(item)(values)
        return values, sum(n for _, n in parts)
    if isinstance(item, dict):
        parts = {k: _materialise(v) for k, v in item.items()}
        return type(item)((k, v) for k, (v, _) in parts.items()), sum(n for _, n in parts.values())
    return item, sys.getsizeof(item)


def _epoch_batches(loader: DataLoader, limit: int | float) -> int | None:
    """Batches one pass over ``loader`` takes under ``limit_*_batches``; None when unknown."""
    try:
        batches = len(loader)
    except TypeError:
        return None
    if isinstance(limit, int):
        return min(batches, limit)
    return int(batches * limit)


def _warn_at_source(trainer, stage: str, message: str) -> None:
    """Issue ``message`` as a :class:`DataLoaderWarning` located at the user's
    ``train_dataloader``/``val_dataloader`` (the code to change), not inside ptrain."""
    source = trainer.datamodule if trainer.datamodule is not None else trainer.module
    method = getattr(type(source), "train_dataloader" if stage == "train" else "val_dataloader",
                     None)
    code = getattr(method, "__code__", None)
    if code is None:
        warnings.warn(message, DataLoaderWarning, stacklevel=2)
        return
    warnings.warn_explicit(message, DataLoaderWarning, code.co_filename, code.co_firstlineno,
                           module=type(source).__module__)


def _call(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in changes.items())


class DataLoading:
    """Start-up checks of the train and validation dataloaders (see the module docstring).

    After ``prepare_dataloader``, ``self.report[stage]`` holds what was found and done for that
    loader: ``batch_ms`` (measured fetch time of one batch, when measured), ``suggested_workers``,
    ``warned`` (the warning text, or None), ``changes`` (applied), and, with ``preload``,
    ``preload_bytes`` and ``preload_seconds``.
    """

    name = "dataloading"  # its entry point's name, also when given as an object

    def __init__(self, apply: bool = False, preload: bool = False, preload_max_gib: float = 8.0,
                 short_epoch_batches: int = 500, cheap_batch_ms: float = 2.0,
                 cpus: int | None = None, num_workers: int | None = None):
        if num_workers is not None and num_workers < 0:
            raise ConfigError(f"dataloading num_workers must be 0 or more, not {num_workers}.")
        if num_workers is not None:  # the cores are read only for a count to check
            cores = cpus if cpus is not None and cpus > 0 else available_cpus()
            most = WORKERS_PER_CPU * cores
            if num_workers > most:
                # torch would try to start them all (the CLI fuzz hung, then ran out of memory)
                raise ConfigError(
                    f"dataloading num_workers {num_workers} would start {num_workers} worker "
                    f"processes per DataLoader; with {cores} CPU cores give at most {most} "
                    f"({WORKERS_PER_CPU} per core; loading rarely gains beyond a few per "
                    f"core), or leave it unset for the advised number.")
        self.apply, self.preload = apply, preload
        self.num_workers = num_workers
        self.preload_max_gib = preload_max_gib
        self.short_epoch_batches = short_epoch_batches
        self.cheap_batch_ms = cheap_batch_ms
        self.cpus = cpus
        self.report: dict[str, dict[str, Any]] = {}
        self._preloaded: dict[int, PreloadedDataset] = {}  # id(source dataset) -> copy

    @staticmethod
    @hookimpl
    def tune_candidates(trainer):
        """``ptrain tune`` measures the loaders rebuilt as this plugin advises (workers,
        persistent workers, pinned memory), and with 2 and 4 workers whatever the advice (it
        counts cores; a dataset that waits on storage gains from more): the same batches, so
        the same numbers."""
        from ptrain.tuning import Candidate

        own = trainer.config["plugins"].get("dataloading", {})
        offered = []
        if not own.get("apply"):
            offered.append(Candidate("dataloading advice applied", "dataloading",
                                     callbacks=("dataloading",),
                                     plugin_options={"dataloading": {"apply": True}}))
        for workers in TUNED_WORKERS:
            if own.get("num_workers") != workers:
                offered.append(Candidate(f"{workers} loader workers", "dataloading",
                                         callbacks=("dataloading",),
                                         plugin_options={"dataloading": {
                                             "num_workers": workers}}))
        return offered

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("apply", to_bool, default=False,
                    help="apply the advice at start-up (num_workers, persistent_workers, "
                         "pin_memory) by rebuilding the dataloaders, and print the changes")
        options.add("preload", to_bool, default=False,
                    help="fetch every item of a map-style dataset once before training and "
                         "hold them in memory (freezes random per-item augmentation)")
        options.add("preload_max_gib", float, default=8.0,
                    help="refuse to preload a dataset whose items hold more than this (GiB, "
                         "per process)")
        options.add("short_epoch_batches", int, default=500,
                    help="a loader with fewer batches per pass than this, iterated more than "
                         "once, should keep its workers (persistent_workers=True)")
        options.add("cheap_batch_ms", float, default=2.0,
                    help="a dataset without workers whose batch takes less than this to fetch "
                         "in the training process gets no worker advice")
        options.add("num_workers", int,
                    help="load with this many worker processes whatever the advice (kept "
                         "alive between passes when a loader is iterated again); made, not "
                         "advised, also without --dataloading-apply")
        options.add("cpus", int,
                    help="CPU cores to plan workers for (default: those this process may use, "
                         "capped by a cgroup quota)")

    # -- the hook --------------------------------------------------------------------------------

    @hookimpl(wrapper=True, tryfirst=True)  # outermost: sees what strategy and accelerator made
    def prepare_dataloader(self, trainer, stage: str):
        loader = yield
        if not isinstance(loader, DataLoader):
            return loader
        report = self.report[stage] = {"changes": {}, "warned": None}
        if self.preload:
            loader = self._preload(trainer, loader, stage, report)
        plan = self.plan(trainer, loader, stage, report)
        # everything with apply; the workers (and their persistence) when they were asked for
        made = dict(plan.changes) if self.apply else {
            k: v for k, v in plan.changes.items()
            if self.num_workers is not None and k in ("num_workers", "persistent_workers")}
        if made:
            before = {k: getattr(loader, k) for k in made}
            loader = rebuild_dataloader(loader, **made)
            report["changes"] = made
            if trainer.is_global_zero:
                done = ", ".join(f"{k} {before[k]!r} -> {v!r}" for k, v in made.items())
                print(f"dataloading: {stage} dataloader: {done} ({'; '.join(plan.reasons)})",
                      flush=True)
        if len(made) < len(plan.changes) and trainer.is_global_zero:
            message = (f"the {stage} dataloader could load faster: {'; '.join(plan.reasons)}. "
                       f"Use DataLoader(..., {_call(plan.changes)}), or --dataloading-apply "
                       f"(Trainer: plugin_options={{'dataloading': {{'apply': True}}}}) to set "
                       f"it at start-up; -p no:dataloading turns these checks off.")
            report["warned"] = message
            _warn_at_source(trainer, stage, message)
        return loader

    # -- the checks --------------------------------------------------------------------------------

    def plan(self, trainer, loader: DataLoader, stage: str,
             report: dict[str, Any] | None = None) -> Plan:
        """The advice for ``loader`` (the ``stage`` loader of ``trainer``'s run): reasons and
        the keyword arguments that follow them. Reads ``trainer.device``, ranks and options;
        may fetch up to one batch (random generators untouched) to measure its cost."""
        report = report if report is not None else {}
        plan = Plan()
        dataset = loader.dataset
        cpus = self.cpus if self.cpus is not None else available_cpus()
        procs = processes_per_node(trainer)
        suggested = suggested_num_workers(procs, cpus)
        report["suggested_workers"] = suggested
        workers = loader.num_workers

        if self.num_workers is not None:
            if workers != self.num_workers:
                plan.reasons.append(f"--dataloading-num-workers asks for {self.num_workers} "
                                    f"worker process(es)")
                plan.changes["num_workers"] = workers = self.num_workers
                if workers == 0 and loader.persistent_workers:  # needs workers to keep
                    plan.changes["persistent_workers"] = False
        elif (MIN_ADVISED_WORKERS <= suggested and workers < suggested
                and not isinstance(dataset, IterableDataset) and not in_memory(dataset)):
            batch_ms = self._measure_batch_ms(loader) if workers == 0 else None
            report["batch_ms"] = batch_ms
            if batch_ms is None or batch_ms >= self.cheap_batch_ms:
                cost = (f"fetching a batch takes {batch_ms:.1f} ms in the training process, "
                        if batch_ms is not None else "")
                plan.reasons.append(
                    f"{cost}it uses {workers} worker process(es) where this process's share "
                    f"of the machine ({cpus} core(s) for {procs} training process(es) on this "
                    f"machine, one kept for training) allows {suggested}")
                plan.changes["num_workers"] = workers = suggested

        limit = trainer.limit_train_batches if stage == "train" else trainer.limit_val_batches
        batches = _epoch_batches(loader, limit)
        if (workers > 0 and not loader.persistent_workers and batches is not None
                and batches < self.short_epoch_batches and self._passes_again(trainer, stage)):
            plan.reasons.append(
                f"its {workers} worker(s) would be started anew for every pass over "
                f"{batches} batch(es) (short: under {self.short_epoch_batches})")
            plan.changes["persistent_workers"] = True

        accelerator = trainer.plugins.get(trainer.options.get("accelerator"))
        if (trainer.device.type == "cuda" and not loader.pin_memory
                and getattr(accelerator, "pin_memory", None) is None):
            plan.reasons.append("batches are copied to the GPU from pageable memory, which "
                                "blocks the host (the accelerator does not pin them)")
            plan.changes["pin_memory"] = True
        return plan

    @staticmethod
    def _passes_again(trainer, stage: str) -> bool:
        """Whether ``stage``'s loader is iterated more than once in this run."""
        if trainer.stage == "validate":  # `ptrain validate`: one pass
            return False
        if trainer.max_epochs != 1:
            return True
        interval = trainer.val_check_interval  # an int counts batches: several checks an epoch
        return stage == "validate" and (isinstance(interval, int) or interval < 1.0)

    def _measure_batch_ms(self, loader: DataLoader) -> float | None:
        """Milliseconds to fetch one batch's items (``dataset[i]`` for the first indices) in
        this process, extrapolated from at most :data:`PROBE_BUDGET_S` of fetching; None
        when the dataset is empty or has no length. Item 0 is fetched first and not timed
        (a first fetch often pays one-off costs: opening files, warming up kernels)."""
        dataset = loader.dataset
        try:
            size = len(dataset)
        except TypeError:
            return None
        if size == 0:
            return None
        batch = loader.batch_size or 1
        with _rng_untouched():
            dataset[0]
            indices = range(1, min(batch + 1, size)) if size > 1 else range(1)
            fetched, start = 0, time.perf_counter()
            for index in indices:
                dataset[index]
                fetched += 1
                if time.perf_counter() - start > PROBE_BUDGET_S:
                    break
            elapsed = time.perf_counter() - start
        return elapsed / fetched * batch * 1e3

    # -- preload ---------------------------------------------------------------------------------

    def _preload(self, trainer, loader: DataLoader, stage: str,
                 report: dict[str, Any]) -> DataLoader:
        dataset = loader.dataset
        name = type(dataset).__qualname__
        if isinstance(dataset, IterableDataset):
            raise ConfigError(
                f"--dataloading-preload can't copy the {stage} dataset into memory: it is an "
                f"IterableDataset ({name}), which has no items to fetch by index. Turn preload "
                f"off, or give a map-style Dataset (__len__ and __getitem__).")
        if in_memory(dataset):
            report.update(preload_bytes=0, preload_seconds=0.0)
            if trainer.is_global_zero:
                print(f"dataloading: {stage} dataset ({name}) is in memory already; not "
                      f"preloaded", flush=True)
            return loader
        try:
            size = len(dataset)
        except TypeError:
            raise ConfigError(f"--dataloading-preload needs the {stage} dataset ({name}) to "
                              f"have a length (__len__).") from None
        copy = self._preloaded.get(id(dataset))
        seconds = 0.0
        if copy is None:
            limit = self.preload_max_gib * _GIB
            items, nbytes, start = [], 0, time.perf_counter()
            with _rng_untouched():
                for index in range(size):
                    item, item_bytes = _materialise(dataset[index])
                    items.append(item)
                    nbytes += item_bytes
                    if nbytes > limit:
                        raise ConfigError(
                            f"--dataloading-preload: the {stage} dataset ({name}) holds more "
                            f"than --dataloading-preload-max-gib {self.preload_max_gib:g} GiB "
                            f"({nbytes / _GIB:.2f} GiB after {index + 1} of {size} items). "
                            f"Raise the limit if this process has the memory, or turn "
                            f"preload off.")
            seconds = time.perf_counter() - start
            copy = self._preloaded[id(dataset)] = PreloadedDataset(items, nbytes, name)
        report.update(preload_bytes=copy.nbytes, preload_seconds=seconds)
        if trainer.is_global_zero:
            print(f"dataloading: preloaded the {stage} dataset ({name}): {size} items, "
                  f"{copy.nbytes} bytes ({copy.nbytes / 2**20:.1f} MiB) in {seconds:.2f} s",
                  flush=True)
        return rebuild_dataloader(loader, dataset=copy)

    @hookimpl
    def teardown(self, trainer) -> None:
        self._preloaded.clear()  # the copies live as long as the loaders that use them
