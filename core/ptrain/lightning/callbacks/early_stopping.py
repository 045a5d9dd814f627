"""``lightning.pytorch.callbacks.early_stopping``: ``EarlyStopping`` with Lightning's arguments
and attributes, over the ``ptrain-early-stopping`` plugin (importing this module without that
distribution is an ``ImportError`` naming it), and ``EarlyStoppingReason``."""

from __future__ import annotations

import enum

import torch

from ptrain import hookimpl

try:
    from ptrain_early_stopping import EarlyStopping as _EarlyStopping
except ImportError as exc:
    raise ImportError("ptrain.lightning.callbacks.early_stopping comes with the "
                      "ptrain-early-stopping distribution, which is not installed: pip install "
                      "ptrain-early-stopping") from exc


class EarlyStoppingReason(enum.Enum):
    """Why an :class:`EarlyStopping` stopped the run (``NOT_STOPPED`` while it has not)."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


_REASONS = {None: EarlyStoppingReason.NOT_STOPPED,
            "stopping_threshold": EarlyStoppingReason.STOPPING_THRESHOLD,
            "divergence_threshold": EarlyStoppingReason.DIVERGENCE_THRESHOLD,
            "patience": EarlyStoppingReason.PATIENCE_EXHAUSTED,
            "non_finite": EarlyStoppingReason.NON_FINITE_METRIC}


class EarlyStopping(_EarlyStopping):
    """Lightning's ``EarlyStopping``. ``check_on_train_epoch_end``: ``True`` checks at the end of
    each training epoch (after the module's and the other callbacks' ``on_train_epoch_end``, so
    a metric logged there, or logged with ``on_epoch=True`` in ``training_step``, is seen),
    ``False`` after each validation; ``None`` chooses as Lightning does when the stage starts:
    at the end of each training epoch when the trainer validates once an epoch
    (``val_check_interval == 1.0`` and ``check_val_every_n_epoch == 1``, the defaults, and
    also when the run has no validation), else after each validation. ptrain always reports why it stopped, so
    ``verbose`` changes nothing; ``log_rank_zero_only`` likewise (it reports on rank 0).

    Lightning's attributes: ``wait_count``, ``best_score`` (a tensor), ``stopped_epoch`` (0
    until it stops), ``stopping_reason`` (:class:`EarlyStoppingReason`) and
    ``stopping_reason_message``."""

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
        self._chooses_like_lightning = check_on_train_epoch_end is None

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        if self._chooses_like_lightning:
            once_an_epoch = (trainer.val_check_interval == 1.0
                             and trainer.check_val_every_n_epoch == 1)
            self.check_on = "train_epoch_end" if once_an_epoch else "validation"
        super().setup(trainer, stage)

    @property
    def wait_count(self) -> int:
        return self.wait

    @wait_count.setter
    def wait_count(self, value: int) -> None:
        self.wait = value

    @property
    def best_score(self) -> torch.Tensor:
        """The best value so far (``inf``/``-inf`` before the first check), as a tensor."""
        if self.best is None:
            return torch.tensor(float("inf") if self.mode == "min" else float("-inf"))
        return torch.tensor(self.best)

    @property
    def stopping_reason(self) -> EarlyStoppingReason:
        return _REASONS[self.reason_kind]

    @property
    def stopping_reason_message(self) -> str | None:
        """Why it stopped, headed by the phrase Lightning's message starts with (programs
        match on it); ``None`` before it stops."""
        if self.reason is None:
            return None
        heading = _HEADINGS.get(self.reason_kind)
        return f"{heading}: {self.reason}" if heading else self.reason

    @property
    def stopped_epoch(self) -> int:
        """The epoch it asked to stop at; 0 until then (Lightning's value)."""
        stopped = self.__dict__.get("_stopped_epoch")
        return 0 if stopped is None else stopped

    @stopped_epoch.setter
    def stopped_epoch(self, value: int | None) -> None:
        self.__dict__["_stopped_epoch"] = value


#: reason_kind -> the phrase Lightning's stopping_reason_message begins with
_HEADINGS = {"stopping_threshold": "Stopping threshold reached",
             "divergence_threshold": "Divergence threshold reached",
             "non_finite": "Monitored metric is not finite",
             "patience": "Monitored metric did not improve"}
