"""The loops that run the model without training it: validation, test, prediction, and the
sanity check of a few validation batches before ``fit`` trains.

Each runs the module in eval mode under ``torch.inference_mode`` (``torch.no_grad`` with the
trainer's ``inference_mode=False``) with the per-step ``transfer_batch`` and ``model_step``
hooks, like a training batch minus backward and optimizer step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

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


def _run_batches(trainer: Trainer, stage: str, loader: Any, num_batches: float) -> None:
    hooks = trainer.step_hooks
    for batch_idx, batch in enumerate(loader):
        if batch_idx >= num_batches:
            break
        batch = trainer.metrics.batch = hooks.transfer_batch(trainer=trainer, batch=batch)
        if hooks.has_on_batch_start:
            hooks.on_batch_start(trainer=trainer, stage=stage, batch=batch, batch_idx=batch_idx)
        outputs = hooks.model_step(trainer=trainer, stage=stage, batch=batch,
                                   batch_idx=batch_idx)
        hooks.on_evaluation_batch_end(trainer=trainer, stage=stage, outputs=outputs,
                                      batch=batch, batch_idx=batch_idx)


def _evaluation_pass(trainer: Trainer, stage: str, loader: Any, num_batches: float) -> None:
    """``on_loop_start``, the batches and ``on_epoch_metrics``, in eval mode under
    ``torch.no_grad`` (as Lightning runs its start and epoch-end hooks). The caller publishes
    and ends the loop."""
    trainer.num_eval_batches = num_batches
    with _EvalMode(trainer, stage):  # trainer.stage is the pass's from its first hook on
        trainer.hook.on_loop_start(trainer=trainer, loop=stage)
        _run_batches(trainer, stage, loader, num_batches)
        trainer.metrics.preview_epoch(stage)
        with trainer.metrics.epoch_level():
            trainer.hook.on_epoch_metrics(trainer=trainer, stage=stage)


def run_evaluation(trainer: Trainer, stage: str) -> None:
    """One pass of ``stage`` (``"validate"`` or ``"test"``) over its dataloader; the metrics it
    logged are averaged, reduced and published into ``callback_metrics``. A validation pass
    ends with ``on_validation_end``, then ``on_loop_end``."""
    loader = trainer.val_dataloader if stage == "validate" else trainer.test_dataloader
    num_batches = 0 if loader is None else stage_batches(trainer, stage, loader)
    if num_batches == 0:
        return
    _evaluation_pass(trainer, stage, loader, num_batches)
    trainer.metrics.publish_epoch(stage)
    if stage == "validate":
        trainer.hook.on_validation_end(trainer=trainer)
    trainer.hook.on_loop_end(trainer=trainer, loop=stage)


def run_validation(trainer: Trainer) -> None:
    """One validation pass over ``trainer.val_dataloader``, then ``on_validation_end``."""
    run_evaluation(trainer, "validate")


def run_sanity_check(trainer: Trainer) -> None:
    """Run the first ``num_sanity_val_steps`` validation batches (-1: all) before training, so a
    broken ``validation_step`` fails in seconds. The pass fires its loop and batch hooks with
    ``trainer.sanity_checking`` ``True``, but nothing is published, ``on_validation_end`` does
    not fire, and every random generator is left as it was, so the run trains exactly as
    without it."""
    steps = trainer.num_sanity_val_steps
    loader = trainer.val_dataloader
    if loader is None or steps == 0:
        return
    num_batches = stage_batches(trainer, "validate", loader)
    if steps > 0:
        num_batches = min(num_batches, steps)
    if num_batches == 0:
        return
    rng = checkpoint_io.capture_rng_states()  # iterating a DataLoader draws a base seed
    metrics = dict(trainer.callback_metrics)  # the epoch-end hooks' preview is not kept
    trainer.sanity_checking = True
    try:
        trainer.hook.on_loop_start(trainer=trainer, loop="sanity_check")
        _evaluation_pass(trainer, "validate", loader, num_batches)
        trainer.metrics.discard("validate")
        trainer.hook.on_loop_end(trainer=trainer, loop="validate")
        trainer.hook.on_loop_end(trainer=trainer, loop="sanity_check")
    finally:
        trainer.sanity_checking = False
        trainer.metrics.discard("validate")
        trainer.callback_metrics.clear()
        trainer.callback_metrics.update(metrics)
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


def to_cpu(value: Any) -> Any:
    """``value`` with every tensor in it detached and on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def run_prediction(trainer: Trainer) -> list[Any] | None:
    """One pass of ``predict_step`` over the predict dataloader. Each batch's output goes to
    ``on_evaluation_batch_end`` (a writer streams it to disk there); with ``return_predictions``
    the outputs are also kept (on the CPU) and returned, gathered from every process in
    dataset order (see :func:`gather_predictions`). ``trainer.batch_indices`` holds the dataset
    indices of the current batch where the loader's order is fixed, else ``None``."""
    loader = trainer.predict_dataloader
    num_batches = trainer.num_eval_batches = stage_batches(trainer, "predict", loader)
    keep = trainer.return_predictions
    hooks = trainer.step_hooks
    indices = _dataset_indices(loader)
    outputs: list[Any] = []
    batch_indices: list[list[int] | None] = []
    with _EvalMode(trainer, "predict"):
        trainer.hook.on_loop_start(trainer=trainer, loop="predict")
        for batch_idx, batch in enumerate(loader):
            if batch_idx >= num_batches:
                break
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
        trainer.hook.on_epoch_metrics(trainer=trainer, stage="predict")
    trainer.batch_indices = None
    trainer.metrics.discard("predict")
    if keep and trainer.world_size > 1:
        outputs = gather_predictions(trainer, outputs, batch_indices,
                                     getattr(loader, "batch_size", None))
    trainer.hook.on_loop_end(trainer=trainer, loop="predict")
    return outputs if keep else None


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
