"""How ``ptrain tune`` measures and decides: candidates interleaved with the baseline, so that
the machine's noise is measured rather than guessed, then the winners combined greedily and
measured again.

A round runs the baseline, then every entry once, in an order that rotates from round to round
(a slow moment of the machine falls on different entries). An entry is **faster** only when
its slowest repeat beat the baseline's fastest and its median is at least 3% above; **slower**
likewise the other way; anything else is a gain within the noise, reported as none. (Ranges
that do not overlap are the extreme of a rank test: with 3 repeats each, two configurations of
equal speed part that way by chance 1 time in 20.)

Every entry gets one :class:`Decision`, made once from the repeats it was measured with; the
table, the summary line and the written configuration all read it and nothing else.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ptrain.errors import ConfigError, ModelError, PtrainError
from ptrain.tuning.candidates import Candidate, RunConfig
from ptrain.tuning.trial import Measurement

#: relative tolerance of "the same numbers" (a candidate that must not change them)
SAME_RTOL = 1e-3
#: ... of the first batch's loss, when later ones drift by rounding
FIRST_RTOL = 1e-4
#: how far a candidate that must not change the numbers may drift from the baseline (rounding
#: in fused kernels, another order of random draws), as a share of the loss's fall
DRIFT_TOLERANCE = 0.02
#: a candidate that may change the numbers is "within tolerance" while its loss fell at least
#: 1 - this of the baseline's fall (see loss_verdict)
LOSS_TOLERANCE = 0.10
#: a loss that ends (the mean of the second half of its batches) above this multiple of its
#: first batch's, or that is not finite, diverged
DIVERGED_RATIO = 2.0
#: a smaller difference of medians is no gain, even when the repeats' ranges are apart: it is
#: not worth a change of configuration, and with few repeats ranges part by chance
MIN_GAIN = 0.03

#: runs one trial of a configuration; the second argument is the deadline it must stop at
#: (``time.monotonic()``), ``None`` for the baseline's trials, which always run to the end
Trial = Callable[[RunConfig, "float | None"], Measurement]
#: how far past the budget a trial may run before it is stopped, as a share of the budget
OVERRUN = 0.1
#: the fewest completed repeats an entry is judged on (one can't measure the noise)
MIN_REPEATS = 2


@dataclass
class Entry:
    """The baseline, a candidate, or a combination of candidates, with its measurements."""

    label: str
    candidates: tuple[Candidate, ...] = ()
    runs: list[Measurement] = field(default_factory=list)
    skipped: str | None = None  # why it was not measured (unavailable, no budget left)
    longest_s: float = 0.0  # its longest trial, wall time (a stopped one included)
    decision: Decision | None = None  # set once, by decide()

    @property
    def numerics(self) -> str:
        return "changed" if any(c.numerics == "changed" for c in self.candidates) else "same"

    @property
    def error(self) -> str | None:
        """Why it failed (a failure of its own, not the budget running out), or ``None``."""
        return next((m.error for m in self.runs if m.error and not m.stopped), None)

    @property
    def stopped(self) -> int:
        """How many of its trials the budget stopped."""
        return sum(m.stopped for m in self.runs)

    @property
    def completed(self) -> list[Measurement]:
        """Its repeats that ran to the end (neither failed nor stopped by the budget)."""
        return [m for m in self.runs if not m.error]

    @property
    def rates(self) -> list[float]:
        """The samples/s of its completed repeats."""
        return [m.samples_per_s for m in self.completed]

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    @property
    def peak_bytes(self) -> int | None:
        peaks = [m.peak_bytes for m in self.runs if m.peak_bytes is not None]
        return max(peaks) if peaks else None

    @property
    def warmup_s(self) -> float:
        """The longest warm-up of its repeats: the first pays what later ones find cached
        (torch.compile's graphs)."""
        return max((m.warmup_s for m in self.runs), default=0.0)

    @property
    def measured(self) -> bool:
        """Whether it can be judged: enough completed repeats and no failure."""
        return len(self.rates) >= MIN_REPEATS and self.error is None


@dataclass(frozen=True)
class Decision:
    """What the tune concluded about one entry, made once (:func:`decide`).

    ``unmeasured``: why it was not judged (skipped, failed, the budget ran out), else ``None``
    and then: ``speed`` (``faster``, ``slower``, ``no gain``) against ``against`` (the user's
    configuration, or for a combination the best entry so far, measured in the same rounds),
    ``loss`` its loss verdict, ``rate`` its median samples/s and ``base_rate`` the user's
    configuration's median in the rounds it was measured in. ``wins``: faster and trains
    acceptably -- the only entries the tune may choose. ``budget``: the budget stopped it."""

    unmeasured: str | None = None
    speed: str = ""
    against: str = "your configuration"
    loss: str = ""
    rate: float | None = None
    base_rate: float | None = None
    budget: bool = False

    @property
    def wins(self) -> bool:
        return self.unmeasured is None and self.speed == "faster" and acceptable(self.loss)

    @property
    def speedup(self) -> float | None:
        """Its samples/s over the user's configuration's, in the same rounds."""
        return None if self.rate is None or not self.base_rate else self.rate / self.base_rate

    @property
    def verdict(self) -> str:
        """The table's verdict: the reason it was not judged, or its speed against
        ``against``."""
        if self.unmeasured is not None:
            return self.unmeasured
        if self.against == "your configuration":
            return self.speed
        word = {"faster": "faster than", "slower": "slower than"}.get(self.speed, "no gain over")
        return f"{word} {self.against}"


def decide(entry: Entry, against: Entry, baseline: Entry, base_now: Entry | None = None
           ) -> Decision:
    """Judge ``entry`` once and keep the decision on it: its speed against ``against`` (the
    user's configuration or the best entry so far), its loss against ``baseline`` (the user's
    configuration's first rounds), its speed-up over ``base_now`` (the user's configuration
    in the same rounds; ``against`` when omitted)."""
    if entry.decision is not None:
        raise RuntimeError(f"{entry.label!r} was decided already")
    base_now = base_now or against
    if entry.skipped:
        decision = Decision(unmeasured=entry.skipped)
    elif entry.error:
        decision = Decision(unmeasured=f"failed: {entry.error}")
    elif not entry.measured:
        done = len(entry.rates)
        decision = Decision(unmeasured=f"not measured: the budget ran out during its trials "
                                       f"({done} of the {MIN_REPEATS} repeats it needs done)",
                            budget=True)
    else:
        decision = Decision(speed=speed_verdict(entry, against), against=against.label,
                            loss=loss_verdict(entry, baseline), rate=entry.median,
                            base_rate=base_now.median)
    entry.decision = decision
    return decision


def speed_verdict(entry: Entry, baseline: Entry) -> str:
    """``faster``, ``slower`` or ``no gain``, from the repeats' ranges: apart, and the medians
    at least :data:`MIN_GAIN` apart, or it is within the noise."""
    ratio = entry.median / baseline.median
    if min(entry.rates) > max(baseline.rates) and ratio >= 1 + MIN_GAIN:
        return "faster"
    if max(entry.rates) < min(baseline.rates) and ratio <= 1 - MIN_GAIN:
        return "slower"
    return "no gain"


def loss_verdict(entry: Entry, baseline: Entry) -> str:
    """What happened to the loss against the baseline's, measured by the *fall* of the loss:
    from the baseline's first loss (the same weights and batch for every trial) to its mean over
    the second half of the samples both runs trained. A candidate's share of that fall is 1.0
    when it got as far down (losses near zero compare by how far they fell, not by a ratio of
    two tiny numbers).

    A candidate that must not change the numbers: ``same`` (every batch's loss within
    :data:`SAME_RTOL`, or within the baseline's own spread between repeats); ``same (drift
    ...)`` when its first loss agrees within :data:`FIRST_RTOL` and later ones drift apart
    (rounding in fused kernels, another order of random draws) by at most
    :data:`DRIFT_TOLERANCE` of the fall; else ``differs (...)``.

    One that may change them: ``within tolerance`` (at least 1 - :data:`LOSS_TOLERANCE` of the
    fall), ``less progress (...)``, ``diverged``, or ``not comparable`` when its first batch
    holds more samples than the baseline's measured steps together (it can't win then)."""
    base = baseline.completed[0]
    if entry.numerics == "same":
        worst = max(_relative_difference(run.losses, base.losses) for run in entry.completed)
        # the baseline's own repeats may differ (a nondeterministic kernel): that much is noise
        own = max((_relative_difference(run.losses, base.losses) for run in baseline.completed),
                  default=0.0)
        if worst <= max(SAME_RTOL, 2 * own):
            return "same"
        first = max(_relative_difference(run.losses[:1], base.losses[:1])
                    for run in entry.completed)
        if first > FIRST_RTOL:
            return f"differs (its first loss, with the same weights, by {first:.2%})"
        shares = [_share_of_fall(run, base) for run in entry.completed]
        drift = max(math.inf if f is None or math.isnan(f) else abs(f - 1) for f in shares)
        if drift <= DRIFT_TOLERANCE:
            return f"same (drift {drift:.1%} of the loss's fall)"
        return f"differs (by {drift:.0%} of the loss's fall)"
    if any(_diverged(run) for run in entry.completed):
        return "diverged"
    shares = [_share_of_fall(run, base) for run in entry.completed]
    if any(share is None for share in shares):
        return ("not comparable: its first batch holds more samples than your measured steps "
                "together; raise --tune-steps")
    share = min(shares)
    if math.isnan(share):
        return "diverged"
    if share >= 1 - LOSS_TOLERANCE:
        return "within tolerance"
    return f"less progress ({share:.0%} of your loss's fall)"


def _share_of_fall(run: Measurement, base: Measurement) -> float | None:
    """How much of ``base``'s loss fall ``run`` made over the second half of the samples both
    trained (see :func:`loss_verdict`); ``None`` when ``run`` has no batch there, ``nan`` for a
    loss that is not finite. Where ``base`` barely fell (under 1% of its first loss), the two
    levels are compared instead: 1.0 equal, less when ``run`` ended higher."""
    common = min(run.trained[-1], base.trained[-1]) if run.trained and base.trained else 0
    ours, theirs = _window_mean(run, common), _window_mean(base, common)
    if ours is None or theirs is None:
        return None
    if not (math.isfinite(ours) and math.isfinite(theirs)):
        return math.nan
    start = next((x for x in base.losses if math.isfinite(x)), theirs)
    fall = start - theirs
    if fall <= 0.01 * abs(start):
        return 1.0 - (ours - theirs) / max(abs(theirs), 1e-12)
    return (start - ours) / fall


def winners(entries: list[Entry]) -> list[Entry]:
    """The entries whose decision wins (faster beyond the noise, and an acceptable loss), the
    fastest first."""
    return sorted((e for e in entries if e.decision is not None and e.decision.wins),
                  key=lambda e: e.median, reverse=True)


def acceptable(verdict: str) -> bool:
    """Whether a loss verdict lets a candidate win."""
    return verdict.startswith(("same", "within tolerance"))


def _relative_difference(losses: list[float], reference: list[float]) -> float:
    """The largest relative difference of two runs' losses, batch by batch (``inf`` when their
    lengths differ or one is not finite where the other is)."""
    if len(losses) != len(reference):
        return math.inf
    worst = 0.0
    for a, b in zip(losses, reference):
        if math.isnan(a) and math.isnan(b):
            continue
        if not (math.isfinite(a) and math.isfinite(b)):
            return math.inf
        worst = max(worst, abs(a - b) / max(abs(b), 1e-12))
    return worst


def _diverged(run: Measurement) -> bool:
    """A loss that is not finite, or that ended above where it started (by
    :data:`DIVERGED_RATIO`)."""
    losses = [x for x in run.losses if not math.isnan(x)]
    if not losses or not all(map(math.isfinite, losses)):
        return True
    tail = losses[len(losses) // 2:]
    return sum(tail) / len(tail) > DIVERGED_RATIO * abs(losses[0])


def _window_mean(run: Measurement, common: int) -> float | None:
    """The mean loss of ``run``'s batches whose weights had trained on more than half of the
    first ``common`` samples and at most all of them (``nan`` when one is not finite; ``None``
    when no batch falls there)."""
    window = [loss for loss, trained in zip(run.losses, run.trained)
              if common / 2 < trained <= common and not math.isnan(loss)]
    if not window:
        return None
    return sum(window) / len(window) if all(map(math.isfinite, window)) else math.nan


class Search:
    """Measures entries against the baseline within a time budget; ``progress(text)`` is told
    each trial as it starts."""

    def __init__(self, base: RunConfig, trial: Trial, budget_s: float, repeats: int,
                 progress: Callable[[str], Any] = lambda text: None):
        self.base, self.trial, self.repeats, self.progress = base, trial, repeats, progress
        self.started = time.monotonic()
        self.deadline = self.started + budget_s
        self.budget_s = budget_s
        self.baseline = Entry("your configuration")
        self.trial_s = 0.0  # the longest trial seen
        self.last_round_s = 0.0
        self.rounds_started: float | None = None  # when the first measured round began
        self.tried: list[Entry] = []  # the combinations tried (see combine)

    def _run(self, entry: Entry) -> None:
        self.progress(entry.label)
        start = time.monotonic()
        # the user's configuration always runs to the end: every candidate is judged on it
        deadline = None if not entry.candidates else self.deadline + OVERRUN * self.budget_s
        if deadline is not None and start > deadline:  # it would be stopped at its first step
            entry.runs.append(Measurement(error="stopped: the tune's budget had run out before "
                                                "this trial", stopped=True))
            return
        entry.runs.append(self.trial(self.base.with_candidates(entry.candidates), deadline))
        took = time.monotonic() - start
        entry.longest_s = max(entry.longest_s, took)
        self.trial_s = max(self.trial_s, took)

    def start(self) -> Measurement:
        """The baseline's first trial, not counted (the process's first training pays what
        later ones find done: lazy imports, the allocator's first blocks); a baseline that
        fails is the user's error to fix. Returns its measurement."""
        self._run(self.baseline)
        failed = self.baseline.runs.pop()
        self.baseline.longest_s = 0.0  # the counted trials say how long one takes
        if isinstance(failed.exception, PtrainError):  # a usage error: as `fit` would say it
            raise failed.exception
        if failed.error:
            raise ModelError(f"your configuration did not train, so nothing can be measured "
                             f"against it: {failed.error.rstrip('.')}. Fix it so that `ptrain "
                             f"fit` runs with the same options, then tune again.")
        return failed

    def rounds_that_fit(self, entries: int) -> int:
        """How many rounds of ``entries`` and the baseline the budget left allows (at most
        ``repeats``)."""
        left = self.deadline - time.monotonic()
        return min(self.repeats, int(left // (max(self.trial_s, 1e-6) * (entries + 1))))

    def check_budget(self, entries: int) -> None:
        """A budget too small for two rounds (noise can't be measured from one) is an error;
        before any round, every trial is assumed to take as long as the baseline's first."""
        if self.rounds_that_fit(entries) < MIN_REPEATS:
            spent = time.monotonic() - self.started
            needed = spent + MIN_REPEATS * self.trial_s * (entries + 1)
            raise self._too_small(
                f"one trial of your model takes {self.trial_s:.1f} s, and measuring {entries} "
                f"candidate(s) against your configuration twice",
                f"needs about {math.ceil(needed)} s", needed)

    def check_measured(self, entries: list[Entry]) -> None:
        """After the rounds: when the budget ran out before any of ``entries`` (the candidates
        that could run) was measured twice, the tune has nothing to conclude, and that is the
        same error as :meth:`check_budget`'s, now from the trials' real times."""
        if not entries or any(e.measured for e in entries):
            return
        cut = [e for e in entries if e.error is None]
        if not cut:
            return  # every candidate failed on its own: the table says why
        slowest = max(cut, key=lambda e: e.longest_s)
        needed, stopped = self.needed(cut)
        slowest_s = f"{'more than ' if slowest.stopped else ''}{slowest.longest_s:.1f} s"
        raise self._too_small(
            f"it ran out before any candidate was measured twice. One trial of your "
            f"configuration takes {self.baseline.longest_s:.1f} s and one of {slowest.label!r} "
            f"{slowest_s}; two interleaved rounds of your configuration and its {len(cut)} "
            f"candidate(s)", f"need {'at least' if stopped else 'about'} {math.ceil(needed)} s",
            needed)

    def needed(self, entries: list[Entry]) -> tuple[float, bool]:
        """The budget that measures ``entries`` twice, from their longest trials so far, and
        whether that is only a lower bound (a trial the budget stopped took longer)."""
        before = (self.rounds_started or self.started) - self.started
        round_s = self.baseline.longest_s + sum(e.longest_s for e in entries)
        stopped = any(e.stopped for e in entries)
        if stopped:  # the tune has run past the budget already, and is not done
            return max(before + MIN_REPEATS * round_s, time.monotonic() - self.started), True
        return before + MIN_REPEATS * round_s, False

    def budget_note(self, entries: list[Entry]) -> str | None:
        """What to say when the budget ran out before some of ``entries`` (decided) were
        measured twice while others were: which, and the budget that measures them."""
        cut = [e for e in entries if e.decision is not None and e.decision.budget]
        if not cut:
            return None
        needed, stopped = self.needed([e for e in entries if e.error is None and not e.skipped])
        return (f"the budget ran out before these candidates had two repeats, so they were "
                f"not judged: {', '.join(e.label for e in cut)}. Measuring every candidate "
                f"twice needs {'at least' if stopped else 'about'} {math.ceil(needed)} s: give "
                f"--tune-budget "
                f"{_seconds(math.ceil(needed * 1.2))} or more, or --tune-only to tune fewer.")

    def _too_small(self, what: str, need: str, needed: float) -> ConfigError:
        give = math.ceil(needed * 1.2)
        return ConfigError(
            f"--tune-budget {self.budget_s:g}s is too small: {what} (the least that measures "
            f"the noise) {need}. Give --tune-budget {_seconds(give)} or more, or fewer "
            f"candidates (--tune-only, --tune-skip), or fewer steps (--tune-steps).")

    def measure(self, entries: list[Entry], rounds: int, baseline: Entry | None = None) -> int:
        """Up to ``rounds`` rounds of ``baseline`` (the user's configuration; by default
        ``self.baseline``) and ``entries``, interleaved. A round after the first is not started
        when the time left is less than the last round took (some candidates take longer than
        the baseline, compile among them). An entry that failed, or that the budget stopped,
        is not tried again. Returns the rounds run."""
        baseline = baseline or self.baseline
        if self.rounds_started is None:
            self.rounds_started = time.monotonic()
        for index in range(rounds):
            started = time.monotonic()
            if index >= 1 and self.deadline - started < self.last_round_s:
                return index
            self._run(baseline)
            shift = index % max(1, len(entries))
            for entry in entries[shift:] + entries[:shift]:
                if entry.error is None and not entry.stopped:
                    self._run(entry)
            self.last_round_s = time.monotonic() - started
        return rounds

    def judge(self, entries: list[Entry]) -> list[Entry]:
        """Decide every entry against the baseline's rounds; returns the winners, fastest
        first."""
        for entry in entries:
            decide(entry, self.baseline, self.baseline)
        return winners(entries)

    def combine(self, winners: list[Entry]) -> Entry | None:
        """Greedily from the fastest winner: add the next winner of another setting, and keep
        the combination when its decision wins: faster than the best so far beyond the noise
        (the two measured in the same rounds) and an acceptable loss. The best entry, or
        ``None`` without winners; every combination tried is in ``self.tried``, decided."""
        if not winners:
            return None
        best = winners[0]
        for winner in winners[1:]:
            if winner.candidates[0].setting in {c.setting for c in best.candidates}:
                continue
            combo = Entry(" + ".join(c.name for c in (*best.candidates, *winner.candidates)),
                          (*best.candidates, *winner.candidates))
            self.tried.append(combo)
            rounds = self.rounds_that_fit(2)
            if rounds < MIN_REPEATS:
                combo.skipped = "not measured: the budget was spent"
                decide(combo, self.baseline, self.baseline)
                continue
            best_again = Entry(best.label, best.candidates)
            base_again = Entry(self.baseline.label)
            self.measure([best_again, combo], rounds, base_again)
            if not best_again.measured:
                combo.skipped = (f"not measured: the budget ran out while measuring "
                                 f"{best.label} again beside it")
            if decide(combo, best_again, self.baseline, base_again).wins:
                best = combo
        return best


def _seconds(seconds: int) -> str:
    """``95s``, or whole minutes from 5 minutes on (``7m``)."""
    return f"{math.ceil(seconds / 60)}m" if seconds >= 300 else f"{seconds}s"


__all__ = ["Decision", "Entry", "MIN_REPEATS", "Search", "acceptable", "decide", "loss_verdict",
           "speed_verdict", "winners"]
