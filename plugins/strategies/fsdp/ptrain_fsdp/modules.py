"""Choosing the modules to shard as units.

Matching class names (and the ``auto`` rule) is the core's :mod:`ptrain.module_classes`, shared
with the ``activation-checkpointing`` callback; activation checkpointing itself is that callback's
job under every strategy, fsdp included.
"""

from __future__ import annotations

from torch import nn

from ptrain.module_classes import AUTO, modules_of_classes


def modules_to_shard(model: nn.Module, classes: list[str]) -> list[nn.Module]:
    """The modules to shard as units, innermost first (FSDP2 wants children before parents).

    ``["auto"]``: the classes that repeat among the children of the model's ``nn.ModuleList``s,
    the usual shape of a stack of transformer blocks; a model without one is sharded as a whole.
    A listed name that matches nothing is a :class:`ptrain.ConfigError` naming the model's
    classes.
    """
    chosen = modules_of_classes(model, classes or [AUTO], "wrap_classes")
    return chosen[::-1]  # modules() order lists parents first
