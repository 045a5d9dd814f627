"""``lightning.pytorch.callbacks.timer``: ``Timer``, which times the stages and stops training
after a duration."""

from __future__ import annotations

import datetime
import re
import time
from typing import Any

from ptrain.errors import ConfigError
from ptrain.hook_methods import Callback

STAGES = ("train", "sanity_check", "validate", "test", "predict")
_LIGHTNING_STAGES = {"training": "train", "validating": "validate", "testing": "test",
                     "predicting": "predict", "sanity_check": "sanity_check"}


def duration_seconds(duration: Any) -> float | None:
    """Lightning's duration forms (``"DD:HH:MM:SS"``, a ``timedelta``, a dict of ``timedelta``
    keywords, or ``None``) in seconds."""
    if duration is None:
        return None
    if isinstance(duration, str):
        match = re.fullmatch(r"(\d+):(\d\d):(\d\d):(\d\d)", duration.strip())
        if match is None:
            raise ConfigError(f"Timer(duration={duration!r}) is not a duration: give "
                              f"'DD:HH:MM:SS' (e.g. '00:12:00:00'), a datetime.timedelta or a "
                              f"dict such as {{'hours': 12}}.")
        days, hours, minutes, seconds = (int(g) for g in match.groups())
        duration = datetime.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    elif isinstance(duration, dict):
        duration = datetime.timedelta(**duration)
    if not isinstance(duration, datetime.timedelta):
        raise ConfigError(f"Timer(duration={duration!r}) is not a duration: give "
                          f"'DD:HH:MM:SS', a datetime.timedelta or a dict of its keywords.")
    return duration.total_seconds()


def _stage(stage: Any) -> str:
    value = getattr(stage, "value", stage)  # Lightning's RunningStage enum, or its text
    value = _LIGHTNING_STAGES.get(value, value)
    if value not in STAGES:
        raise ConfigError(f"Timer: {stage!r} is not a stage; valid: "
                          f"{', '.join(_LIGHTNING_STAGES)}.")
    return value


class Timer(Callback):
    """Lightning's ``Timer``: ``start_time``, ``end_time`` and ``time_elapsed`` of each stage
    (``"train"``/``"training"``, ``"validate"``/``"validating"``, ``"test"``/``"testing"``,
    ``"predict"``), and with ``duration`` ``time_remaining``, stopping training once it passed.

    With ``interval="step"`` the stop goes through the Trainer's ``max_time`` (for the rest of
    this ``fit``), so every process stops at the same point: the next time ptrain checks the
    limits (each ``log_every_n_steps`` steps and each validation), not after the very batch at
    which the time ran out. With ``interval="epoch"`` training stops after the epoch that ran
    out of time, as in Lightning. The training time survives a resume (``state_dict``).
    """

    def __init__(self, duration: Any = None, interval: str = "step", verbose: bool = True):
        interval = getattr(interval, "value", interval)
        if interval not in ("step", "epoch"):
            raise ConfigError(f"Timer(interval={interval!r}) is not an interval; valid choices: "
                              f"'step', 'epoch'.")
        self._duration = duration_seconds(duration)
        self._interval = interval
        self._verbose = verbose
        self._start_time: dict[str, float | None] = dict.fromkeys(STAGES)
        self._end_time: dict[str, float | None] = dict.fromkeys(STAGES)
        self._offset = 0.0  # training time of the run this one resumed
        self._saved_max_time: tuple[Any] | None = None

    def start_time(self, stage: Any = "train") -> float | None:
        return self._start_time[_stage(stage)]

    def end_time(self, stage: Any = "train") -> float | None:
        return self._end_time[_stage(stage)]

    def time_elapsed(self, stage: Any = "train") -> float:
        stage = _stage(stage)
        offset = self._offset if stage == "train" else 0.0
        start, end = self._start_time[stage], self._end_time[stage]
        if start is None:
            return offset
        return (time.monotonic() if end is None else end) - start + offset

    def time_remaining(self, stage: Any = "train") -> float | None:
        return None if self._duration is None else self._duration - self.time_elapsed(stage)

    # -- the stages --------------------------------------------------------------------------

    def _started(self, stage: str) -> None:
        self._start_time[stage], self._end_time[stage] = time.monotonic(), None

    def _ended(self, stage: str) -> None:
        self._end_time[stage] = time.monotonic()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._started("train")
        if self._duration is not None and self._interval == "step":
            self._saved_max_time = (trainer.max_time,)
            limit = trainer._elapsed() + self._duration - self._offset
            trainer.max_time = limit if trainer.max_time is None else min(trainer.max_time,
                                                                          limit)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._ended("train")
        self._restore_max_time(trainer)
        if self._duration is not None and self._verbose and trainer.is_global_zero \
                and self.time_elapsed("train") >= self._duration:
            elapsed = datetime.timedelta(seconds=int(self.time_elapsed("train")))
            print(f"Timer: the time limit was reached after {elapsed} of training; training "
                  f"stopped.", flush=True)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self._interval == "epoch" and self._duration is not None \
                and self.time_elapsed("train") >= self._duration:
            trainer.should_stop = True  # agreed across processes at the epoch's end

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self._started("sanity_check")

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        self._ended("sanity_check")

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._started("validate")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._ended("validate")

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._started("test")

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._ended("test")

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self._started("predict")

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self._ended("predict")

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._restore_max_time(trainer)  # also after an error

    def _restore_max_time(self, trainer: Any) -> None:
        if self._saved_max_time is not None:
            (trainer.max_time,), self._saved_max_time = self._saved_max_time, None

    # -- resume ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {stage: self.time_elapsed(stage) for stage in STAGES}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset = state_dict.get("time_elapsed", {}).get("train", 0.0)


__all__ = ["Timer"]
