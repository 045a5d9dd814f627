"""``move_data_to_device``: a batch of any shape moved to a device."""

from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch

#: devices to which a copy is made blocking (MPS: a non-blocking copy there can race)
_BLOCKING = ("cpu", "mps")


def move_data_to_device(batch: Any, device: torch.device | str | int) -> Any:
    """``batch`` with everything in it that has a ``to`` method (tensors, modules, a tokenizer's
    ``BatchEncoding``, your own classes) replaced by ``thing.to(device)`` (the thing itself when
    its ``to`` returns ``None``). Dicts (their type kept, a ``defaultdict``'s factory too),
    namedtuples, lists, tuples and other sequences (not strings), and dataclass instances are
    walked and rebuilt; anything else is returned as it is. Tensor copies to an accelerator are
    non-blocking."""
    if isinstance(device, str):
        device = torch.device(device)
    options = ({"non_blocking": True} if isinstance(device, torch.device)
               and device.type not in _BLOCKING else {})

    def move(data: Any) -> Any:
        if callable(getattr(data, "to", None)) and not isinstance(data, type):
            moved = data.to(device, **options) if isinstance(data, torch.Tensor) \
                else data.to(device)
            return data if moved is None else moved
        if dataclasses.is_dataclass(data) and not isinstance(data, type):
            values = {f.name: getattr(data, f.name) for f in dataclasses.fields(data)}
            result = copy.deepcopy(data, memo={id(v): v for v in values.values()})
            for f in dataclasses.fields(data):
                if f.init:
                    try:
                        setattr(result, f.name, move(values[f.name]))
                    except dataclasses.FrozenInstanceError:
                        raise ValueError(
                            f"move_data_to_device: the frozen dataclass {type(data).__name__} "
                            f"can't have its fields replaced; make it unfrozen or move its "
                            f"tensors yourself.") from None
            return result
        if isinstance(data, Mapping):
            items = [(key, move(value)) for key, value in data.items()]
            if isinstance(data, defaultdict):
                return type(data)(data.default_factory, items)
            return type(data)(items)
        if isinstance(data, tuple) and hasattr(data, "_fields"):  # a namedtuple
            return type(data)(*(move(item) for item in data))
        if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
            return type(data)([move(item) for item in data])
        return data

    return move(batch)
