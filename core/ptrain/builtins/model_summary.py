"""The ``model-summary`` callback: one table of the module's layers and parameter counts when
``fit`` starts.

On by default; ``-p no:model-summary`` turns it off. It prints on global rank 0 only, once per
``fit`` (in ``setup``, when the model is wrapped and any checkpoint restored), never per step.
With ``example_sizes`` (on under ``ptrain.lightning``, as Lightning's summary does it) and a
module with an ``example_input_array``, one forward pass on that input, in eval mode and without
autograd, adds each row's ``In sizes`` and ``Out sizes``; the pass draws from the random
generators what the module's forward draws.
Counts are of ``trainer.module`` (the user's module, not a DDP or compile wrapper around it).
A parameter that a sharding strategy turned into a DTensor counts with its global number of
elements, so the table reads the same under ``fsdp`` as on one device. Parameters shared by two
layers appear in each layer's row but once in the totals. Buffers are not parameters and are not
counted.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from ptrain.data import move_to_device
from ptrain.errors import ConfigError
from ptrain.hookspecs import hookimpl
from ptrain.options import to_bool

UNKNOWN_SIZE = "?"

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


def batch_shape(batch: Any) -> str | list:
    """The shape of a tensor as a list, of a list/tuple of tensors as a list of those, else
    ``"?"``."""
    if hasattr(batch, "shape"):
        return list(batch.shape)
    if isinstance(batch, (list, tuple)):
        return [batch_shape(item) for item in batch]
    return UNKNOWN_SIZE


def example_sizes(module: nn.Module, names: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The input and output shapes of the submodules ``names`` in one forward pass on
    ``module.example_input_array``, run in eval mode without autograd; every submodule's own
    mode is put back after. A submodule's inputs are its positional arguments, then its keyword
    arguments' values, in the order given (one input: its shape alone); a submodule called
    more than once keeps its first call's shapes, as Lightning's summary."""
    inputs: dict[str, Any] = {}
    outputs: dict[str, Any] = {}

    def recorder(name: str):
        def hook(_module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if name in inputs:
                return
            given = (*args, *(kwargs or {}).values())
            inputs[name] = batch_shape(given[0] if len(given) == 1 else given)
            outputs[name] = batch_shape(output)
        return hook

    submodules = dict(module.named_modules())
    handles = [submodules[name].register_forward_hook(recorder(name), with_kwargs=True)
               for name in names]
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    example = move_to_device(module.example_input_array, device)
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            if isinstance(example, dict):
                module(**example)
            elif isinstance(example, (list, tuple)):
                module(*example)
            else:
                module(example)
    finally:
        for sub, mode in modes:
            sub.training = mode
        for handle in handles:
            handle.remove()
    return inputs, outputs


def format_summary(rows: list[Row], totals: Counts,
                   sizes: tuple[dict[str, Any], dict[str, Any]] | None = None) -> str:
    """The table and the totals, as printed; with ``sizes`` (:func:`example_sizes`), the
    ``In sizes`` and ``Out sizes`` columns too."""
    header: tuple[str, ...] = ("", "Name", "Type", "Params", "Trainable", "Non-trainable")
    body = [(str(i), r.name, r.type, human_count(r.counts.total), human_count(r.counts.trainable),
             human_count(r.counts.frozen)) for i, r in enumerate(rows)]
    if sizes is not None:
        header += ("In sizes", "Out sizes")
        body = [cells + (str(sizes[0].get(r.name, UNKNOWN_SIZE)),
                         str(sizes[1].get(r.name, UNKNOWN_SIZE)))
                for cells, r in zip(body, rows)]
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

    def __init__(self, max_depth: int = 1, example_sizes: bool = False):
        if max_depth < -1:
            raise ConfigError(f"model-summary max_depth must be -1 (every level), 0 (totals only) "
                              f"or a positive depth, got {max_depth}.")
        self.max_depth = max_depth
        self.example_sizes = example_sizes
        self.text: str | None = None  # what was printed last, for code to read

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("max_depth", int, default=1,
                    help="levels of submodules to list: 1 the module's children, -1 every "
                         "level, 0 only the totals")
        options.add("example_sizes", to_bool, default=False,
                    help="with the module's example_input_array: one forward pass on it (eval "
                         "mode, no autograd) adds In sizes and Out sizes columns")

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        if stage != "fit" or not trainer.is_global_zero:
            return
        module = trainer.module
        rows, totals = summarize(module, self.max_depth)
        sizes = None
        if self.example_sizes and rows and getattr(module, "example_input_array", None) \
                is not None:
            sizes = example_sizes(module, [row.name for row in rows])
        with torch.no_grad():
            self.text = format_summary(rows, totals, sizes)
        print(self.text, flush=True)
