"""Choosing submodules of a model by class name, and recomputing their activations in backward.

Shared by every plugin that lets users name module classes (``--fsdp-wrap-classes``,
``--activation-checkpointing-classes``), so that names, the ``auto`` rule and the error for a
name that matches nothing are the same everywhere.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

from ptrain.errors import ConfigError

#: The name that stands for :func:`repeated_modules` in a list of class names.
AUTO = "auto"


def qualified_name(cls: type) -> str:
    """``module.QualName`` of a class, the long form a class may be named by."""
    return f"{cls.__module__}.{cls.__qualname__}"


def class_names(model: nn.Module) -> list[str]:
    """The sorted short class names of ``model``'s submodules (``model`` itself left out: it is
    never a match), for messages that tell users what they can name."""
    return sorted({type(m).__name__ for m in model.modules() if m is not model})


def repeated_modules(model: nn.Module) -> list[nn.Module]:
    """The ``auto`` rule: every submodule (with parameters) of a class that occurs at least twice
    among the children of the model's ``nn.ModuleList``s, the usual shape of a stack of
    transformer blocks. In ``model.modules()`` order; empty when the model has no such stack."""
    counts: Counter[type] = Counter()
    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            counts.update(type(child) for child in module)
    return [m for m in model.modules()
            if m is not model and counts[type(m)] >= 2 and any(True for _ in m.parameters())]


def modules_of_classes(model: nn.Module, names: list[str], option: str) -> list[nn.Module]:
    """The submodules of ``model`` (never ``model`` itself) whose class is listed in ``names``,
    by short name (``Block``) or qualified name (``mypkg.model.Block``); ``auto`` in the list adds
    :func:`repeated_modules`. Each module once, in ``model.modules()`` order (parents before
    children).

    Raises :class:`ptrain.ConfigError` naming ``option`` and the model's classes when a listed
    name other than ``auto`` matches no submodule. ``auto`` alone may select nothing: what that
    means is the caller's decision.
    """
    wanted: set[int] = set()
    for name in names:
        if name == AUTO:
            matches = repeated_modules(model)
        else:
            matches = [m for m in model.modules() if m is not model
                       and name in (type(m).__name__, qualified_name(type(m)))]
            if not matches:
                raise ConfigError(f"{option} names {name!r}, but the model has no module of "
                                  f"that class; its classes: {', '.join(class_names(model))}.")
        wanted.update(id(m) for m in matches)
    return [m for m in model.modules() if id(m) in wanted]


class _CheckpointedForward:
    """What a checkpointed module's ``forward`` attribute becomes: runs the forward it replaced
    under non-reentrant ``torch.utils.checkpoint``.

    An object rather than a closure so that the module stays picklable (spawned workers) and a
    ``copy.deepcopy`` of the model calls the copy's own forward, not the original's.
    """

    def __init__(self, module: nn.Module, inner: Any):
        self.module = module
        self.inner = inner  # an instance-level forward set before this one, or None

    def _forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.inner is not None:
            return self.inner(*args, **kwargs)
        return type(self.module).forward(self.module, *args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # nothing is saved for backward: nothing to recompute
            return self._forward(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(self._forward, *args, use_reentrant=False,
                                                 **kwargs)


def is_checkpointed(module: nn.Module) -> bool:
    """Whether :func:`checkpoint_activations` made ``module`` recompute its activations."""
    return isinstance(module.__dict__.get("forward"), _CheckpointedForward)


def checkpoint_activations(model: nn.Module, classes: list[str],
                           option: str = "activation checkpointing") -> list[nn.Module]:
    """Make the submodules of ``classes`` (as :func:`modules_of_classes` chooses them) recompute
    their activations in backward instead of keeping them from forward: each one's forward runs
    under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``, with the RNG state of
    the first run restored for the recomputation (dropout draws the same mask). Under
    ``torch.no_grad`` the forward runs as it is.

    Only the instance's ``forward`` attribute changes: parameter names, state dict keys and hooks
    stay as they were, so a state dict moves freely between checkpointed and plain models. Call
    it before a strategy wraps the model (FSDP shards the same modules afterwards). A module
    inside another chosen module is left alone (the outer recomputation covers it), and so is one
    already checkpointed: calling this twice changes nothing.

    Returns the modules checkpointed by this call. Raises :class:`ptrain.ConfigError` (naming
    ``option`` and the model's classes) when a name matches nothing or ``auto`` finds no repeated
    block; an empty ``classes`` checkpoints nothing.
    """
    if not classes:
        return []
    chosen = modules_of_classes(model, classes, option)
    if not chosen:
        raise ConfigError(f"{option} is {AUTO}, but the model repeats no module class in an "
                          f"nn.ModuleList; name the classes to checkpoint, from: "
                          f"{', '.join(class_names(model))}.")
    covered: set[int] = set()  # chosen modules and everything inside them
    done = []
    for module in chosen:  # parents come before their children
        if id(module) in covered:
            continue
        covered.update(id(m) for m in module.modules())
        if is_checkpointed(module):
            continue
        module.forward = _CheckpointedForward(module, module.__dict__.get("forward"))
        done.append(module)
    return done
