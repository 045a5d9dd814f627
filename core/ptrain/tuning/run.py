"""A whole ``ptrain tune``: gather the installed plugins' candidates, measure each against the
user's configuration, combine the winners, and build the winning configuration."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ptrain.errors import PluginError
from ptrain.tuning.candidates import Candidate, RunConfig, changes_nothing, selected_settings
from ptrain.tuning.search import Entry, Search
from ptrain.tuning.trial import Components, run_trial

#: the strategies that run in one process (any other is tuned on one process, and said)
ONE_PROCESS = ("single-device",)
#: without --tune-steps: at least this many measured steps, and as many as take about
#: AUTO_MEASURED_S seconds of the user's configuration, up to AUTO_MAX_STEPS
AUTO_MIN_STEPS, AUTO_MAX_STEPS, AUTO_MEASURED_S = 30, 2000, 1.0


@dataclass
class TuneOutcome:
    """What a tune found. ``entries``: every candidate (measured, failed, or skipped with the
    reason); ``combinations``: the combinations tried; every one of them carries its
    :class:`~ptrain.tuning.search.Decision`, which the table, the summary and the written file
    all read. ``best``: the winning entry (``None`` when nothing beat the user's
    configuration beyond the noise); ``config``: the winning run configuration (the user's own
    without a winner); ``notes``: what the table must say besides (a seed chosen, a strategy
    tuned on one process, a plugin that failed to import)."""

    baseline: Entry
    entries: list[Entry]
    combinations: list[Entry]
    best: Entry | None
    config: RunConfig
    rounds: int
    notes: list[str] = field(default_factory=list)


def offered_candidates(catalog: Any, trainer: Any, notes: list[str]) -> list[Candidate]:
    """Every installed plugin's candidates; a plugin that can't run here has its candidates
    marked with its reason, and one that fails to import or to answer is noted."""
    from ptrain.loading import check_available, import_target, tune_candidates

    offered: list[Candidate] = []
    for info in catalog.infos:
        if len(catalog.claims(info.kind, info.name)) > 1:
            continue  # a conflict `ptrain plugins` reports; which one would run is unknown
        try:
            target = import_target(info)
            candidates = tune_candidates(target, info.name, trainer)
        except PluginError as exc:
            notes.append(str(exc))
            continue
        except Exception as exc:  # a plugin's own bug: named, the others still measured
            notes.append(f"plugin {info.name!r} ({info.distribution}): tune_candidates raised "
                         f"{type(exc).__name__}: {exc}")
            continue
        reason = check_available(target, info.name) if candidates else None
        offered += [dataclasses.replace(c, unavailable=c.unavailable or reason)
                    for c in candidates]
    return offered


def one_process(base: RunConfig, notes: list[str]) -> RunConfig:
    """``base`` on one process: a multi-process strategy's per-process settings are tuned on one,
    and the note says so (the written configuration keeps the user's strategy)."""
    strategy = base.trainer.get("strategy", "single-device")
    devices = base.trainer.get("devices", 1)
    if strategy in ONE_PROCESS and devices in (1, "1"):
        return base
    notes.append(f"your strategy {strategy!r} (devices {devices}) runs several processes; the "
                 f"per-process settings were tuned on one process (single-device), and the "
                 f"written configuration keeps your strategy.")
    return RunConfig({**base.trainer, "strategy": "single-device", "devices": 1,
                      "num_nodes": 1}, base.plugin_options)


def tune(base: RunConfig, components: Components, *, catalog: Any, budget_s: float,
         warmup: int, steps: int | None, repeats: int, only: list[str] | None = None,
         skip: list[str] | None = None,
         progress: Callable[[str], Any] = lambda text: None) -> TuneOutcome:
    """Measure the installed plugins' candidates on ``components`` (the user's model and data,
    built anew for every trial) against ``base``, combine the winners, and return what was
    found. ``steps``: measured optimizer steps per trial; ``None`` chooses them from the
    baseline's first trial (see :data:`AUTO_MEASURED_S`). Bad input (an unknown setting in
    ``only``/``skip``, a budget too small, a baseline that fails) raises a
    :class:`ptrain.PtrainError`."""
    from ptrain.checkpoint_io import preserved_rng_states
    from ptrain.trainer import Trainer

    # the caller's random state is left as it was (the trainers made here seed)
    with preserved_rng_states():
        notes: list[str] = []
        seed = base.trainer.get("seed")
        if seed is None:
            seed = 0
            notes.append("your configuration sets no seed: every trial ran with seed 0, so that "
                         "all start from the same weights and see the same batches.")
        measured_base = one_process(base, notes)
        user_trainer = Trainer(plugin_options={k: dict(v) for k, v in base.plugin_options.items()},
                               catalog=catalog, **base.trainer)
        offered = selected_settings(offered_candidates(catalog, user_trainer, notes), only, skip)
        entries = []
        for candidate in offered:
            entry = Entry(candidate.name, (candidate,))
            if candidate.unavailable:
                entry.skipped = f"can't run here: {candidate.unavailable}"
            elif changes_nothing(measured_base, candidate):
                entry.skipped = "already your configuration"
            entries.append(entry)

        measured_steps = steps or AUTO_MIN_STEPS

        def trial(config: RunConfig, deadline: float | None):
            return run_trial(config, components, seed=seed, warmup=warmup, steps=measured_steps,
                             catalog=catalog, deadline=deadline)

        search = Search(measured_base, trial, budget_s, repeats, progress)
        first = search.start()
        if steps is None:  # enough steps that the clock's and the machine's jitter average out
            per_step = first.measured_s / measured_steps
            measured_steps = max(AUTO_MIN_STEPS, min(AUTO_MAX_STEPS, math.ceil(
                AUTO_MEASURED_S / max(per_step, 1e-9))))
            search.trial_s += (measured_steps - AUTO_MIN_STEPS) * per_step
            notes.append(f"each trial measured {measured_steps} optimizer steps after {warmup} of "
                         f"warm-up (about {AUTO_MEASURED_S:g} s of your configuration's training; "
                         f"--tune-steps sets the number).")
        return conclude(search, entries, base, notes)


def conclude(search: Search, entries: list[Entry], base: RunConfig,
             notes: list[str]) -> TuneOutcome:
    """Measure ``entries`` (those not skipped) after ``search.start()``, decide each once,
    combine the winners, and return the outcome; a budget too small to measure any candidate
    twice is a :class:`ptrain.ConfigError` that says how much is needed."""
    runnable = [e for e in entries if e.skipped is None]
    search.check_budget(len(runnable))
    rounds = search.measure(runnable, search.rounds_that_fit(len(runnable)))
    search.check_measured(runnable)
    found = search.judge(entries)
    note = search.budget_note(runnable)
    if note:
        notes.append(note)
    best = search.combine(found)
    config = base.with_candidates(best.candidates) if best is not None else base
    return TuneOutcome(search.baseline, entries, search.tried, best, config, rounds, notes)


__all__ = ["TuneOutcome", "conclude", "offered_candidates", "one_process", "tune"]
