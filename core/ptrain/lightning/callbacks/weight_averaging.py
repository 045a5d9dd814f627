"""``lightning.pytorch.callbacks.weight_averaging``: ``WeightAveraging`` (an average of the
weights kept with ``torch.optim.swa_utils.AveragedModel``) and ``EMAWeightAveraging``."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn

from ptrain.hook_methods import Callback


class WeightAveraging(Callback):
    """Lightning's ``WeightAveraging``: an ``AveragedModel`` of the module (``device``,
    ``use_buffers`` and the other keywords are ``AveragedModel``'s), updated after each
    optimizer step for which ``should_update(step_idx=...)`` says so and at each epoch's end
    for which ``should_update(epoch_idx=...)`` does (by default every step); validation runs on
    the average, and when ``fit`` ends the module holds it.

    The average is updated in ``on_train_batch_end`` after a batch that stepped the optimizer,
    before the validation that batch triggers, as in Lightning. Checkpoints differ: ptrain's keep
    the trained weights as the model and the average in this callback's state (a callback's
    ``on_save_checkpoint`` gets a dict of its own); a resumed ``fit`` continues both.
    """

    def __init__(self, device: Any = None, use_buffers: bool = True, **kwargs: Any) -> None:
        self._device = torch.device(device) if isinstance(device, str) else device
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average_model: AveragedModel | None = None
        self._latest_update_step = 0
        self._latest_update_epoch = -1
        self._saved_average: dict[str, Any] | None = None

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Whether to update the average after optimizer step ``step_idx`` (0-based) or at the
        end of epoch ``epoch_idx``: after every step by default."""
        return step_idx is not None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        device = self._device or pl_module.device
        self._average_model = AveragedModel(model=pl_module, device=device,
                                            use_buffers=self._use_buffers, **self._kwargs)
        if self._saved_average is not None:  # resuming: the average the run had
            self._average_model.load_state_dict(self._saved_average)
            self._saved_average = None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if trainer.global_step > self._latest_update_step \
                and self.should_update(step_idx=trainer.global_step - 1):
            self._average_model.update_parameters(pl_module)
            self._latest_update_step = trainer.global_step

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.current_epoch > self._latest_update_epoch \
                and self.should_update(epoch_idx=trainer.current_epoch):
            self._average_model.update_parameters(pl_module)
            self._latest_update_epoch = trainer.current_epoch

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        for average, current in self._pairs(pl_module):
            current.data.copy_(average.data)

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self._average_model is not None:
            self._swap_models(pl_module)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self._average_model is not None:
            self._swap_models(pl_module)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"latest_update_step": self._latest_update_step,
                                 "latest_update_epoch": self._latest_update_epoch}
        if self._average_model is not None:
            state["average_model"] = self._average_model.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._latest_update_step = state_dict["latest_update_step"]
        self._latest_update_epoch = state_dict.get("latest_update_epoch", -1)
        self._saved_average = state_dict.get("average_model")

    def _pairs(self, pl_module: Any) -> Any:
        module = self._average_model.module
        return zip(itertools.chain(module.parameters(), module.buffers()),
                   itertools.chain(pl_module.parameters(), pl_module.buffers()))

    def _swap_models(self, pl_module: Any) -> None:
        for average, current in self._pairs(pl_module):
            kept = average.data.clone()
            average.data.copy_(current.data)
            current.data.copy_(kept)


class EMAWeightAveraging(WeightAveraging):
    """Lightning's ``EMAWeightAveraging``: an exponential moving average (``decay``), updated
    every ``update_every_n_steps`` steps from ``update_starting_at_step`` (or at each epoch's
    end from ``update_starting_at_epoch``)."""

    def __init__(self, device: Any = None, use_buffers: bool = True, decay: float = 0.999,
                 update_every_n_steps: int = 1, update_starting_at_step: int | None = None,
                 update_starting_at_epoch: int | None = None, **kwargs: Any) -> None:
        super().__init__(device=device, use_buffers=use_buffers, **kwargs,
                         avg_fn=get_ema_avg_fn(decay=decay))
        self.decay = decay
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    def __getstate__(self) -> dict[str, Any]:
        # torch's EMA function is a closure: made again from the decay when unpickled (a
        # spawned worker receives the callback pickled)
        state = dict(self.__dict__)
        state["_kwargs"] = {k: v for k, v in self._kwargs.items() if k != "avg_fn"}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._kwargs["avg_fn"] = get_ema_avg_fn(decay=self.decay)

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        if step_idx is not None:
            started = self.update_starting_at_step is None \
                or step_idx >= self.update_starting_at_step
            if started and self.update_every_n_steps > 0 \
                    and step_idx % self.update_every_n_steps == 0:
                return True
        return epoch_idx is not None and self.update_starting_at_epoch is not None \
            and epoch_idx >= self.update_starting_at_epoch


__all__ = ["EMAWeightAveraging", "WeightAveraging"]
