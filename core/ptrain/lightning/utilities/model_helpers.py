"""``is_overridden`` (whether a module, datamodule or callback defines a hook of its own) and
``get_torchvision_model``, as Lightning's ``lightning.pytorch.utilities.model_helpers``."""

from __future__ import annotations

import functools
from typing import Any

from torch import nn


def is_overridden(method_name: str, instance: Any = None, parent: type | None = None) -> bool:
    """Whether ``instance``'s class defines ``method_name`` other than ``parent`` does
    (``parent`` defaults to the LightningModule, LightningDataModule or Callback base that
    ``instance`` is); ``False`` for ``instance=None``. Decorated methods (``functools.wraps``)
    and ``functools.partial`` objects count as the function they wrap."""
    if instance is None:
        return False
    if parent is None:
        import ptrain.lightning as pl

        parent = next((base for base in (pl.LightningModule, pl.LightningDataModule,
                                         pl.Callback) if isinstance(instance, base)), None)
        if parent is None:
            raise ValueError("Expected a parent")
    own = getattr(instance, method_name, None)
    if own is None:
        return False
    own = getattr(own, "__wrapped__", own)
    if isinstance(own, functools.partial):
        own = own.func
    base = getattr(parent, method_name, None)
    if base is None:
        raise ValueError("The parent should define the method")
    code = getattr(own, "__code__", None) or getattr(getattr(own, "__func__", None), "__code__",
                                                     None)
    base_code = getattr(base, "__code__", None) or getattr(getattr(base, "__func__", None),
                                                           "__code__", None)
    return code != base_code


def get_torchvision_model(model_name: str, **kwargs: Any) -> nn.Module:
    """torchvision's model ``model_name`` (``"resnet18"``...) built with ``kwargs``."""
    from ptrain.lightning.utilities.imports import _TORCHVISION_AVAILABLE

    if not _TORCHVISION_AVAILABLE:
        raise ModuleNotFoundError(str(_TORCHVISION_AVAILABLE))
    from torchvision import models

    return models.get_model(model_name, **kwargs)
