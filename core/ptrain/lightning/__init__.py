"""Lightning's names over ptrain: a program written against ``lightning.pytorch`` (or
``pytorch_lightning``, or the ``lightning`` package: ``import lightning as L``) runs when those
words in its import lines are replaced by ``ptrain.lightning``; ``L.pytorch`` is then this package
itself.

This package holds names and thin adapters only: ``LightningModule`` *is*
:class:`ptrain.TrainModule` and ``LightningDataModule`` *is* :class:`ptrain.DataModule`;
:class:`Trainer` takes Lightning's arguments and turns them into ptrain's options (each one either
works or is refused with a message saying what to do; none is ignored). Everything they do lives
in the native API, so a native ptrain program has it too. ``docs/from-lightning.md`` lists each
name, its native form and every deliberate difference.
"""

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

from ptrain.hook_methods import Callback
from ptrain.lightning._logo import LIGHTNING_LOGO, cli_lightning_logo
from ptrain.lightning.trainer import Trainer
from ptrain.module import DataModule as LightningDataModule
from ptrain.module import TrainModule as LightningModule
from ptrain.lightning.utilities.seed import seed_everything

#: The version of Lightning's API this layer follows, for programs and libraries that check
#: ``lightning.pytorch.__version__`` before using a feature; ptrain's own is ``ptrain.__version__``.
__version__ = "2.6.6"

__all__ = ["Callback", "LightningDataModule", "LightningModule", "Trainer", "seed_everything"]

#: Lightning's submodules, attributes of the package as in Lightning (``pl.callbacks.Callback``),
#: each imported when first read
_SUBMODULES = ("accelerators", "callbacks", "cli", "core", "demos", "loggers", "plugins",
               "profilers", "strategies", "tuner", "utilities")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "pytorch":
        # this package also stands for the ``lightning`` package (``import lightning as L``
        # becomes ``import ptrain.lightning as L``), whose trainer is ``L.pytorch``
        return sys.modules[__name__]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _PytorchAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``ptrain.lightning.pytorch`` and ``ptrain.lightning.pytorch.X`` as the very modules
    ``ptrain.lightning`` and ``ptrain.lightning.X``: a program that imports both ``lightning`` and
    ``lightning.pytorch.X`` reads right when every ``lightning`` in its imports becomes
    ``ptrain.lightning``. It must come before the path finder, which would load a second copy of
    each module (other classes, failing ``isinstance``) from ``ptrain/lightning/``."""

    _alias = f"{__name__}.pytorch"

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self._alias and not fullname.startswith(f"{self._alias}."):
            return None
        module = importlib.import_module(__name__ + fullname[len(self._alias):])
        return importlib.util.spec_from_loader(fullname, self,
                                               is_package=hasattr(module, "__path__"))

    def create_module(self, spec: Any) -> Any:
        module = importlib.import_module(__name__ + spec.name[len(self._alias):])
        spec.loader_state = module.__spec__  # the import system sets __spec__ to the alias's
        return module

    def exec_module(self, module: Any) -> None:
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(finder, _PytorchAlias) for finder in sys.meta_path):
    sys.meta_path.insert(0, _PytorchAlias())


def _set_lightning_utilities_rank() -> None:
    """Lightning sets ``lightning_utilities``' ``rank_zero_only.rank`` when it is imported, and
    programs that use that decorator directly rely on it: do the same, where it is installed."""
    if importlib.util.find_spec("lightning_utilities") is None:
        return
    from lightning_utilities.core.rank_zero import rank_zero_only

    if getattr(rank_zero_only, "rank", None) is None:
        from ptrain.lightning.utilities.rank_zero import rank_zero_only as own

        rank_zero_only.rank = own.rank


_set_lightning_utilities_rank()
