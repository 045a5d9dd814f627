"""What ``ptrain tune`` prints and writes: the ranked table, the one-line verdict, and
``tuned.toml`` (the user's configuration plus the winning combination)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ptrain.errors import ConfigError
from ptrain.tuning.run import TuneOutcome
from ptrain.tuning.search import Decision, Entry

#: the first line of every file ``ptrain tune`` writes; a file without it is not replaced
MARK = "# written by ptrain tune"


def rows(outcome: TuneOutcome) -> list[dict[str, Any]]:
    """The table's rows, fastest first: the baseline, every measured candidate and combination,
    then those that failed or were not measured, each with the reason. Every row reads its
    entry's :class:`~ptrain.tuning.search.Decision` and judges nothing itself."""
    base = outcome.baseline
    rates = base.rates
    measured: list[dict[str, Any]] = [{
        "candidate": base.label, "samples_per_s": base.median,
        "spread": (min(rates), max(rates)) if rates else None, "speedup": 1.0,
        "peak_bytes": base.peak_bytes, "loss": "(reference)",
        "verdict": f"{len(rates)} repeats", "warmup_s": base.warmup_s, "best": False,
        "wins": False}]
    others = []
    for entry in [*outcome.entries, *outcome.combinations]:
        decision = _decision(entry)
        row: dict[str, Any] = {"candidate": entry.label, "samples_per_s": None, "spread": None,
                               "speedup": None, "peak_bytes": entry.peak_bytes, "loss": "",
                               "verdict": decision.verdict, "warmup_s": entry.warmup_s,
                               "best": entry is outcome.best, "wins": decision.wins}
        if decision.unmeasured is not None:
            others.append(row)
            continue
        rates = entry.rates
        row.update(samples_per_s=decision.rate, spread=(min(rates), max(rates)),
                   speedup=decision.speedup, loss=decision.loss)
        measured.append(row)
    measured.sort(key=lambda r: r["samples_per_s"], reverse=True)
    return measured + others


def _decision(entry: Entry) -> Decision:
    if entry.decision is None:
        raise ValueError(f"{entry.label!r} was never decided: build outcomes with "
                         f"ptrain.tuning.run.conclude")
    return entry.decision


def noise(outcome: TuneOutcome) -> float:
    """The baseline's spread over its repeats, relative to its median."""
    rates = outcome.baseline.rates
    return (max(rates) - min(rates)) / statistics.median(rates) if len(rates) > 1 else 0.0


def summary(outcome: TuneOutcome, output: Path) -> str:
    """The one line saying what changed and the measured gain, from the decisions alone."""
    best = outcome.best
    if best is not None:
        decision = _decision(best)
        side = ("" if decision.against == outcome.baseline.label else
                f" (faster than {decision.against} alone, the two measured side by side)")
        return (f"Fastest: {best.label}{side}, {decision.speedup:.2f}x your configuration's "
                f"samples/s ({decision.rate:,.0f} vs {decision.base_rate:,.0f}); written to "
                f"{output} (train with: ptrain fit --config {output}).")
    decisions = [(e, _decision(e)) for e in outcome.entries]
    unmeasured = [e.label for e, d in decisions if d.budget]
    later = (f" {len(unmeasured)} candidate(s) ran out of budget before two repeats and were "
             f"not judged: {', '.join(unmeasured)} (see the note)." if unmeasured else "")
    rejected = [(e, d) for e, d in decisions if d.unmeasured is None and d.speed == "faster"]
    if rejected:
        why = "; ".join(f"{e.label} was {d.speedup:.2f}x as fast, but its loss: {d.loss}"
                        for e, d in rejected)
        return (f"No candidate was faster and trained the same: {why}.{later} {output} is your "
                f"configuration as it is.")
    if not any(d.unmeasured is None for _, d in decisions):
        return (f"No candidate could be measured (the table says why).{later} {output} is your "
                f"configuration as it is.")
    return (f"No measured candidate beat your configuration beyond the noise "
            f"(±{noise(outcome):.1%} between its repeats).{later} {output} is your "
            f"configuration as it is.")


def table(outcome: TuneOutcome) -> Any:
    """The ranked table, as a rich renderable."""
    from rich.table import Table

    t = Table(title=f"ptrain tune: {outcome.rounds} interleaved repeats, fastest first",
              title_justify="left")
    kind = next((m.memory_kind for m in outcome.baseline.runs if m.memory_kind), "")
    memory = f"peak memory ({kind})" if kind else "peak memory"
    for name, justify in (("candidate", "left"), ("samples/s", "right"),
                          ("spread", "right"), ("speed-up", "right"), (memory, "right"),
                          ("loss vs yours", "left"), ("verdict", "left"),
                          ("warm-up s (first)", "right")):
        t.add_column(name, justify=justify, overflow="fold")
    for row in rows(outcome):
        rate = row["samples_per_s"]
        t.add_row(
            ("* " if row["best"] else "") + row["candidate"],
            f"{rate:,.0f}" if rate is not None else "",
            f"{row['spread'][0]:,.0f}-{row['spread'][1]:,.0f}" if row["spread"] else "",
            f"{row['speedup']:.2f}x" if row["speedup"] is not None else "",
            f"{row['peak_bytes'] / 2**20:,.0f} MiB" if row["peak_bytes"] is not None else "",
            row["loss"], row["verdict"],
            f"{row['warmup_s']:.1f}" if rate is not None else "")
    return t


def check_output(path: Path) -> None:
    """Refuse, before anything is measured, to replace a file ``ptrain tune`` did not write."""
    above = path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():  # the folders to make can't be made: say so before the minutes of work
        raise ConfigError(f"--tune-output {path} can't be written: {above} is a file, not a "
                          f"folder. Give a file in a folder (made if missing) with --tune-output.")
    if path.is_dir():
        raise ConfigError(f"--tune-output {path} is a folder; give the file to write "
                          f"(e.g. {path / 'tuned.toml'}).")
    if path.exists():
        first = path.read_text(encoding="utf-8", errors="replace").split("\n", 1)[0]
        if not first.startswith(MARK):
            raise ConfigError(f"--tune-output {path} exists and was not written by ptrain tune; "
                              f"it is left as it is. Give another file with --tune-output, or "
                              f"move it away.")


def write_config(outcome: TuneOutcome, config_text: str, output: Path) -> None:
    """``output``: the mark, what the tune measured, then ``config_text`` (the winning
    configuration as ``ptrain fit --config`` reads it)."""
    best = outcome.best
    changed = best.label if best is not None else "nothing (no gain measured)"
    header = [f"{MARK}: changed from your configuration: {changed}"]
    if best is not None:
        header.append(f"# measured: {_decision(best).speedup:.2f}x your configuration's "
                      f"samples/s, {_decision(best).verdict} in {len(best.rates)} interleaved "
                      f"repeats")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text("\n".join(header) + "\n\n" + config_text, encoding="utf-8")
    tmp.replace(output)


__all__ = ["MARK", "check_output", "noise", "rows", "summary", "table", "write_config"]
