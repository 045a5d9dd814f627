"""Which ``nn.Linear`` layers of a model compute in float8, and why each other one does not.

Pure bookkeeping over module names and shapes: nothing here imports torchao, so the choice can be
made (and refused) before the library is loaded.
"""

from __future__ import annotations

import fnmatch
from collections.abc import KeysView
from dataclasses import dataclass, field

from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from ptrain import ConfigError

#: float8 matmuls (torch._scaled_mm) need both dimensions of the weight to be multiples of 16
MULTIPLE = 16


@dataclass
class LayerChoice:
    """``convert``: the names of the Linear layers to convert, in the model's order; ``kept``:
    every other Linear layer's name with the reasons it stays in high precision (all of them,
    joined by "; "); ``options``: the plugin options it was made and converted with;
    ``originals``: the Linear modules of ``convert`` converted so far (before a tensor-parallel
    plan, or with the model), by name, put back when the stage ends."""

    convert: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    options: dict[str, object] = field(default_factory=dict)
    originals: dict[str, nn.Module] = field(default_factory=dict)

    @property
    def converted(self) -> KeysView[str]:
        """The names of the layers converted so far."""
        return self.originals.keys()

    def kept_reasons(self) -> str:
        """Each kept layer with its reason, in the model's order."""
        return ", ".join(f"{name} ({why})" for name, why in self.kept.items())

    def summary(self) -> str:
        """One line: how many layers compute in float8, and which stayed, with why."""
        total = len(self.convert) + len(self.kept)
        line = f"{len(self.convert)} of {total} Linear layers compute in float8"
        return line + (f"; kept in high precision: {self.kept_reasons()}" if self.kept else "")


def choose_layers(model: nn.Module, keep_ends: bool, skip: list[str],
                  all_gather: bool = False) -> LayerChoice:
    """The Linear layers of ``model`` to convert: all of them except

    - the first and the last in the order the model registers them, when ``keep_ends`` (the
      input and output layers are the most sensitive to float8's 3 mantissa bits);
    - those whose name matches a pattern of ``skip`` (``fnmatch``: ``*`` matches across dots);
    - those with a dimension that is not a multiple of 16, which float8 matmuls can't take;
    - a subclass of ``nn.Linear`` with a ``forward`` of its own, which would be lost, and
      ``nn.MultiheadAttention``'s ``out_proj``, whose weight attention reads directly (it
      would never compute in float8);
    - a layer registered in more than one place: converted at one, it would be two layers;
    - with ``all_gather``, a layer whose weight another module holds too (tied, e.g. an
      output layer to the embedding): the float8 all-gather gives each converted layer a
      weight of its own, which would untie them.

    A layer is named by its first path; a pattern of ``skip`` may name any. A pattern that
    matches no Linear layer is a :class:`ptrain.ConfigError` (it would otherwise be ignored
    silently), and so is a choice that converts nothing: its message names every reason each
    layer is kept, and suggests ``--no-fp8-mixed-keep-ends`` only when that would convert one."""
    paths: dict[int, list[str]] = {}
    linears = []
    holders: dict[int, dict[int, str]] = {}  # a parameter's modules: the path of its first
    for name, module in model.named_modules(remove_duplicate=False):
        for key, parameter in module._parameters.items():
            if parameter is not None:
                holders.setdefault(id(parameter), {}).setdefault(
                    id(module), f"{name}.{key}" if name else key)
        if isinstance(module, nn.Linear):
            if id(module) not in paths:
                linears.append((name, module))
            paths.setdefault(id(module), []).append(name)
    names = [name for name, _ in linears]
    for pattern in skip:
        if not any(fnmatch.fnmatchcase(path, pattern) for group in paths.values()
                   for path in group):
            raise ConfigError(
                f"--fp8-mixed-skip {pattern!r} matches no Linear layer of "
                f"{type(model).__name__}; its Linear layers are: {_listed(names)}. Give a "
                f"layer's name as printed by named_modules(), or a pattern with * that "
                f"matches some.")
    choice = LayerChoice()
    ends = {names[0], names[-1]} if keep_ends and names else set()
    freed = []  # the layers kept for being first or last alone: keep_ends off converts them
    for name, module in linears:
        elsewhere = paths[id(module)][1:]
        tied = [path for holder, path in holders[id(module.weight)].items()
                if holder != id(module)]
        reasons = []  # every reason, so a message naming one doesn't hide the others
        if name in ends:
            reasons.append(" and ".join(end for end, at in (("first", names[0]),
                                                            ("last", names[-1])) if at == name))
        if any(fnmatch.fnmatchcase(path, pattern) for path in paths[id(module)]
               for pattern in skip):
            reasons.append("--fp8-mixed-skip")
        if type(module).forward is not nn.Linear.forward:
            reasons.append(f"a {type(module).__name__}, with a forward of its own")
        if isinstance(module, NonDynamicallyQuantizableLinear):
            reasons.append("MultiheadAttention reads its weight directly")
        if elsewhere:
            reasons.append(f"also registered as {', '.join(elsewhere)}")
        if module.in_features % MULTIPLE or module.out_features % MULTIPLE:
            reasons.append(f"{module.in_features}x{module.out_features}, not multiples "
                           f"of {MULTIPLE}")
        if all_gather and tied:
            reasons.append(f"its weight is also {tied[0]}, which --fp8-mixed-all-gather "
                           f"would untie")
        if not reasons:
            choice.convert.append(name)
            continue
        choice.kept[name] = "; ".join(reasons)
        if name in ends and len(reasons) == 1:
            freed.append(name)
    if not choice.convert:
        why = ("it has no Linear layer" if not names else
               f"none of its Linear layers can be: {choice.kept_reasons()}")
        hint = (f" --no-fp8-mixed-keep-ends would convert {' and '.join(freed)}, kept only as "
                f"the first or last Linear layer." if freed else "")
        raise ConfigError(
            f"--precision fp8-mixed would convert no layer of {type(model).__name__} to float8: "
            f"{why}.{hint} Use --precision bf16-mixed for a model without float8-sized "
            f"Linear layers.")
    return choice


def _listed(names: list[str], most: int = 12) -> str:
    shown = ", ".join(names[:most]) or "none"
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
