"""``lightning.pytorch.callbacks``: Lightning's callback classes over ptrain's plugins.

Each takes Lightning's arguments; an argument whose Lightning meaning ptrain does not have is
refused with a message (never ignored). ``EarlyStopping`` and ``LearningRateMonitor`` come from
the ``ptrain-early-stopping`` and ``ptrain-lr-monitor`` distributions.
"""

from __future__ import annotations

from typing import Any

from ptrain.builtins.checkpoint import ModelCheckpoint as _Checkpoint
from ptrain.hook_methods import Callback
from ptrain.lightning._common import from_distribution, refuse, refuse_unless


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
        if every_n_train_steps and every_n_epochs is None:
            every_n_epochs = 0  # Lightning: a step interval alone turns epoch saving off
        super().__init__(filename=filename, monitor=monitor, mode=mode, save_top_k=save_top_k,
                         save_last=bool(save_last), every_n_epochs=1 if every_n_epochs is None
                         else every_n_epochs, every_n_train_steps=every_n_train_steps or 0,
                         train_time_interval=train_time_interval,
                         save_on_train_epoch_end=save_on_train_epoch_end,
                         auto_insert_metric_name=auto_insert_metric_name, dirpath=dirpath,
                         save_weights_only=save_weights_only)
        self.verbose = verbose


def __getattr__(name: str) -> Any:
    return from_distribution(__name__, name, _FROM_DISTRIBUTIONS)


_FROM_DISTRIBUTIONS = {
    "EarlyStopping": ("ptrain-early-stopping", "ptrain.lightning._early_stopping",
                      "EarlyStopping"),
    "LearningRateMonitor": ("ptrain-lr-monitor", "ptrain_lr_monitor", "LearningRateMonitor"),
}

__all__ = ["Callback", "ModelCheckpoint", *_FROM_DISTRIBUTIONS]
