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

from ptrain.hook_methods import Callback
from ptrain.lightning._common import from_distribution, submodule

from ptrain.lightning.callbacks.checkpoint import Checkpoint
from ptrain.lightning.callbacks.device_stats_monitor import DeviceStatsMonitor
from ptrain.lightning.callbacks.finetuning import (
    BackboneFinetuning, BaseFinetuning)
from ptrain.lightning.callbacks.gradient_accumulation_scheduler import (
    GradientAccumulationScheduler)
from ptrain.lightning.callbacks.lambda_function import LambdaCallback
from ptrain.lightning.callbacks.model_checkpoint import ModelCheckpoint
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


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return submodule(__name__, name, _SUBMODULES)
    return from_distribution(__name__, name, _FROM_DISTRIBUTIONS)


#: modules here that Lightning's package has imported and that this one imports when first read
_SUBMODULES = ("batch_size_finder", "callback", "early_stopping", "lr_finder", "lr_monitor")


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
