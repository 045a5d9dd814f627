"""``lightning.pytorch.core``: the module and datamodule base classes (also from
``core.module`` and ``core.datamodule``, as in Lightning)."""

from typing import Any

from ptrain.lightning.core.datamodule import LightningDataModule
from ptrain.lightning.core.module import LightningModule

__all__ = ["LightningDataModule", "LightningModule"]


#: modules here that Lightning's package has imported and that this one imports when first read
_SUBMODULES = ("mixins", "saving")


def __getattr__(name: str) -> Any:
    from ptrain.lightning._common import submodule

    return submodule(__name__, name, _SUBMODULES)
