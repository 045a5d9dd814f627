"""What ``ptrain tune`` prints and writes: the ranked table, the one-line verdict, and
``tuned.toml`` (the user's configuration plus the winning combination)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ptrain.errors import ConfigError
from ptrain.tuning.run import TuneOutcome
from ptrain.tuning.search import Entry, loss_verdict, speed_verdict

#: the first line of every file ``ptrain tune`` writes; a file without it is not replaced
MARK = "# written by ptrain tune"


def rows(outcome: TuneOutcome) -> list[dict[str, Any]]:
    """The table's rows, fastest first: the baseline, every measured candidate and combination,
    then those that failed or were not measured, each with the reason."""
    base = outcome.baseline
    measured, others = [], []
    for entry in [base, *outcome.entries, *outcome.combinations]:
        row: dict[str, Any] = {"candidate": entry.label, "samples_per_s": None, "spread": None,
                               "speedup": None, "peak_bytes": entry.peak_bytes, "loss": "",
                               "verdict": "", "warmup_s": entry.warmup_s,
                               "best": entry is outcome.best}
        if entry.skipped:
            row["verdict"] = entry.skipped
            others.append(row)
        elif entry.error:
            row["verdict"] = f"failed: {entry.error}"
            others.append(row)
        elif entry.runs:
            rates = entry.rates
            row.update(samples_per_s=entry.median, spread=(min(rates), max(rates)),
                       speedup=entry.median / base.median)
            if entry is base:
                row.update(loss="(reference)", verdict=f"{len(rates)} repeats")
            else:
                row.update(loss=loss_verdict(entry, base), verdict=speed_verdict(entry, base))
            measured.append(row)
    measured.sort(key=lambda r: r["samples_per_s"], reverse=True)
    return measured + others


def noise(outcome: TuneOutcome) -> float:
    """The baseline's spread over its repeats, relative to its median."""
    rates = outcome.baseline.rates
    return (max(rates) - min(rates)) / statistics.median(rates) if len(rates) > 1 else 0.0


def summary(outcome: TuneOutcome, output: Path) -> str:
    """The one line saying what changed and the measured gain."""
    best = outcome.best
    if best is None:
        base = outcome.baseline
        faster = [e for e in outcome.entries if e.measured and speed_verdict(e, base) == "faster"]
        if faster:
            rejected = "; ".join(f"{e.label} was {e.median / base.median:.2f}x as fast, but its "
                                 f"loss: {loss_verdict(e, base)}" for e in faster)
            return (f"No candidate was faster and trained the same: {rejected}. {output} is "
                    f"your configuration as it is.")
        return (f"No candidate beat your configuration beyond the noise (±{noise(outcome):.1%} "
                f"between its repeats); {output} is your configuration as it is.")
    gain = best.median / outcome.baseline.median
    return (f"Fastest: {best.label}, {gain:.2f}x your configuration's samples/s "
            f"({best.median:,.0f} vs {outcome.baseline.median:,.0f}); written to {output} "
            f"(train with: ptrain fit --config {output}).")


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
    changed = outcome.best.label if outcome.best is not None else "nothing (no gain measured)"
    header = [f"{MARK}: changed from your configuration: {changed}"]
    if outcome.best is not None:
        header.append(f"# measured: {outcome.best.median / outcome.baseline.median:.2f}x "
                      f"samples/s over {outcome.rounds} interleaved repeats")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text("\n".join(header) + "\n\n" + config_text, encoding="utf-8")
    tmp.replace(output)


__all__ = ["MARK", "check_output", "noise", "rows", "summary", "table", "write_config"]
