"""What a trainer is doing, in Lightning's words: ``TrainerFn`` (the stage method called),
``RunningStage`` (the loop running inside it), ``TrainerStatus`` and ``TrainerState``. ptrain's
``trainer.stage_call`` holds ``TrainerFn``'s values, ``trainer.stage`` ``RunningStage``'s (with
``trainer.sanity_checking`` for the sanity check) and ``trainer.status`` ``TrainerStatus``'s;
``ptrain.lightning.Trainer.state`` is a :class:`BoundTrainerState` over them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ptrain.lightning.utilities.enums import LightningEnum


class TrainerStatus(LightningEnum):
    INITIALIZING = "initializing"
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"

    @property
    def stopped(self) -> bool:
        return self in (TrainerStatus.FINISHED, TrainerStatus.INTERRUPTED)


class TrainerFn(LightningEnum):
    """The stage method running: ``fit``, ``validate``, ``test`` or ``predict``."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(LightningEnum):
    """The loop running within a stage (``fit`` runs the sanity check, training and
    validation)."""

    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"

    @property
    def evaluating(self) -> bool:
        return self in (RunningStage.VALIDATING, RunningStage.TESTING,
                        RunningStage.SANITY_CHECKING)

    @property
    def dataloader_prefix(self) -> str | None:
        """The prefix of the dataloader hook this loop reads (``val`` for validation and the
        sanity check)."""
        if self in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING):
            return "val"
        return self.value


@dataclass
class TrainerState:
    status: TrainerStatus = TrainerStatus.INITIALIZING
    fn: TrainerFn | None = None
    stage: RunningStage | None = None

    @property
    def finished(self) -> bool:
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        return self.status.stopped


class BoundTrainerState(TrainerState):
    """``trainer.state``: a :class:`TrainerState` that reads and writes the ptrain trainer's own
    fields (``stage_call``, ``stage``, ``sanity_checking``, ``status``), so it is never out of
    date and setting a field (``trainer.state.fn = TrainerFn.FITTING``) sets the trainer's."""

    def __init__(self, trainer: Any):
        object.__setattr__(self, "_trainer", trainer)

    @property
    def status(self) -> TrainerStatus:
        return TrainerStatus(self._trainer.status)

    @status.setter
    def status(self, value: Any) -> None:
        self._trainer.status = TrainerStatus(value).value

    @property
    def fn(self) -> TrainerFn | None:
        call = self._trainer.stage_call
        return None if call is None else TrainerFn(call)

    @fn.setter
    def fn(self, value: Any) -> None:
        self._trainer.stage_call = None if value is None else TrainerFn(value).value

    @property
    def stage(self) -> RunningStage | None:
        trainer = self._trainer
        if trainer.sanity_checking:
            return RunningStage.SANITY_CHECKING
        return None if trainer.stage is None else RunningStage(trainer.stage)

    @stage.setter
    def stage(self, value: Any) -> None:
        stage = None if value is None else RunningStage(value)
        self._trainer.sanity_checking = stage is RunningStage.SANITY_CHECKING
        self._trainer.stage = ("validate" if stage is RunningStage.SANITY_CHECKING
                               else None if stage is None else stage.value)

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, TrainerState):
            return NotImplemented
        return (self.status, self.fn, self.stage) == (other.status, other.fn, other.stage)

    def __repr__(self) -> str:
        return f"TrainerState(status={self.status!r}, fn={self.fn!r}, stage={self.stage!r})"
