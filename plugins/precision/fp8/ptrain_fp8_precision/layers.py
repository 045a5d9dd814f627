"""Which ``nn.Linear`` layers of a model compute in float8, and why each other one does not.

Pure bookkeeping over module names and shapes: nothing here imports torchao, so the choice can be
made (and refused) before the library is loaded.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from torch import nn

from ptrain import ConfigError

#: float8 matmuls (torch._scaled_mm) need both dimensions of the weight to be multiples of 16
MULTIPLE = 16


@dataclass
class LayerChoice:
    """``convert``: the names of the Linear layers to convert, in the model's order; ``kept``:
    every other Linear layer's name with the reason it stays in high precision; ``converted``:
    the names of ``convert`` converted so far (before a tensor-parallel plan, or with the
    model)."""

    convert: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    converted: set[str] = field(default_factory=set)

    def kept_reasons(self) -> str:
        """Each kept layer with its reason, in the model's order."""
        return ", ".join(f"{name} ({why})" for name, why in self.kept.items())

    def summary(self) -> str:
        """One line: how many layers compute in float8, and which stayed, with why."""
        total = len(self.convert) + len(self.kept)
        line = f"{len(self.convert)} of {total} Linear layers compute in float8"
        return line + (f"; kept in high precision: {self.kept_reasons()}" if self.kept else "")


def choose_layers(model: nn.Module, keep_ends: bool, skip: list[str]) -> LayerChoice:
    """The Linear layers of ``model`` to convert: all of them except

    - the first and the last in the order the model registers them, when ``keep_ends`` (the
      input and output layers are the most sensitive to float8's 3 mantissa bits);
    - those whose name matches a pattern of ``skip`` (``fnmatch``: ``*`` matches across dots);
    - those with a dimension that is not a multiple of 16, which float8 matmuls can't take.

    A pattern of ``skip`` that matches no Linear layer is a :class:`ptrain.ConfigError` (it
    would otherwise be ignored silently), and so is a choice that converts nothing."""
    linears = [(name, module) for name, module in model.named_modules()
               if isinstance(module, nn.Linear)]
    names = [name for name, _ in linears]
    for pattern in skip:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            raise ConfigError(
                f"--fp8-mixed-skip {pattern!r} matches no Linear layer of "
                f"{type(model).__name__}; its Linear layers are: {_listed(names)}. Give a "
                f"layer's name as printed by named_modules(), or a pattern with * that "
                f"matches some.")
    choice = LayerChoice()
    ends = {names[0], names[-1]} if keep_ends and names else set()
    for name, module in linears:
        if name in ends:
            choice.kept[name] = "first" if name == names[0] else "last"
        elif any(fnmatch.fnmatchcase(name, pattern) for pattern in skip):
            choice.kept[name] = "--fp8-mixed-skip"
        elif module.in_features % MULTIPLE or module.out_features % MULTIPLE:
            choice.kept[name] = (f"{module.in_features}x{module.out_features}, not multiples "
                                 f"of {MULTIPLE}")
        else:
            choice.convert.append(name)
    if not choice.convert:
        why = ("it has no Linear layer" if not names else
               f"none of its Linear layers can be: {choice.kept_reasons()}")
        hint = (" --no-fp8-mixed-keep-ends converts the first and last ones too."
                if keep_ends and len(names) <= 2 else "")
        raise ConfigError(
            f"--precision fp8-mixed would convert no layer of {type(model).__name__} to float8: "
            f"{why}.{hint} Use --precision bf16-mixed for a model without float8-sized "
            f"Linear layers.")
    return choice


def _listed(names: list[str], most: int = 12) -> str:
    shown = ", ".join(names[:most]) or "none"
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
