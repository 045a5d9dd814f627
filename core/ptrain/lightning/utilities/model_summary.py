"""``ModelSummary(model, max_depth)``: the table of a module's layers and parameter counts that
ptrain's ``model-summary`` callback prints, as an object a program can read and print."""

from __future__ import annotations

from typing import Any

from torch import nn

from ptrain.builtins.model_summary import UNKNOWN_SIZE, Counts, example_sizes, format_summary, \
    summarize as _rows
from ptrain.builtins.model_summary import batch_shape as _batch_shape

_PREFIXES = ("", "K", "M", "B", "T")


def get_human_readable_count(number: int | float) -> str:
    """``123`` -> ``"123  "``, ``1234`` -> ``"1.2 K"``, ``2e6`` -> ``"2.0 M"``, ``4e14`` ->
    ``"400 T"``, ``5e15`` -> ``"5,000 T"`` (Lightning's format)."""
    if number < 0:
        raise ValueError(f"get_human_readable_count: {number} is negative.")
    place = 0
    while number >= 1000 and place < len(_PREFIXES) - 1:
        number /= 1000
        place += 1
    if place == 0:
        return f"{int(number):,d}  "
    if number < 100:
        return f"{number:,.1f} {_PREFIXES[place]}"
    return f"{int(number):,d} {_PREFIXES[place]}"


def get_formatted_model_size(total_model_size: float) -> str:
    return f"{total_model_size:,.3f}"


def parse_batch_shape(batch: Any) -> str | list:
    """The shape of a tensor as a list, of a list/tuple of tensors as a list of those, else
    ``"?"``."""
    return _batch_shape(batch)


class LayerSummary:
    """One row of a :class:`ModelSummary`: a submodule's ``layer_type`` (its class name),
    ``num_parameters``, ``training`` mode, and ``in_size``/``out_size`` (from the summary's
    forward pass on the ``example_input_array``; ``"?"`` without one)."""

    def __init__(self, module: nn.Module, in_size: Any = UNKNOWN_SIZE,
                 out_size: Any = UNKNOWN_SIZE, num_parameters: int | None = None) -> None:
        self._module = module
        self._in_size, self._out_size = in_size, out_size
        self._num_parameters = num_parameters

    @property
    def in_size(self) -> str | list:
        return self._in_size

    @property
    def out_size(self) -> str | list:
        return self._out_size

    @property
    def layer_type(self) -> str:
        return type(self._module).__name__

    @property
    def num_parameters(self) -> int:
        if self._num_parameters is None:
            self._num_parameters = Counts.of(self._module.parameters()).total
        return self._num_parameters

    @property
    def training(self) -> bool:
        return self._module.training

    def detach_hook(self) -> None:
        """Nothing to detach: the sizes come from the summary's own forward pass."""


class ModelSummary:
    """The summary of ``model`` down to ``max_depth`` levels of submodules (``-1``: every level,
    ``0``: the totals only). ``str(summary)`` is the table ptrain's ``model-summary`` callback
    prints (trainable and non-trainable columns per row; Lightning's mode and FLOPs columns are
    not there). ``in_sizes``/``out_sizes`` come from one forward pass on the module's
    ``example_input_array`` when it has one (``"?"`` otherwise)."""

    def __init__(self, model: nn.Module, max_depth: int = 1) -> None:
        if not isinstance(max_depth, int) or max_depth < -1:
            raise ValueError(f"`max_depth` can be -1, 0 or > 0, got {max_depth}.")
        self._model, self._max_depth = model, max_depth
        self._rows, self._totals = _rows(model, max_depth)
        modules = dict(model.named_modules())
        self._layers = [modules[row.name] for row in self._rows]
        self._in: dict[str, Any] = {}
        self._out: dict[str, Any] = {}
        if getattr(model, "example_input_array", None) is not None and self._layers:
            self._forward_example_input()

    def _forward_example_input(self) -> None:
        self._in, self._out = example_sizes(self._model, [row.name for row in self._rows])

    @property
    def max_depth(self) -> int:
        return self._max_depth

    @property
    def _layer_summary(self) -> dict[str, LayerSummary]:
        """Each row's :class:`LayerSummary` by layer name, as Lightning's private attribute
        (which programs read: yoyodyne's summary callback)."""
        return {row.name: LayerSummary(layer, self._in.get(row.name, UNKNOWN_SIZE),
                                       self._out.get(row.name, UNKNOWN_SIZE), row.counts.total)
                for row, layer in zip(self._rows, self._layers)}

    @property
    def named_modules(self) -> list[tuple[str, nn.Module]]:
        return [(row.name, layer) for row, layer in zip(self._rows, self._layers)]

    @property
    def layer_names(self) -> list[str]:
        return [row.name for row in self._rows]

    @property
    def layer_types(self) -> list[str]:
        return [row.type for row in self._rows]

    @property
    def in_sizes(self) -> list:
        return [self._in.get(row.name, UNKNOWN_SIZE) for row in self._rows]

    @property
    def out_sizes(self) -> list:
        return [self._out.get(row.name, UNKNOWN_SIZE) for row in self._rows]

    @property
    def param_nums(self) -> list[int]:
        return [row.counts.total for row in self._rows]

    @property
    def training_modes(self) -> list[bool]:
        return [layer.training for layer in self._layers]

    @property
    def total_training_modes(self) -> dict[str, int]:
        modes = [layer.training for _, layer in self._model.named_modules() if _]
        return {"train": sum(modes), "eval": len(modes) - sum(modes)}

    @property
    def total_parameters(self) -> int:
        return self._totals.total

    @property
    def trainable_parameters(self) -> int:
        return self._totals.trainable

    @property
    def total_layer_params(self) -> int:
        return sum(self.param_nums)

    @property
    def model_size(self) -> float:
        """The parameters' size in MB (10^6 bytes)."""
        return self._totals.bytes / 1e6

    def __str__(self) -> str:
        return format_summary(self._rows, self._totals, (self._in, self._out) if self._in else None)

    def __repr__(self) -> str:
        return str(self)


def summarize(lightning_module: nn.Module, max_depth: int = 1) -> ModelSummary:
    """``ModelSummary(lightning_module, max_depth)``."""
    return ModelSummary(lightning_module, max_depth=max_depth)


__all__ = ["Counts", "LayerSummary", "ModelSummary", "get_formatted_model_size",
           "get_human_readable_count", "parse_batch_shape", "summarize"]
