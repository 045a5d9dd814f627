"""Choosing the modules to shard as units, and recomputing activations of chosen modules."""

from __future__ import annotations

from collections import Counter

import torch.utils.checkpoint
from torch import nn

from ptrain import ConfigError


def _class_names(model: nn.Module) -> list[str]:
    return sorted({type(m).__name__ for m in model.modules()})


def _matching(model: nn.Module, classes: list[str], option: str) -> list[nn.Module]:
    """The submodules of ``model`` (not itself) whose class name or qualified name is listed;
    a listed name that matches nothing is an error naming the classes there are."""
    found = []
    for name in classes:
        matches = [m for m in model.modules() if m is not model and name in (
            type(m).__name__, f"{type(m).__module__}.{type(m).__qualname__}")]
        if not matches:
            raise ConfigError(f"{option} names {name!r}, but the model has no module of that "
                              f"class; its classes: {', '.join(_class_names(model))}.")
        found.extend(m for m in matches if all(m is not f for f in found))
    return found


def modules_to_shard(model: nn.Module, classes: list[str]) -> list[nn.Module]:
    """The modules to shard as units, innermost first (FSDP2 wants children before parents).

    ``["auto"]``: the classes that repeat among the children of the model's ``nn.ModuleList``s,
    the usual shape of a stack of transformer blocks; a model without one is sharded as a whole.
    """
    if classes == ["auto"]:
        counts: Counter[type] = Counter()
        for module in model.modules():
            if isinstance(module, nn.ModuleList):
                counts.update(type(child) for child in module)
        chosen = [m for m in model.modules()
                  if counts[type(m)] >= 2 and any(True for _ in m.parameters())]
    else:
        chosen = _matching(model, classes, "wrap_classes")
    order = {id(m): i for i, m in enumerate(model.modules())}
    return sorted(chosen, key=lambda m: -order[id(m)])


def checkpoint_activations(model: nn.Module, classes: list[str]) -> None:
    """Make each module of ``classes`` recompute its activations in backward instead of keeping
    them (``torch.utils.checkpoint``, non-reentrant). Only the instance's ``forward`` changes:
    parameter names, state dicts and hooks stay as they were."""
    if not classes:
        return
    for module in _matching(model, classes, "activation_checkpointing"):
        forward = module.forward

        def checkpointed(*args, _forward=forward, **kwargs):
            return torch.utils.checkpoint.checkpoint(_forward, *args, use_reentrant=False,
                                                     **kwargs)

        module.forward = checkpointed
