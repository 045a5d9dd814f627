"""The ``model-summary`` callback: one table of the module's layers and parameter counts when
``fit`` starts.

On by default; ``-p no:model-summary`` turns it off. It prints on global rank 0 only, once per
``fit`` (in ``setup``, when the model is wrapped and any checkpoint restored), never per step.
Counts are of ``trainer.module`` (the user's module, not a DDP or compile wrapper around it).
A parameter that a sharding strategy turned into a DTensor counts with its global number of
elements, so the table reads the same under ``fsdp`` as on one device. Parameters shared by two
layers appear in each layer's row but once in the totals. Buffers are not parameters and are not
counted.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from ptrain.errors import ConfigError
from ptrain.hookspecs import hookimpl

_UNITS = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))


def human_count(number: int) -> str:
    """``1234`` -> ``"1.2 K"``; below a thousand, the number itself."""
    for size, unit in _UNITS:
        if number >= size:
            return f"{number / size:.1f} {unit}"
    return str(number)


class Counts:
    """Parameter counts of a set of parameters (each counted once). (A plain class, as ``Row``:
    making a dataclass costs a few tenths of a millisecond at import, on the path to the first
    training step.)"""

    def __init__(self, trainable: int = 0, frozen: int = 0, bytes: int = 0,
                 uninitialized: int = 0):
        self.trainable, self.frozen, self.bytes = trainable, frozen, bytes
        self.uninitialized = uninitialized  # lazy parameters, whose size is not known yet

    @property
    def total(self) -> int:
        return self.trainable + self.frozen

    @classmethod
    def of(cls, parameters: Iterable[nn.Parameter]) -> Counts:
        counts = cls()
        seen: set[int] = set()
        for p in parameters:
            if id(p) in seen:
                continue
            seen.add(id(p))
            if isinstance(p, nn.parameter.UninitializedParameter):
                counts.uninitialized += 1
                continue
            n = p.numel()  # a DTensor's numel is that of the whole, unsharded tensor
            if p.requires_grad:
                counts.trainable += n
            else:
                counts.frozen += n
            counts.bytes += n * p.element_size()
        return counts


class Row:
    """One submodule's line of the summary."""

    def __init__(self, name: str, type: str, counts: Counts):
        self.name, self.type, self.counts = name, type, counts


def summarize(module: nn.Module, max_depth: int = 1) -> tuple[list[Row], Counts]:
    """The rows (submodules down to ``max_depth`` levels; ``-1``: every level; ``0``: none) and
    the totals over the whole module."""
    rows = []
    if max_depth != 0:
        for name, sub in module.named_modules():
            if not name:
                continue
            depth = name.count(".") + 1
            if max_depth == -1 or depth <= max_depth:
                rows.append(Row(name, type(sub).__name__, Counts.of(sub.parameters())))
    return rows, Counts.of(module.parameters())


def format_summary(rows: list[Row], totals: Counts) -> str:
    """The table and the totals, as printed."""
    header = ("", "Name", "Type", "Params", "Trainable", "Non-trainable")
    body = [(str(i), r.name, r.type, human_count(r.counts.total), human_count(r.counts.trainable),
             human_count(r.counts.frozen)) for i, r in enumerate(rows)]
    widths = [max(len(line[c]) for line in [header, *body]) for c in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return " | ".join(cell.ljust(w) for cell, w in zip(cells, widths)).rstrip()

    lines = []
    if body:
        rule = "-" * len(line(header))
        lines += [line(header), rule, *(line(b) for b in body), rule]
    lines += [
        f"{human_count(totals.trainable):<10}Trainable params",
        f"{human_count(totals.frozen):<10}Non-trainable params",
        f"{human_count(totals.total):<10}Total params",
        f"{totals.bytes / 1e6:<10.3f}Total estimated model params size (MB)",
    ]
    if totals.uninitialized:
        lines.append(f"{totals.uninitialized:<10}Lazy parameters not initialized yet, not counted")
    return "\n".join(lines)


class ModelSummary:
    """Prints the module's summary when ``fit`` starts (rank 0)."""

    name = "model-summary"

    def __init__(self, max_depth: int = 1):
        if max_depth < -1:
            raise ConfigError(f"model-summary max_depth must be -1 (every level), 0 (totals only) "
                              f"or a positive depth, got {max_depth}.")
        self.max_depth = max_depth
        self.text: str | None = None  # what was printed last, for code to read

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("max_depth", int, default=1,
                    help="levels of submodules to list: 1 the module's children, -1 every "
                         "level, 0 only the totals")

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        if stage != "fit" or not trainer.is_global_zero:
            return
        with torch.no_grad():
            self.text = format_summary(*summarize(trainer.module, self.max_depth))
        print(self.text, flush=True)
