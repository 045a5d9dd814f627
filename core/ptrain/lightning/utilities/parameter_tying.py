"""Parameters shared between layers (tied weights): find them, and tie them again after
something (moving to a device by parts, loading) untied them."""

from __future__ import annotations

from torch import nn


def find_shared_parameters(module: nn.Module) -> list[list[str]]:
    """The groups of dotted names under which one parameter object is registered, for each
    parameter registered under more than one name (``[["encoder.weight", "decoder.weight"]]``),
    in the order the module tree is walked, the first name being where it was met first."""
    names: dict[nn.Parameter, list[str]] = {}

    def walk(sub: nn.Module, prefix: str) -> None:
        for name, parameter in sub._parameters.items():
            if parameter is not None:
                names.setdefault(parameter, []).append(prefix + name)
        for name, child in sub._modules.items():
            if child is not None:
                walk(child, f"{prefix}{name}.")

    walk(module, "")
    return [group for group in names.values() if len(group) > 1]


def set_shared_parameters(module: nn.Module, shared_params: list) -> nn.Module:
    """Tie again each group of ``shared_params`` (as :func:`find_shared_parameters` returns
    them): every name of a group is set to the object at the group's first name. Returns
    ``module``."""
    for group in shared_params:
        shared = _get(module, group[0])
        for path in group[1:]:
            owner_path, _, attribute = path.rpartition(".")
            setattr(_get(module, owner_path) if owner_path else module, attribute, shared)
    return module


def _get(module: nn.Module, path: str) -> nn.Module:
    for name in path.split("."):
        module = getattr(module, name)
    return module
