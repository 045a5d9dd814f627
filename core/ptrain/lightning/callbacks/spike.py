"""``lightning.pytorch.callbacks.spike``: ``SpikeDetection``, which stops training at a spike of
the training loss."""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch

from ptrain.errors import ConfigError, ModelError
from ptrain.hook_methods import Callback


class TrainingSpikeException(RuntimeError):
    """The training loss spiked at batch ``batch_idx`` (Lightning's exception of this name)."""

    def __init__(self, batch_idx: int, *args: Any):
        super().__init__(f"Training spike detected in batch {batch_idx}", *args)
        self.batch_idx = batch_idx


class SpikeDetection(Callback):
    """Lightning's ``SpikeDetection``: a training loss that moved the wrong way (up with
    ``mode="min"``) from the last one and lies at least ``atol`` and ``rtol`` x the running mean
    of the last ``window`` losses away from that mean (after ``warmup`` batches; with
    ``finite_only`` a NaN or infinite loss too) is a spike: the batch and the one before are
    written to ``exclude_batches_path`` (a JSON list; default ``./skip_batches.json``) and
    :class:`TrainingSpikeException` stops the run. A spike on any process stops every process.

    Lightning reads each loss as it comes (a host-device sync per batch); ptrain keeps them on
    the device and judges them in order every ``log_every_n_steps`` batches, at the epoch's end
    and when training ends, with one sync: the same spikes, found up to that many batches
    later (the batches in between have trained). Losses are those ``training_step`` returned.
    """

    def __init__(self, mode: str = "min", window: int = 10, warmup: int = 1,
                 atol: float | None = None, rtol: float | None = 2.0,
                 exclude_batches_path: Any = None, finite_only: bool = True):
        if mode not in ("min", "max"):
            raise ConfigError(f"SpikeDetection(mode={mode!r}) is not a mode; valid choices: "
                              f"'min', 'max'.")
        if window < 1:
            raise ConfigError(f"SpikeDetection(window={window}) must be at least 1.")
        self.mode, self.window, self.warmup = mode, window, warmup
        self.atol, self.rtol, self.finite_only = atol, rtol, finite_only
        self.exclude_batches_path = exclude_batches_path
        self.bad_batches: list[int] = []
        self.last_val = 0.0
        self._recent: deque[float] = deque(maxlen=window)
        self._pending: list[tuple[int, torch.Tensor]] = []  # (batch_idx, loss) not judged yet

    # -- the rule (Lightning's) ----------------------------------------------------------------

    def _is_spike(self, loss: float) -> bool:
        if self.finite_only and not math.isfinite(loss):
            return True
        if not self._recent:
            mean = math.nan  # no history yet: never a spike by distance
        else:
            mean = sum(self._recent) / len(self._recent)
        difference = loss - self.last_val
        if (difference <= 0) if self.mode == "min" else (difference >= 0):
            return False
        far = (self.atol is None or abs(loss - mean) >= abs(self.atol)) and \
              (self.rtol is None or abs(loss - mean) >= abs(self.rtol * mean))
        return bool(far)

    def _judge(self, trainer: Any) -> None:
        """Judge the pending losses in order; stop every process at the first spike."""
        pending, self._pending = self._pending, []
        spike = math.inf
        if pending:
            values = torch.stack([loss for _, loss in pending]).float().tolist()
            for (batch_idx, _), value in zip(pending, values):
                if batch_idx >= self.warmup and self._is_spike(value):
                    spike = batch_idx
                    break
                if math.isfinite(value) or not self.finite_only:
                    self._recent.append(value)
                    self.last_val = value
        if trainer.world_size > 1:  # every process stops at the first spike any of them saw
            flag = torch.tensor([spike], dtype=torch.float64, device=trainer.device)
            spike = trainer.hook.reduce_metrics(trainer=trainer, metrics={"spike": flag},
                                                op="min")["spike"].item()
        if math.isfinite(spike):
            self._handle_spike(trainer, int(spike))

    def _handle_spike(self, trainer: Any, batch_idx: int) -> None:
        self.bad_batches.extend([batch_idx - 1, batch_idx])
        path = os.fspath(self.exclude_batches_path or os.getcwd())
        if not path.endswith(".json"):
            path = os.path.join(path, "skip_batches.json")
        self.exclude_batches_path = path
        if trainer.is_global_zero:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                json.dump(self.bad_batches, f, indent=4)
        raise TrainingSpikeException(batch_idx)

    # -- Lightning's callback methods ----------------------------------------------------------

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if isinstance(outputs, torch.Tensor):
            loss = outputs
        elif isinstance(outputs, Mapping) and isinstance(outputs.get("loss"), torch.Tensor):
            loss = outputs["loss"]
        else:
            raise ModelError(f"SpikeDetection watches the training loss, and training_step "
                             f"returned {type(outputs).__name__}; return the loss (a tensor, or "
                             f"a dict with it under 'loss').")
        self._pending.append((batch_idx, loss.detach()))
        if len(self._pending) >= trainer.log_every_n_steps:
            self._judge(trainer)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._judge(trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._judge(trainer)

    def state_dict(self) -> dict[str, Any]:
        return {"last_val": self.last_val, "recent": list(self._recent),
                "bad_batches": list(self.bad_batches)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_val = state_dict["last_val"]
        self._recent = deque(state_dict["recent"], maxlen=self.window)
        self.bad_batches = list(state_dict["bad_batches"])


__all__ = ["SpikeDetection", "TrainingSpikeException"]
