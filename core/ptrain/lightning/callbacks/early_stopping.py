"""``lightning.pytorch.callbacks.early_stopping``: ``EarlyStopping`` with Lightning's arguments
and attributes, over the ``ptrain-early-stopping`` plugin (importing this module without that
distribution is an ``ImportError`` naming it), and ``EarlyStoppingReason``."""

from __future__ import annotations

import enum
import math
from typing import Any

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
    (``val_check_interval == 1.0`` and ``check_val_every_n_epoch == 1``, the defaults, and also
    when the run has no validation), else after each validation. ptrain always reports why it
    stopped, so ``verbose`` changes nothing; ``log_rank_zero_only`` likewise (it reports on
    rank 0).

    Lightning's attributes: ``wait_count``, ``best_score`` (a tensor), ``stopped_epoch`` (0
    until it stops), ``stopping_reason`` (:class:`EarlyStoppingReason`),
    ``stopping_reason_message`` and ``state_key``; ``state_dict()`` has Lightning's keys (and
    what ptrain needs to resume exactly), saved under ``checkpoint["callbacks"][state_key]``.
    The checks are Lightning's methods ``on_validation_end`` and ``on_train_epoch_end``, called
    at those points, so a subclass may override them and call ``super()`` (to skip the first
    epochs, say), as a Lightning program does."""

    #: Lightning's methods this class calls itself (below), where Lightning calls them
    not_ptrain_hooks = ("on_train_epoch_end",)

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

    # -- the checks, as Lightning's methods --------------------------------------------------

    def on_validation_end(self, trainer, pl_module) -> None:
        """After a validation within ``fit``: checks, when the checks are made there."""
        if self._checks_after_validation:
            self._check(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        """At the end of a training epoch: checks, when the checks are made there."""
        if not self._checks_after_validation:
            self._check(trainer)

    @hookimpl(specname="on_validation_end")
    def _after_validation(self, trainer) -> None:
        if trainer.stage == "train":  # a validation within fit, not the sanity check
            self.on_validation_end(trainer, trainer.module)

    @hookimpl
    def on_epoch_end(self, trainer) -> None:
        self._last_epoch = trainer.current_epoch
        self.on_train_epoch_end(trainer, trainer.module)

    # -- Lightning's attributes ----------------------------------------------------------------

    @property
    def state_key(self) -> str:
        """Where a checkpoint keeps this callback's state (``checkpoint["callbacks"]
        [state_key]``): the class and the options that tell two such callbacks apart."""
        return type(self).__qualname__ + repr({"monitor": self.monitor, "mode": self.mode})

    @hookimpl
    def state_dict(self) -> dict[str, Any]:
        """Lightning's keys (``wait_count``, ``stopped_epoch``, ``best_score``, ``patience``,
        ``stopping_reason`` as its number, ``stopping_reason_message``), then ptrain's."""
        return {**super().state_dict(),
                "wait_count": self.wait_count, "stopped_epoch": self.stopped_epoch,
                "best_score": self.best_score, "patience": self.patience,
                "stopping_reason": self.stopping_reason.value,
                "stopping_reason_message": self.stopping_reason_message}

    @hookimpl
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s result, or the state Lightning's ``EarlyStopping``
        gives (its keys only). ``patience`` stays the one this callback was given (Lightning's
        takes the saved one): a resume that asks for another patience gets it."""
        if "wait" in state:
            super().load_state_dict({**state, "stopped_epoch": state["stopped_epoch"]
                                     if state.get("reason") is not None else None})
            return
        self.wait = state["wait_count"]
        best = float(state["best_score"])
        self.best = None if math.isinf(best) else best
        kind = {reason: kind for kind, reason in _REASONS.items()}[
            EarlyStoppingReason(state.get("stopping_reason", 0))]
        self.reason_kind = kind
        self.reason = (state.get("stopping_reason_message") or kind) if kind else None
        self.stopped_epoch = state["stopped_epoch"]  # kept as given, as Lightning does

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
