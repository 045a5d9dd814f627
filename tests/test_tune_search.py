"""How ``ptrain tune`` decides (issue 17), on measurements made up by a stand-in trial function:
the greedy combination of winners of different settings, a combination kept only when it is
faster than the best so far, one candidate per setting, and a multi-process strategy tuned on
one process. (Real trials: tests/test_tune.py.)"""

from __future__ import annotations

import math

from ptrain.tuning import Candidate, RunConfig
from ptrain.tuning.run import one_process
from ptrain.tuning.search import Entry, Search, winners
from ptrain.tuning.trial import Measurement

#: what each candidate multiplies the samples/s by, alone; "d" adds nothing next to "a"
FACTORS = {"a": 1.5, "b": 1.3, "a2": 1.2, "slow": 0.7, "d": 1.2}
LOSSES = [1.0, 0.8, 0.6, 0.5]


def speed(config: RunConfig) -> float:
    chosen = set(config.plugin_options.get("fake", {}))
    rate = 100.0
    for name in chosen:
        if not (name == "d" and "a" in chosen):
            rate *= FACTORS[name]
    return rate


class StandIn:
    """A trial function: the rate :func:`speed` gives, with a ±0.5% jitter that alternates."""

    def __init__(self):
        self.calls = 0

    def __call__(self, config: RunConfig, deadline: float | None) -> Measurement:
        self.calls += 1
        jitter = 1 + 0.005 * (-1) ** self.calls
        return Measurement(samples_per_s=speed(config) * jitter, measured_s=1.0,
                           losses=list(LOSSES), trained=[4 * i for i in range(len(LOSSES))])


def candidate(name: str, setting: str) -> Candidate:
    return Candidate(name, setting, plugin_options={"fake": {name: True}})


def search_with(*candidates: Candidate) -> tuple[Search, list[Entry]]:
    search = Search(RunConfig({}, {}), StandIn(), budget_s=600, repeats=3)
    search.start()
    entries = [Entry(c.name, (c,)) for c in candidates]
    search.measure(entries, 3)
    return search, entries


def test_winners_of_different_settings_are_combined_and_kept_when_faster():
    search, entries = search_with(candidate("a", "x"), candidate("b", "y"), candidate("a2", "x"),
                                  candidate("slow", "z"))
    found = winners(entries, search.baseline)
    assert [e.label for e in found] == ["a", "b", "a2"]  # fastest first; "slow" is no winner
    best = search.combine(found)
    assert best.label == "a + b"  # a2 changes the setting a already holds: never combined
    assert [combo.label for combo in search.tried] == ["a + b"]
    assert math.isclose(best.median / search.baseline.median, 1.5 * 1.3, rel_tol=0.02)


def test_a_combination_that_is_not_faster_than_the_best_alone_is_dropped():
    search, entries = search_with(candidate("a", "x"), candidate("d", "y"))
    best = search.combine(winners(entries, search.baseline))
    assert [combo.label for combo in search.tried] == ["a + d"]
    assert best.label == "a"


def test_a_multi_process_strategy_is_tuned_on_one_process_and_kept_in_the_result():
    notes: list[str] = []
    user = RunConfig({"strategy": "ddp", "devices": 2}, {})
    measured = one_process(user, notes)
    assert (measured.trainer["strategy"], measured.trainer["devices"]) == ("single-device", 1)
    assert "tuned on one process" in notes[0] and "keeps your strategy" in notes[0]
    tuned = user.with_candidates((candidate("a", "x"),))
    assert (tuned.trainer["strategy"], tuned.trainer["devices"]) == ("ddp", 2)
    assert one_process(RunConfig({"strategy": "single-device"}, {}), notes).trainer == {
        "strategy": "single-device"} and len(notes) == 1
