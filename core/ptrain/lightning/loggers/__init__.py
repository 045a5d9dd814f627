"""``lightning.pytorch.loggers``: Lightning's logger classes as ptrain logger plugins.

A Lightning file logger names the run folder: ``save_dir/name/version_N`` (``name`` defaults
to ``lightning_logs``), where ptrain's :class:`~ptrain.lightning.Trainer` then writes the run's
logs and checkpoints, as Lightning does. :class:`Logger` is the base class programs subclass
(see :mod:`ptrain.lightning.loggers.logger`). ``MLFlowLogger`` and ``WandbLogger`` come with the
``ptrain-mlflow`` and ``ptrain-wandb`` distributions; ``CometLogger`` and ``LitLogger`` are
refused when made (ptrain has no plugin for those services).
"""

from __future__ import annotations

from typing import Any, NoReturn

from ptrain.errors import ConfigError
from ptrain.lightning._common import from_distribution, submodule
from ptrain.lightning.loggers.csv_logs import CSVLogger
from ptrain.lightning.loggers.logger import Logger
from ptrain.lightning.loggers.tensorboard import TensorBoardLogger


class _WithoutPlugin:
    """A Lightning logger for a service ptrain has no plugin for: refused when made."""

    _service = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._refuse()

    @classmethod
    def _refuse(cls) -> NoReturn:
        raise ConfigError(
            f"{cls.__name__} is not supported by ptrain: there is no ptrain logger plugin for "
            f"{cls._service}, and a logger that records nothing would silently lose the run's "
            f"metrics. Use TensorBoardLogger, CSVLogger, MLFlowLogger or WandbLogger, or "
            f"subclass ptrain.lightning.loggers.Logger (log_metrics, log_hyperparams) to send "
            f"the values to {cls._service} yourself.")


class CometLogger(_WithoutPlugin):
    """Lightning's ``CometLogger``: refused when made (see :class:`_WithoutPlugin`)."""

    _service = "Comet (comet_ml)"


class LitLogger(_WithoutPlugin):
    """Lightning's ``LitLogger``: refused when made (see :class:`_WithoutPlugin`)."""

    _service = "Lightning AI's hosted experiments (litlogger)"


class NeptuneLogger(_WithoutPlugin):
    """Lightning's ``NeptuneLogger`` (``loggers.neptune``): refused when made (see
    :class:`_WithoutPlugin`)."""

    _service = "Neptune (neptune)"


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return submodule(__name__, name, _SUBMODULES)
    return from_distribution(__name__, name, _FROM_DISTRIBUTIONS)


#: modules here that Lightning's package has imported and that this one imports when first read
_SUBMODULES = ("comet", "litlogger", "mlflow", "wandb")


_FROM_DISTRIBUTIONS = {
    "MLFlowLogger": ("ptrain-mlflow", "ptrain.lightning.loggers.mlflow", "MLFlowLogger"),
    "WandbLogger": ("ptrain-wandb", "ptrain.lightning.loggers.wandb", "WandbLogger"),
}

__all__ = ["CSVLogger", "CometLogger", "LitLogger", "Logger", "TensorBoardLogger",
           *_FROM_DISTRIBUTIONS]
