"""Logged metrics: kept as tensors on the device, turned into numbers only when published."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ptrain.errors import ModelError

if TYPE_CHECKING:
    from ptrain.trainer import Trainer


class MetricStore:
    """What ``TrainModule.log`` records during one stage, and what callbacks read.

    Step values are the latest tensor per name; epoch values are running sums (tensors) and
    counts, averaged when the epoch or the validation run ends. Nothing here calls ``.item()``:
    :meth:`publish` converts once per publish point, for every metric together.
    """

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.step_values: dict[str, torch.Tensor] = {}
        # stage -> name -> [sum tensor, count]
        self.epoch_sums: dict[str, dict[str, list[Any]]] = {
            stage: {} for stage in ("train", "validate", "test", "predict")}
        self.prog_bar: set[str] = set()
        self.callback_metrics: dict[str, torch.Tensor] = {}

    def log(self, name: str, value: Any, prog_bar: bool, on_step: bool | None,
            on_epoch: bool | None) -> None:
        stage = self.trainer.stage
        if stage == "predict":
            raise ModelError(f"self.log({name!r}, ...) was called in predict_step, where nothing "
                             f"is logged: return the value from predict_step instead (it is in "
                             f"what Trainer.predict returns).")
        training = stage == "train"
        on_step = training if on_step is None else on_step
        on_epoch = (not training) if on_epoch is None else on_epoch
        if isinstance(value, torch.Tensor):
            value = value.detach()
        else:
            value = torch.tensor(float(value), device=self.trainer.device)
        step_name, epoch_name = (f"{name}_step", f"{name}_epoch") if on_step and on_epoch \
            else (name, name)
        if on_step:
            self.step_values[step_name] = value
            self.callback_metrics[step_name] = value
            if prog_bar:
                self.prog_bar.add(step_name)
        if on_epoch:
            sums = self.epoch_sums[self.trainer.stage]
            entry = sums.get(epoch_name)
            if entry is None:
                sums[epoch_name] = [value.float(), 1]
            else:
                entry[0] = entry[0] + value
                entry[1] += 1
            if prog_bar:
                self.prog_bar.add(epoch_name)

    def publish_step(self) -> None:
        """Reduce and write the latest step values (a publish point: every process calls it)."""
        if self.step_values:
            self._publish(dict(self.step_values), update_callback_metrics=False)
            self.step_values.clear()

    def publish_epoch(self, stage: str) -> dict[str, torch.Tensor]:
        """Average, reduce and write ``stage``'s epoch values; they join ``callback_metrics``."""
        sums = self.epoch_sums[stage]
        means = {name: total / count for name, (total, count) in sums.items()}
        sums.clear()
        if means:
            self._publish(means, update_callback_metrics=True)
        return means

    def discard(self, stage: str) -> None:
        """Forget what ``stage`` logged without publishing it (the sanity check, prediction)."""
        self.epoch_sums[stage].clear()
        self.step_values.clear()

    def _publish(self, metrics: dict[str, torch.Tensor], update_callback_metrics: bool) -> None:
        trainer = self.trainer
        reduced = trainer.hook.reduce_metrics(trainer=trainer, metrics=metrics, op="mean")
        if update_callback_metrics:
            self.callback_metrics.update(reduced)
        names = list(reduced)
        values = torch.stack([reduced[n].float().reshape(()) for n in names]).tolist()
        trainer.hook.log_metrics(trainer=trainer, metrics=dict(zip(names, values)),
                                 step=trainer.global_step)

    def progress_values(self) -> dict[str, float]:
        """The ``prog_bar`` metrics as numbers: the latest published values, and the running
        means of the epoch values the stage under way has logged so far (a host sync: call at
        a bounded rate)."""
        shown = {n: self.callback_metrics[n] for n in self.prog_bar if n in self.callback_metrics}
        for name, (total, count) in self.epoch_sums.get(self.trainer.stage, {}).items():
            if name in self.prog_bar:
                shown[name] = total / count
        if not shown:
            return {}
        names = list(shown)
        values = torch.stack([shown[n].detach().float().reshape(()).cpu() for n in names]).tolist()
        return dict(zip(names, values))
