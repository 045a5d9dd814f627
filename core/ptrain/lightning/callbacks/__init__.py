"""``lightning.pytorch.callbacks``: Lightning's callback classes over ptrain's plugins.

Each takes Lightning's arguments; an argument whose Lightning meaning ptrain does not have is
refused with a message (never ignored). Most are callbacks written with Lightning's method names
(ptrain calls those where Lightning does); the others are ptrain plugins with Lightning's
arguments (``ModelCheckpoint``, ``ModelSummary``, the progress bars, the finders), each in the
submodule of Lightning's name (``callbacks.progress``, ``callbacks.finetuning``, ...).
``EarlyStopping``, ``LearningRateMonitor``, ``BatchSizeFinder`` and ``LearningRateFinder`` come
from the ``ptrain-early-stopping``, ``ptrain-lr-monitor`` and ``ptrain-finders`` distributions.
"""

from __future__ import annotations

from typing import Any

from ptrain.builtins.checkpoint import ModelCheckpoint as _Checkpoint
from ptrain.errors import ConfigError
from ptrain.hook_methods import Callback
from ptrain.lightning._common import from_distribution, refuse, refuse_unless

from ptrain.lightning.callbacks.checkpoint import Checkpoint
from ptrain.lightning.callbacks.device_stats_monitor import DeviceStatsMonitor
from ptrain.lightning.callbacks.finetuning import (
    BackboneFinetuning, BaseFinetuning)
from ptrain.lightning.callbacks.gradient_accumulation_scheduler import (
    GradientAccumulationScheduler)
from ptrain.lightning.callbacks.lambda_function import LambdaCallback
from ptrain.lightning.callbacks.model_summary import ModelSummary
from ptrain.lightning.callbacks.on_exception_checkpoint import (
    OnExceptionCheckpoint)
from ptrain.lightning.callbacks.prediction_writer import BasePredictionWriter
from ptrain.lightning.callbacks.progress import (
    ProgressBar, RichProgressBar, TQDMProgressBar)
from ptrain.lightning.callbacks.pruning import ModelPruning
from ptrain.lightning.callbacks.rich_model_summary import RichModelSummary
from ptrain.lightning.callbacks.spike import SpikeDetection
from ptrain.lightning.callbacks.stochastic_weight_avg import (
    StochasticWeightAveraging)
from ptrain.lightning.callbacks.throughput_monitor import ThroughputMonitor
from ptrain.lightning.callbacks.timer import Timer
from ptrain.lightning.callbacks.weight_averaging import (
    EMAWeightAveraging, WeightAveraging)


class ModelCheckpoint(_Checkpoint):
    """Lightning's ``ModelCheckpoint``, as ptrain's ``checkpoint`` callback (it replaces the
    default one). Files go to ``dirpath``, by default ``<run folder>/checkpoints`` like
    Lightning's; ``save_last=None`` (Lightning's default) writes no ``last.ckpt``. With
    ``save_weights_only=True`` the top-k files hold the weights only, as Lightning writes them,
    and the full state for an exact resume is kept in a ``last.ckpt`` (said once, with where)."""

    def __init__(self, dirpath: Any = None, filename: str | None = None,
                 monitor: str | None = None, verbose: bool = False,
                 save_last: bool | None = None, save_top_k: int = 1,
                 save_on_exception: bool = False, save_weights_only: bool = False,
                 mode: str = "min", auto_insert_metric_name: bool = True,
                 every_n_train_steps: int | None = None, train_time_interval: Any = None,
                 every_n_epochs: int | None = None, save_on_train_epoch_end: bool | None = None,
                 enable_version_counter: bool = True):
        refuse_unless("ModelCheckpoint", locals(), {
            "save_on_exception": (False, "a checkpoint is not written after an error; resume "
                                         "from the last one written"),
            "enable_version_counter": (True, "ptrain never overwrites a kept checkpoint "
                                             "file"),
        })
        if save_last == "link":
            raise refuse("ModelCheckpoint", "save_last", save_last,
                         "last.ckpt is written as a file; use save_last=True")
        # Lightning's triggers: one of them (each epoch when none is given); ptrain's own
        # callback can combine them (ptrain.builtins.checkpoint.ModelCheckpoint)
        if every_n_train_steps is None and every_n_epochs is None and train_time_interval is None:
            every_n_epochs, every_n_train_steps = 1, 0
        every_n_epochs, every_n_train_steps = every_n_epochs or 0, every_n_train_steps or 0
        given = [f"{name}={value!r}" for name, value, on in (
            ("every_n_train_steps", every_n_train_steps, every_n_train_steps > 0),
            ("every_n_epochs", every_n_epochs, every_n_epochs > 0),
            ("train_time_interval", train_time_interval, train_time_interval is not None))
            if on]
        if len(given) > 1:
            raise ConfigError(
                f"ModelCheckpoint({', '.join(given)}): Lightning's ModelCheckpoint takes one of "
                f"these triggers, not several; give one (ptrain's own "
                f"ptrain.builtins.checkpoint.ModelCheckpoint combines them).")
        super().__init__(filename=filename, monitor=monitor, mode=mode, save_top_k=save_top_k,
                         save_last=bool(save_last), every_n_epochs=every_n_epochs,
                         every_n_train_steps=every_n_train_steps,
                         train_time_interval=train_time_interval,
                         save_on_train_epoch_end=save_on_train_epoch_end,
                         auto_insert_metric_name=auto_insert_metric_name, dirpath=dirpath,
                         save_weights_only=save_weights_only)
        self.verbose = verbose


def __getattr__(name: str) -> Any:
    return from_distribution(__name__, name, _FROM_DISTRIBUTIONS)


_FROM_DISTRIBUTIONS = {
    "EarlyStopping": ("ptrain-early-stopping", "ptrain.lightning.callbacks.early_stopping",
                      "EarlyStopping"),
    "LearningRateMonitor": ("ptrain-lr-monitor", "ptrain_lr_monitor", "LearningRateMonitor"),
    "BatchSizeFinder": ("ptrain-finders", "ptrain.lightning.callbacks.batch_size_finder",
                        "BatchSizeFinder"),
    "LearningRateFinder": ("ptrain-finders", "ptrain.lightning.callbacks.lr_finder",
                           "LearningRateFinder"),
}

__all__ = ["BackboneFinetuning", "BaseFinetuning", "BasePredictionWriter", "Callback",
           "Checkpoint", "DeviceStatsMonitor", "EMAWeightAveraging",
           "GradientAccumulationScheduler", "LambdaCallback", "ModelCheckpoint", "ModelPruning",
           "ModelSummary", "OnExceptionCheckpoint", "ProgressBar", "RichModelSummary",
           "RichProgressBar", "SpikeDetection", "StochasticWeightAveraging", "TQDMProgressBar",
           "ThroughputMonitor", "Timer", "WeightAveraging", *_FROM_DISTRIBUTIONS]
