"""Everything a search changes, captured before it and put back after it, bit for bit.

A finder trains for real (the run's own step hooks), so it moves: the weights and buffers, the
gradients, the optimizer state and the param-group settings (the LR finder sets learning rates),
the random generators (dropout, shuffling), the trainer's counters, the metric store (the module
logs from ``training_step``), and the state other plugins keep per step (a loss scaler's scale).
:class:`TrainingSnapshot` copies all of that once and can restore it any number of times (the
batch-size finder restores after every trial).

A metric object (torchmetrics) that the search's steps logged first is reset and forgotten, so
the first epoch after the search counts its own batches only.

What it does not cover: Python attributes a module changes on itself in ``training_step``, and
state inside wrappers that is not tensors (DDP's reducer counters); neither affects the
numbers of the run that follows. Nor the inside of a metric object logged before the snapshot
was taken (a finder takes it before the stage's first training step, where none has been).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ptrain import checkpoint_io
from ptrain.loading import call_impl

#: Trainer attributes a training step changes.
COUNTERS = ("global_step", "current_epoch", "batch_idx", "sync_gradients", "should_stop")


def _clone(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)


def optimizers_to_snapshot(optimizer: torch.optim.Optimizer) -> list[torch.optim.Optimizer]:
    """``optimizer``, and the optimizer it delegates to when it is a wrapper that keeps its state
    in an inner one (``ZeroRedundancyOptimizer.optim`` holds this rank's partition)."""
    inner = getattr(optimizer, "optim", None)
    return [optimizer] + ([inner] if isinstance(inner, torch.optim.Optimizer) else [])


class _OptimizerState:
    """One optimizer's per-parameter state and param-group settings, as copies.

    Not ``state_dict()``: under ZeRO that is a gather onto rank 0 (others get nothing back to
    load), and ``load_state_dict`` would re-cast and re-create every tensor. Restoring in place
    keeps the state dict object and the param-group dicts the optimizer (and its schedulers)
    hold."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.state = {param: {k: _clone(v) for k, v in per_param.items()}
                      for param, per_param in optimizer.state.items()}
        self.groups = [{k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
                       for group in optimizer.param_groups]

    def restore(self) -> None:
        live = self.optimizer.state
        live.clear()
        for param, per_param in self.state.items():
            live[param] = {k: _clone(v) for k, v in per_param.items()}
        for group, saved in zip(self.optimizer.param_groups, self.groups):
            for key in [k for k in group if k != "params" and k not in saved]:
                del group[key]
            group.update(copy.deepcopy(saved))


class TrainingSnapshot:
    """A copy of the training state of ``trainer`` (see the module docstring); ``skip`` names the
    plugins whose own state is not to be captured (the finder itself)."""

    def __init__(self, trainer: Any, skip: tuple[Any, ...] = ()):
        self.trainer = trainer
        module = trainer.module
        self.tensors = [(t, t.detach().clone()) for _, t in
                        [*module.named_parameters(), *module.named_buffers()]]
        self.optimizers = [_OptimizerState(o) for opt in trainer.optimizers
                           for o in optimizers_to_snapshot(opt)]
        self.schedulers = [(entry["scheduler"], copy.deepcopy(entry["scheduler"].state_dict()))
                           for entry in trainer.lr_schedulers]
        self.rng = checkpoint_io.capture_rng_states()
        self.generators = [(g, g.get_state()) for g in _loader_generators(trainer)]
        self.counters = {name: getattr(trainer, name) for name in COUNTERS}
        self.loop_state = copy.deepcopy(trainer.loop_state)
        self.loss_window = list(trainer.loss_window)
        self.metrics = _metric_state(trainer.metrics)
        skipped = {id(p) for p in skip}
        self.plugins = []  # (load_state_dict impl, state) of every other stateful plugin
        loaders = {impl.plugin_name: impl for impl in trainer.hook.load_state_dict.get_hookimpls()}
        for impl in trainer.hook.state_dict.get_hookimpls():
            if id(impl.plugin) in skipped or impl.plugin_name not in loaders:
                continue
            state = call_impl(impl, trainer=trainer, checkpoint=None)
            if state is not None:
                self.plugins.append((loaders[impl.plugin_name], copy.deepcopy(state)))

    def restore(self) -> None:
        """Put everything back; gradients end up cleared (``None``), as before any step."""
        trainer = self.trainer
        with torch.no_grad():
            for live, saved in self.tensors:
                live.copy_(saved)
        for param in trainer.module.parameters():
            param.grad = None
        for state in self.optimizers:
            state.restore()
        for scheduler, saved in self.schedulers:
            scheduler.load_state_dict(copy.deepcopy(saved))
        checkpoint_io.restore_rng_states(self.rng)
        for generator, saved in self.generators:
            generator.set_state(saved)
        for name, value in self.counters.items():
            setattr(trainer, name, value)
        trainer.loop_state = copy.deepcopy(self.loop_state)
        trainer.loss_window = list(self.loss_window)
        _restore_metric_state(trainer.metrics, self.metrics)
        for impl, state in self.plugins:
            call_impl(impl, trainer=trainer, state=copy.deepcopy(state), checkpoint=None)


def _loader_generators(trainer: Any) -> list[torch.Generator]:
    """The generators a training dataloader draws its order from, when the user gave it some
    (``DataLoader(generator=...)``, a sampler's ``generator``): they advance with every pass."""
    loader = trainer.train_dataloader
    found = []
    for owner in (loader, getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None),
                  getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
            found.append(generator)
    return found


def _metric_state(store: Any) -> dict[str, Any]:
    return {"step_values": dict(store.step_values),
            "epoch_sums": {stage: {k: list(v) for k, v in sums.items()}
                           for stage, sums in store.epoch_sums.items()},
            "epoch_objects": {stage: dict(objects)
                              for stage, objects in store.epoch_objects.items()},
            "prog_bar": set(store.prog_bar),
            "callback_metrics": dict(store.callback_metrics)}


def _restore_metric_state(store: Any, saved: dict[str, Any]) -> None:
    store.step_values.clear()
    store.step_values.update(saved["step_values"])
    store.epoch_sums.clear()
    store.epoch_sums.update({stage: {k: list(v) for k, v in sums.items()}
                             for stage, sums in saved["epoch_sums"].items()})
    for stage, objects in store.epoch_objects.items():
        before = saved["epoch_objects"].get(stage, {})
        for name, metric in objects.items():
            if before.get(name) is not metric:  # logged by the search's steps: counts nothing
                metric.reset()
    store.epoch_objects.clear()
    store.epoch_objects.update({stage: dict(objects)
                                for stage, objects in saved["epoch_objects"].items()})
    store.prog_bar.clear()
    store.prog_bar.update(saved["prog_bar"])
    store.callback_metrics.clear()
    store.callback_metrics.update(saved["callback_metrics"])
