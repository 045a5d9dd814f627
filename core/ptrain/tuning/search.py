"""How ``ptrain tune`` measures: candidates interleaved with the baseline, so that the machine's
noise is measured rather than guessed, then the winners combined greedily and measured again.

A round runs the baseline, then every entry once, in an order that rotates from round to round
(a slow moment of the machine falls on different entries). An entry is **faster** only when
its slowest repeat beat the baseline's fastest and its median is at least 3% above; **slower**
likewise the other way; anything else is a gain within the noise, reported as none.
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


@dataclass
class Entry:
    """The baseline, a candidate, or a combination of candidates, with its measurements."""

    label: str
    candidates: tuple[Candidate, ...] = ()
    runs: list[Measurement] = field(default_factory=list)
    skipped: str | None = None  # why it was not measured (unavailable, no budget left)

    @property
    def numerics(self) -> str:
        return "changed" if any(c.numerics == "changed" for c in self.candidates) else "same"

    @property
    def error(self) -> str | None:
        return next((m.error for m in self.runs if m.error), None)

    @property
    def rates(self) -> list[float]:
        return [m.samples_per_s for m in self.runs if not m.error]

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
        return bool(self.runs) and self.error is None


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
    base = baseline.runs[0]
    if entry.numerics == "same":
        worst = max(_relative_difference(run.losses, base.losses) for run in entry.runs)
        # the baseline's own repeats may differ (a nondeterministic kernel): that much is noise
        own = max((_relative_difference(run.losses, base.losses) for run in baseline.runs),
                  default=0.0)
        if worst <= max(SAME_RTOL, 2 * own):
            return "same"
        first = max(_relative_difference(run.losses[:1], base.losses[:1]) for run in entry.runs)
        if first > FIRST_RTOL:
            return f"differs (its first loss, with the same weights, by {first:.2%})"
        shares = [_share_of_fall(run, base) for run in entry.runs]
        drift = max(math.inf if f is None or math.isnan(f) else abs(f - 1) for f in shares)
        if drift <= DRIFT_TOLERANCE:
            return f"same (drift {drift:.1%} of the loss's fall)"
        return f"differs (by {drift:.0%} of the loss's fall)"
    if any(_diverged(run) for run in entry.runs):
        return "diverged"
    shares = [_share_of_fall(run, base) for run in entry.runs]
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


def winners(entries: list[Entry], baseline: Entry) -> list[Entry]:
    """The entries faster than the baseline beyond the noise whose loss is acceptable, the
    fastest first."""
    return sorted((e for e in entries if e.measured and speed_verdict(e, baseline) == "faster"
                   and acceptable(loss_verdict(e, baseline))),
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
        self.deadline = time.monotonic() + budget_s
        self.budget_s = budget_s
        self.baseline = Entry("your configuration")
        self.trial_s = 0.0  # the longest trial seen
        self.last_round_s = 0.0
        self.tried: list[Entry] = []  # the combinations tried (see combine)

    def _run(self, entry: Entry) -> None:
        self.progress(entry.label)
        start = time.monotonic()
        deadline = None if entry is self.baseline else self.deadline + OVERRUN * self.budget_s
        entry.runs.append(self.trial(self.base.with_candidates(entry.candidates), deadline))
        self.trial_s = max(self.trial_s, time.monotonic() - start)

    def start(self) -> Measurement:
        """The baseline's first trial, not counted (the process's first training pays what
        later ones find done: lazy imports, the allocator's first blocks); a baseline that
        fails is the user's error to fix. Returns its measurement."""
        self._run(self.baseline)
        failed = self.baseline.runs.pop()
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
        return min(self.repeats, int(left // (self.trial_s * (entries + 1))))

    def check_budget(self, entries: int) -> None:
        """A budget too small for two rounds (noise can't be measured from one) is an error."""
        if self.rounds_that_fit(entries) < 2:
            spent = self.budget_s - (self.deadline - time.monotonic())
            needed = spent + 2 * self.trial_s * (entries + 1)
            raise ConfigError(
                f"--tune-budget {self.budget_s:g}s is too small: one trial of your model takes "
                f"{self.trial_s:.1f} s, and measuring {entries} candidate(s) against your "
                f"configuration twice (the least that measures the noise) needs about "
                f"{math.ceil(needed)} s. Give --tune-budget {math.ceil(needed * 1.2)}s or more, "
                f"or fewer candidates (--tune-only, --tune-skip), or fewer steps (--tune-steps).")

    def measure(self, entries: list[Entry], rounds: int) -> int:
        """Up to ``rounds`` rounds of the baseline and ``entries``, interleaved. Rounds after
        the second stop when the time left is less than the last round took (some candidates
        take longer than the baseline, compile among them). Returns the rounds run."""
        for index in range(rounds):
            started = time.monotonic()
            if index >= 2 and self.deadline - started < self.last_round_s:
                return index
            self._run(self.baseline)
            shift = index % max(1, len(entries))
            for entry in entries[shift:] + entries[:shift]:
                if entry.error is None:  # a failure is not tried again
                    self._run(entry)
            self.last_round_s = time.monotonic() - started
        return rounds

    def combine(self, winners: list[Entry]) -> Entry | None:
        """Greedily from the fastest winner: add the next winner of another setting, keep the
        combination when it is faster than the best so far beyond the noise (and trains
        acceptably). The best entry, or ``None`` without winners; entries that could not be
        measured within the budget are left in ``self.tried`` with ``skipped`` set."""
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
            if rounds < 2:
                combo.skipped = "not measured: the budget was spent"
                continue
            best_again = Entry(best.label, best.candidates)
            self.measure([best_again, combo], rounds)
            if combo.measured and speed_verdict(combo, best_again) == "faster" and \
                    acceptable(loss_verdict(combo, self.baseline)):
                best = combo
        return best


__all__ = ["Entry", "Search", "acceptable", "loss_verdict", "speed_verdict", "winners"]
