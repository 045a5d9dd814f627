"""How ``ptrain tune`` decides (issues 17 and 34), on measurements made up by a stand-in trial
function: the greedy combination of winners of different settings, a combination kept only
when it is faster than the best so far, one candidate per setting, a multi-process strategy
tuned on one process; the table, the summary line and the written file agree on every draw of
noisy timings; a budget that no candidate's trials fit is an error that says how much is
needed. (Real trials: tests/test_tune.py.)"""

from __future__ import annotations

import math
import random
import re
import time

import pytest

from ptrain.errors import ConfigError
from ptrain.tuning import Candidate, RunConfig
from ptrain.tuning.report import rows, summary, write_config
from ptrain.tuning.run import conclude, one_process
from ptrain.tuning.search import Entry, Search, acceptable
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
    found = search.judge(entries)
    assert [e.label for e in found] == ["a", "b", "a2"]  # fastest first; "slow" is no winner
    best = search.combine(found)
    assert best.label == "a + b"  # a2 changes the setting a already holds: never combined
    assert [combo.label for combo in search.tried] == ["a + b"]
    assert math.isclose(best.median / search.baseline.median, 1.5 * 1.3, rel_tol=0.02)


def test_a_combination_that_is_not_faster_than_the_best_alone_is_dropped():
    search, entries = search_with(candidate("a", "x"), candidate("d", "y"))
    best = search.combine(search.judge(entries))
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


# -- the table, the summary and tuned.toml agree (issue 34) ----------------------------------

#: candidates near the thresholds, so that noise decides: (name, setting, numerics, factor)
NEAR = [("a", "x", "same", 1.08), ("b", "y", "same", 1.05), ("c", "z", "changed", 1.12),
        ("e", "v", "changed", 1.10), ("d", "w", "same", 0.97), ("a2", "x", "same", 1.04)]
#: "c" learns less per sample: faster, but never acceptable
LESS_PROGRESS = [1.0, 0.9, 0.8, 0.75]


class NoisyStandIn:
    """A trial function with seeded noise: the rate of the configuration's candidates times
    ``1 + N(0, noise)``; now and then a candidate's trial fails on its own or is stopped by the
    budget, as real trials are."""

    def __init__(self, seed: int, noise: float):
        self.rng, self.noise = random.Random(seed), noise
        self.factors = {name: factor for name, _, _, factor in NEAR}

    def __call__(self, config: RunConfig, deadline: float | None) -> Measurement:
        chosen = set(config.plugin_options.get("fake", {}))
        rate = 100.0 * math.prod(self.factors[name] for name in chosen)
        if chosen and self.rng.random() < 0.04:
            return Measurement(error="TrialStopped: stopped: the tune's budget ran out",
                               stopped=True)
        if chosen and self.rng.random() < 0.02:
            return Measurement(error="RuntimeError: failed on its own")
        losses = LESS_PROGRESS if "c" in chosen else LOSSES
        return Measurement(samples_per_s=rate * (1 + self.rng.gauss(0, self.noise)),
                           measured_s=1.0, losses=list(losses),
                           trained=[4 * i for i in range(len(losses))])


def tune_draw(seed: int):
    """One tune on the stand-in: its noise level and repeats drawn from ``seed``."""
    rng = random.Random(seed)
    search = Search(RunConfig({}, {}), NoisyStandIn(seed, rng.choice([0.01, 0.03, 0.06])),
                    budget_s=600, repeats=rng.choice([2, 3, 5]))
    search.start()
    entries = [Entry(name, (Candidate(name, setting, plugin_options={"fake": {name: True}},
                                      numerics=numerics),))
               for name, setting, numerics, _ in NEAR]
    return conclude(search, entries, RunConfig({}, {}), [])


def said(outcome, tmp_path):
    """What the user reads: the table's rows, the summary line, the written file."""
    out = tmp_path / "tuned.toml"
    chosen = sorted(outcome.config.plugin_options.get("fake", {}))
    write_config(outcome, f"fake = {chosen}\n", out)
    return rows(outcome), " ".join(summary(outcome, out).split()), out.read_text()


def test_the_verdict_the_table_and_the_written_file_agree_on_every_draw(tmp_path):
    outcomes = {"chosen": 0, "combined": 0, "none": 0}
    for seed in range(300):
        table, line, written = said(tune_draw(seed), tmp_path)
        context = (seed, line, [(r["candidate"], r["speedup"], r["loss"], r["verdict"])
                                for r in table])
        starred = [r for r in table if r["best"]]
        # the single candidates the table shows as faster and training acceptably
        winning = [r for r in table if " + " not in r["candidate"]
                   and r["verdict"] == "faster" and acceptable(r["loss"])]
        fastest = re.match(r"Fastest: (.+?)(?: \(faster than (.+?) alone[^)]*\))?, "
                           r"([0-9.]+)x your configuration's samples/s", line)
        if fastest is None:
            outcomes["none"] += 1
            assert line.startswith("No "), context
            assert not starred and not winning, context
            assert written.startswith("# written by ptrain tune: changed from your "
                                      "configuration: nothing"), (context, written)
            assert "fake = []" in written and "# measured" not in written, context
            # every candidate the summary says was faster but lost on its loss, the table
            # shows as faster with that loss
            for row in table[1:]:
                if row["verdict"] == "faster":
                    assert f"{row['candidate']} was {row['speedup']:.2f}x as fast, but its " \
                           f"loss: {row['loss']}" in line, context
            continue
        label, over, gain = fastest.groups()
        outcomes["combined" if over else "chosen"] += 1
        assert [r["candidate"] for r in starred] == [label], context
        row = starred[0]
        assert row["verdict"] == ("faster" if over is None else f"faster than {over}"), context
        assert acceptable(row["loss"]) and f"{row['speedup']:.2f}" == gain, context
        # the greedy search starts from the fastest single winner the table shows
        assert winning and label.split(" + ")[0] == max(
            winning, key=lambda r: r["samples_per_s"])["candidate"], context
        assert written.startswith(f"# written by ptrain tune: changed from your configuration: "
                                  f"{label}\n# measured: {gain}x"), (context, written)
        assert f"fake = {sorted(label.split(' + '))}" in written, (context, written)
    # the draws reached every kind of conclusion
    assert all(outcomes.values()), outcomes


class DeadlineStandIn:
    """The user's configuration trains in a moment; every candidate's trial runs until the
    deadline it is given and is then stopped, as the probe stops a real one."""

    def __call__(self, config: RunConfig, deadline: float | None) -> Measurement:
        if deadline is None:
            return Measurement(samples_per_s=100.0, measured_s=0.01, losses=list(LOSSES),
                               trained=[4 * i for i in range(len(LOSSES))])
        while time.monotonic() <= deadline:
            time.sleep(0.01)
        return Measurement(error="TrialStopped: stopped: the tune's budget ran out during "
                                 "this trial", stopped=True)


def test_a_budget_no_candidate_fits_is_an_error_that_says_how_much_is_needed():
    search = Search(RunConfig({}, {}), DeadlineStandIn(), budget_s=1, repeats=3)
    search.start()
    entries = [Entry(c.name, (c,)) for c in (candidate("a", "x"), candidate("b", "y"))]
    with pytest.raises(ConfigError) as raised:
        conclude(search, entries, RunConfig({}, {}), [])
    message = str(raised.value)
    assert message.startswith("--tune-budget 1s is too small: it ran out before any candidate "
                              "was measured twice"), message
    assert re.search(r"one of 'a' more than 1\.\d s", message), message
    needed = int(re.search(r"need at least (\d+) s", message)[1])
    given = int(re.search(r"Give --tune-budget (\d+)s or more", message)[1])
    assert given >= needed > 2, message  # two rounds of trials that each outlast the budget
    # the second candidate was not even started past the deadline
    assert [m.stopped for m in entries[1].runs] == [True], entries[1].runs


def test_a_repeat_the_budget_stopped_leaves_the_loss_judged_on_the_others():
    from ptrain.tuning.search import decide, loss_verdict

    def completed(losses):
        return Measurement(samples_per_s=120.0, measured_s=1.0, losses=list(losses),
                           trained=[4 * i for i in range(len(losses))])

    stopped = Measurement(error="TrialStopped: stopped", stopped=True)
    baseline = Entry("your configuration", (), [completed(LOSSES), completed(LOSSES)])
    changed = Candidate("c", "z", plugin_options={"fake": {"c": True}}, numerics="changed")
    entry = Entry("c", (changed,), [completed(LESS_PROGRESS), stopped, completed(LESS_PROGRESS)])
    # a stopped repeat has no losses: it is not a divergence, nor a failure of the candidate
    assert loss_verdict(entry, baseline) == "less progress (50% of your loss's fall)"
    assert entry.error is None and entry.stopped == 1 and entry.measured
    alone = Entry("c", (changed,), [completed(LESS_PROGRESS), stopped])
    assert decide(alone, baseline, baseline).unmeasured.startswith(
        "not measured: the budget ran out during its trials (1 of the 2 repeats")
