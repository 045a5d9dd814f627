"""The loops that run the model without training it: validation, test, prediction, and the
sanity check of a few validation batches before ``fit`` trains.

Each runs the module in eval mode under ``torch.inference_mode`` (``torch.no_grad`` with the
trainer's ``inference_mode=False``) with the per-step ``transfer_batch`` and ``model_step``
hooks, like a training batch minus backward and optimizer step.

A stage may have several dataloaders (a list, tuple or dict of DataLoaders from
``val_dataloader()`` and the like, or given to the stage): they run one after the other in one
pass, as in Lightning, each up to its own limit. While one of them runs,
``trainer.dataloader_idx`` is its index (``None`` with a single dataloader); the step method
and the Lightning-named batch hooks receive it as their ``dataloader_idx`` argument, and names
logged there get ``/dataloader_idx_N`` (see :mod:`ptrain.metrics`).
"""

from __future__ import annotations

import copy
import itertools
import math
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, SequentialSampler

from ptrain import checkpoint_io
from ptrain.errors import ConfigError, ModelError

if TYPE_CHECKING:
    from ptrain.trainer import Trainer

#: stage -> the trainer option that limits its batches
LIMITS = {"train": "limit_train_batches", "validate": "limit_val_batches",
          "test": "limit_test_batches", "predict": "limit_predict_batches"}


def limit_batches(total: float, limit: int | float) -> float:
    """How many of ``total`` batches a limit keeps: an int counts batches, a float is a
    fraction (``math.inf`` for a loader without a length stays so under a fraction)."""
    if isinstance(limit, float):
        return total if limit == 1.0 else (math.inf if math.isinf(total) else int(total * limit))
    return min(total, limit)


def loader_length(loader: Any) -> float:
    try:
        return len(loader)
    except TypeError:  # an IterableDataset without __len__
        return math.inf


def stage_batches(trainer: Trainer, stage: str, loader: Any) -> float:
    return limit_batches(loader_length(loader), getattr(trainer, LIMITS[stage]))


class SeveralLoaders(list):
    """The dataloaders of one evaluation stage when it has several, in the order they run;
    ``names`` are the keys of the dict they were given as (else ``None``)."""

    def __init__(self, loaders: list[Any], names: list[Any] | None = None):
        super().__init__(loaders)
        self.names = names


def several_loaders(value: Any) -> tuple[list[Any], list[Any] | None] | None:
    """``(loaders, names)`` when ``value`` is a list, tuple or dict of DataLoaders (several
    dataloaders for one evaluation stage, the dict's keys as names), else ``None``."""
    if isinstance(value, dict):
        loaders, names = list(value.values()), list(value)
    elif isinstance(value, (list, tuple)):
        loaders, names = list(value), None
    else:
        return None
    if not loaders or not all(isinstance(x, DataLoader) for x in loaders):
        return None
    return loaders, names


def loaders_of(loader: Any) -> list[Any]:
    """The dataloaders a stage runs, in order: those of :class:`SeveralLoaders`, else
    ``loader`` alone (none for ``None``)."""
    if loader is None:
        return []
    return list(loader) if isinstance(loader, SeveralLoaders) else [loader]


def check_dataloader_idx(trainer: Trainer, stage: str, count: int) -> None:
    """A module whose step method can't take ``dataloader_idx`` under several dataloaders, or
    requires it under one, is a :class:`ModelError` naming the fix (as Lightning refuses
    both), raised before the first batch."""
    from ptrain.step_module import STEP_METHODS, takes_dataloader_idx

    module = trainer.module
    method_name = STEP_METHODS[stage]
    method = getattr(module, method_name, None)
    if method is None:
        return
    takes, required = takes_dataloader_idx(method)
    where = f"{type(module).__qualname__}.{method_name}"
    if count > 1 and not takes:
        raise ModelError(f"the {stage} stage has {count} dataloaders, but {where} takes no "
                         f"dataloader_idx argument to tell their batches apart; add it: "
                         f"def {method_name}(self, batch, batch_idx, dataloader_idx=0).")
    if count == 1 and required:
        raise ModelError(f"the {stage} stage has one dataloader, but {where} requires a "
                         f"dataloader_idx argument, which is given only under several; give "
                         f"it a default (dataloader_idx=0) or remove it.")


class _EvalMode:
    """Eval mode and no autograd (inference mode, or ``no_grad`` with
    ``trainer.inference_mode`` off) for the whole model, with ``trainer.stage`` set; restores
    every submodule's own mode (a frozen part may be in eval mode on purpose) on leaving."""

    def __init__(self, trainer: Trainer, stage: str):
        self.trainer, self.stage = trainer, stage

    def __enter__(self) -> None:
        t = self.trainer
        self.modes = [(m, m.training) for m in t.model.modules()]
        self.no_grad = torch.inference_mode() if t.inference_mode else torch.no_grad()
        self.no_grad.__enter__()
        try:
            t.hook.evaluation_mode(trainer=t, stage=self.stage)  # model.eval(), by default
        except BaseException:
            self.no_grad.__exit__(None, None, None)
            raise
        self.previous_stage, t.stage = t.stage, self.stage

    def __exit__(self, *exc: Any) -> None:
        self.no_grad.__exit__(*exc)
        for module, mode in self.modes:
            module.training = mode
        self.trainer.stage = self.previous_stage


def first_batches(loader: Any, num_batches: float) -> Iterator[tuple[int, Any]]:
    """``(batch_idx, batch)`` of the first ``num_batches`` batches of ``loader``, fetching no
    batch past them: one fetched and dropped would load data and draw random numbers for
    nothing (a transform's crops), so the rest of the run would draw other ones than Lightning's,
    which fetches none."""
    return enumerate(loader if math.isinf(num_batches)
                     else itertools.islice(loader, int(num_batches)))


def _run_batches(trainer: Trainer, stage: str, loader: Any, num_batches: float) -> None:
    hooks = trainer.step_hooks
    for batch_idx, batch in first_batches(loader, num_batches):
        batch = trainer.metrics.batch = hooks.transfer_batch(trainer=trainer, batch=batch)
        if hooks.has_on_batch_start:
            hooks.on_batch_start(trainer=trainer, stage=stage, batch=batch, batch_idx=batch_idx)
        outputs = hooks.model_step(trainer=trainer, stage=stage, batch=batch,
                                   batch_idx=batch_idx)
        hooks.on_evaluation_batch_end(trainer=trainer, stage=stage, outputs=outputs,
                                      batch=batch, batch_idx=batch_idx)


def _each_loader(trainer: Trainer, loaders: list[Any],
                 counts: list[float]) -> Iterator[tuple[Any, float]]:
    """``(loader, batches)`` of each dataloader that runs batches, with
    ``trainer.dataloader_idx`` and ``trainer.num_eval_batches`` set for it (the index only
    under several dataloaders); both are reset after the last."""
    several = len(loaders) > 1
    try:
        for index, (loader, count) in enumerate(zip(loaders, counts)):
            if count == 0:
                continue
            trainer.dataloader_idx = index if several else None
            trainer.num_eval_batches = count
            yield loader, count
    finally:
        trainer.dataloader_idx = None


def _evaluation_pass(trainer: Trainer, stage: str, loaders: list[Any],
                     counts: list[float]) -> None:
    """``on_loop_start``, the batches of each dataloader and ``on_epoch_metrics``, in eval
    mode under ``torch.no_grad`` (as Lightning runs its start and epoch-end hooks). The caller
    publishes and ends the loop."""
    check_dataloader_idx(trainer, stage, len(loaders))
    trainer.num_eval_batches = counts[0]
    with _EvalMode(trainer, stage):  # trainer.stage is the pass's from its first hook on
        trainer.hook.on_loop_start(trainer=trainer, loop=stage)
        for loader, count in _each_loader(trainer, loaders, counts):
            _run_batches(trainer, stage, loader, count)
        trainer.metrics.preview_epoch(stage)
        with trainer.metrics.epoch_level():
            trainer.hook.on_epoch_metrics(trainer=trainer, stage=stage)


def run_evaluation(trainer: Trainer, stage: str) -> None:
    """One pass of ``stage`` (``"validate"`` or ``"test"``) over its dataloader(s); the
    metrics it logged are averaged, reduced and published into ``callback_metrics``, and
    ``trainer.metrics.results`` holds them per dataloader. A validation pass ends with
    ``on_validation_end``, then ``on_loop_end``."""
    loaders = loaders_of(trainer.val_dataloader if stage == "validate"
                         else trainer.test_dataloader)
    counts = [stage_batches(trainer, stage, loader) for loader in loaders]
    if not any(counts):
        return
    _evaluation_pass(trainer, stage, loaders, counts)
    trainer.metrics.publish_epoch(stage, dataloaders=len(loaders))
    if stage == "validate":
        trainer.hook.on_validation_end(trainer=trainer)
    trainer.hook.on_loop_end(trainer=trainer, loop=stage)


def run_validation(trainer: Trainer) -> None:
    """One validation pass over ``trainer.val_dataloader``, then ``on_validation_end``."""
    run_evaluation(trainer, "validate")


def run_sanity_check(trainer: Trainer) -> None:
    """Run the first ``num_sanity_val_steps`` validation batches (-1: all) before training, so a
    broken ``validation_step`` fails in seconds. The pass fires its loop and batch hooks with
    ``trainer.sanity_checking`` ``True``, but nothing is published (the hooks that end the
    pass read its values in ``callback_metrics``, which are put back afterwards),
    ``on_validation_end`` does not fire, and every random generator is left as it was, so the
    run trains exactly as without it."""
    steps = trainer.num_sanity_val_steps
    loaders = loaders_of(trainer.val_dataloader)
    if not loaders or steps == 0:
        return
    counts = [stage_batches(trainer, "validate", loader) for loader in loaders]
    if steps > 0:
        counts = [min(count, steps) for count in counts]
    if not any(counts):
        return
    rng = checkpoint_io.capture_rng_states()  # iterating a DataLoader draws a base seed
    metrics = dict(trainer.callback_metrics)  # the epoch-end hooks' preview is not kept
    shown = dict(trainer.metrics.progress_bar)
    trainer.sanity_checking = True
    try:
        trainer.hook.on_loop_start(trainer=trainer, loop="sanity_check")
        _evaluation_pass(trainer, "validate", loaders, counts)
        # the pass's values, those its epoch-end hooks logged too, for the hooks that end it
        # (Lightning's on_validation_end and on_sanity_check_end read them); put back below
        trainer.metrics.preview_epoch("validate")
        trainer.metrics.discard("validate")
        trainer.hook.on_loop_end(trainer=trainer, loop="validate")
        trainer.hook.on_loop_end(trainer=trainer, loop="sanity_check")
    finally:
        trainer.sanity_checking = False
        trainer.metrics.discard("validate")
        trainer.callback_metrics.clear()
        trainer.callback_metrics.update(metrics)
        trainer.metrics.progress_bar.clear()
        trainer.metrics.progress_bar.update(shown)
        checkpoint_io.restore_rng_states(rng)


# -- prediction ------------------------------------------------------------------------------


def _dataset_indices(loader: Any) -> Iterator[list[int]] | None:
    """The dataset indices of each batch ``loader`` yields, where its order is fixed (a
    sequential sampler, or a distributed one that does not shuffle); else ``None``."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    if not isinstance(batch_sampler, BatchSampler):
        return None
    sampler = batch_sampler.sampler
    fixed = isinstance(sampler, SequentialSampler) or (
        isinstance(sampler, DistributedSampler) and not sampler.shuffle)
    return iter(batch_sampler) if fixed else None


def to_cpu(value: Any, plain: bool = False) -> Any:
    """``value`` with every tensor in it detached and on the CPU, each container of the type it
    had (a namedtuple, as pytorch-forecasting's models predict; an ``OrderedDict``, a
    ``defaultdict`` with its factory); with ``plain``, as a ``dict``, ``list`` or ``tuple``
    (a file of them loads with ``torch.load(weights_only=True)``, which refuses other
    classes)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        moved = {k: to_cpu(v, plain) for k, v in value.items()}
        if plain or type(value) is dict:
            return moved
        kept = copy.copy(value)  # a subclass's own state (defaultdict's factory) comes along
        kept.update(moved)
        return kept
    if isinstance(value, (list, tuple)):
        moved_items = [to_cpu(v, plain) for v in value]
        if plain:
            return tuple(moved_items) if isinstance(value, tuple) else moved_items
        if hasattr(value, "_fields"):  # a namedtuple takes its fields as arguments
            return type(value)(*moved_items)
        return type(value)(moved_items)
    return value


def run_prediction(trainer: Trainer) -> list[Any] | None:
    """One pass of ``predict_step`` over the predict dataloader(s). Each batch's output goes to
    ``on_evaluation_batch_end`` (a writer streams it to disk there); with ``return_predictions``
    the outputs are also kept (on the CPU) and returned, gathered from every process in
    dataset order (see :func:`gather_predictions`): a list of batch outputs, or under several
    dataloaders one such list per dataloader, as Lightning returns them.
    ``trainer.batch_indices`` holds the dataset indices of the current batch where the
    loader's order is fixed, else ``None``."""
    loaders = loaders_of(trainer.predict_dataloader)
    counts = [stage_batches(trainer, "predict", loader) for loader in loaders]
    keep = trainer.return_predictions
    kept: list[tuple[Any, list[Any], list[list[int] | None]]] = [(x, [], []) for x in loaders]
    check_dataloader_idx(trainer, "predict", len(loaders))
    trainer.num_eval_batches = counts[0]
    with _EvalMode(trainer, "predict"):
        trainer.hook.on_loop_start(trainer=trainer, loop="predict")
        for loader, count in _each_loader(trainer, loaders, counts):
            kept[trainer.dataloader_idx or 0] = (loader, *_predict_batches(trainer, loader,
                                                                             count, keep))
        trainer.hook.on_epoch_metrics(trainer=trainer, stage="predict")
    trainer.batch_indices = None
    trainer.metrics.discard("predict")
    results = []
    for loader, outputs, batch_indices in kept:
        if keep and trainer.world_size > 1:
            outputs = gather_predictions(trainer, outputs, batch_indices,
                                         getattr(loader, "batch_size", None))
        results.append(outputs)
    trainer.hook.on_loop_end(trainer=trainer, loop="predict")
    if not keep:
        return None
    return results if len(loaders) > 1 else (results[0] if results else [])


def _predict_batches(trainer: Trainer, loader: Any, num_batches: float,
                     keep: bool) -> tuple[list[Any], list[list[int] | None]]:
    hooks = trainer.step_hooks
    indices = _dataset_indices(loader)
    outputs: list[Any] = []
    batch_indices: list[list[int] | None] = []
    for batch_idx, batch in first_batches(loader, num_batches):
        trainer.batch_indices = next(indices) if indices is not None else None
        batch = hooks.transfer_batch(trainer=trainer, batch=batch)
        if hooks.has_on_batch_start:
            hooks.on_batch_start(trainer=trainer, stage="predict", batch=batch,
                                 batch_idx=batch_idx)
        output = hooks.model_step(trainer=trainer, stage="predict", batch=batch,
                                  batch_idx=batch_idx)
        hooks.on_evaluation_batch_end(trainer=trainer, stage="predict", outputs=output,
                                      batch=batch, batch_idx=batch_idx)
        if keep:
            outputs.append(to_cpu(output))
            batch_indices.append(trainer.batch_indices)
    return outputs, batch_indices


def _split(value: Any, n: int, where: str) -> list[Any]:
    """``value`` (a batch's output) as ``n`` per-sample outputs."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 or value.shape[0] != n:
            raise _ungatherable(f"{where} is a tensor of shape {tuple(value.shape)}, not one row "
                                f"per sample of a batch of {n}")
        return list(value.unbind(0))
    if isinstance(value, dict):
        parts = {k: _split(v, n, f"{where}[{k!r}]") for k, v in value.items()}
        return [{k: parts[k][i] for k in value} for i in range(n)]
    if isinstance(value, (list, tuple)):
        parts = [_split(v, n, f"{where}[{j}]") for j, v in enumerate(value)]
        return [type(value)(p[i] for p in parts) for i in range(n)]
    raise _ungatherable(f"{where} is a {type(value).__qualname__}")


def _merge(samples: list[Any]) -> Any:
    first = samples[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(samples)
    if isinstance(first, dict):
        return {k: _merge([s[k] for s in samples]) for k in first}
    return type(first)(_merge([s[j] for s in samples]) for j in range(len(first)))


def _ungatherable(what: str) -> ModelError:
    return ModelError(
        f"predict_step's output can't be gathered from the processes in dataset order: {what}. "
        f"Under several processes predict_step must return a tensor, or a dict/list/tuple of "
        f"tensors, whose first dimension is the batch; or stream the predictions to disk with "
        f"-p prediction-writer (Trainer.predict(..., return_predictions=False)).")


def gather_predictions(trainer: Trainer, outputs: list[Any],
                       batch_indices: list[list[int] | None],
                       batch_size: int | None) -> list[Any]:
    """Every process's predictions, in dataset order, without the samples a distributed sampler
    repeats to even out the ranks, re-batched as one process with a sequential loader of
    ``batch_size`` would have returned them. A collective: every process calls it."""
    if any(indices is None for indices in batch_indices):
        raise ConfigError(
            "predictions can't be put back in dataset order: the predict dataloader's order is "
            "not fixed (a shuffling or custom sampler, or an IterableDataset). Use a sequential "
            "predict dataloader, or stream the predictions to disk with -p prediction-writer "
            "(Trainer.predict(..., return_predictions=False)).")
    samples = []
    for indices, output in zip(batch_indices, outputs):
        samples.extend(zip(indices, _split(output, len(indices), "the output")))
    gathered = trainer.hook.all_gather_object(trainer=trainer, obj=samples)
    by_index: dict[int, Any] = {}
    for rank_samples in gathered:
        for index, sample in rank_samples:
            by_index.setdefault(index, sample)  # a padding repeat comes after the original
    ordered = [by_index[i] for i in sorted(by_index)]
    size = batch_size or (len(batch_indices[0]) if batch_indices else 1)
    return [_merge(ordered[i:i + size]) for i in range(0, len(ordered), size)]
