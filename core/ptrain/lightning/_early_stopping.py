"""``EarlyStopping`` with Lightning's arguments, over the ``ptrain-early-stopping`` plugin."""

from __future__ import annotations

from ptrain_early_stopping import EarlyStopping as _EarlyStopping


class EarlyStopping(_EarlyStopping):
    """Lightning's ``EarlyStopping``. ``check_on_train_epoch_end``: ``None`` checks after each
    validation (after each training epoch when the run has none), ``True`` at the end of each
    training epoch, ``False`` after each validation. ptrain always reports why it stopped, so
    ``verbose`` changes nothing; ``log_rank_zero_only`` likewise (it reports on rank 0)."""

    def __init__(self, monitor: str, min_delta: float = 0.0, patience: int = 3,
                 verbose: bool = False, mode: str = "min", strict: bool = True,
                 check_finite: bool = True, stopping_threshold: float | None = None,
                 divergence_threshold: float | None = None,
                 check_on_train_epoch_end: bool | None = None,
                 log_rank_zero_only: bool = False):
        check_on = {None: "auto", True: "train_epoch_end",
                    False: "validation"}[check_on_train_epoch_end]
        super().__init__(monitor=monitor, mode=mode, min_delta=min_delta, patience=patience,
                         strict=strict, check_finite=check_finite,
                         stopping_threshold=stopping_threshold,
                         divergence_threshold=divergence_threshold, check_on=check_on)
        self.verbose, self.log_rank_zero_only = verbose, log_rank_zero_only


# programs (and LightningCLI's short class names) know it as ptrain.lightning.callbacks'
EarlyStopping.__module__ = "ptrain.lightning.callbacks"
