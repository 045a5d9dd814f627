"""Logged metrics: kept as tensors on the device, turned into numbers only when published.

The names and aggregation follow Lightning's ``self.log``:

- ``on_step`` publishes the latest value at the next publish point (every
  ``log_every_n_steps`` steps); ``on_epoch`` aggregates over the epoch (or evaluation pass) with
  ``reduce_fx`` (``"mean"``, weighted by the batch size; ``"sum"``, ``"max"``, ``"min"``) and
  publishes at its end. With both, the logger receives ``NAME_step`` and ``NAME_epoch``, and
  ``callback_metrics`` holds ``NAME`` (the latest of the two) and ``NAME_epoch`` (plus
  ``NAME_step`` in training), so ``monitor="NAME"`` matches either way.
- Defaults: ``on_step=True, on_epoch=False`` in training steps and the per-batch hooks of
  training; ``on_step=False, on_epoch=True`` in validation and test steps and in the epoch-level
  hooks (``on_epoch_metrics``, Lightning's ``on_*_epoch_end``).
- The batch size of a mean is ``batch_size`` if given, else read from the batch under way (the
  first dimension of its first tensor), as Lightning does: a short last batch weighs less.
- A ``torchmetrics.Metric`` (anything with ``update``, ``compute`` and ``reset``) logged as the
  value: its per-batch value on step; at epoch end ``compute()`` (it synchronises across
  processes itself) and ``reset()``.
- Every published value is reduced across processes (one collective per publish point and
  operation), whatever ``sync_dist`` says: a metric never differs between ranks.

Nothing here calls ``.item()``: :meth:`MetricStore.publish_step` and :meth:`publish_epoch`
convert once per publish point, for every metric together.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from ptrain.errors import ModelError

if TYPE_CHECKING:
    from ptrain.trainer import Trainer

#: reduce_fx -> (how two running values combine, the reduce_metrics op across processes)
_REDUCTIONS: dict[str, tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], str]] = {
    "mean": (torch.add, "mean"), "sum": (torch.add, "sum"),
    "max": (torch.maximum, "max"), "min": (torch.minimum, "min"),
}
_FX_NAMES = {torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min"}


def _reduce_fx_name(reduce_fx: Any, name: str) -> str:
    fx = _FX_NAMES.get(reduce_fx, reduce_fx)
    if fx not in _REDUCTIONS:
        raise ModelError(f"self.log({name!r}, ..., reduce_fx={reduce_fx!r}): the epoch "
                         f"aggregate must be one of {', '.join(_REDUCTIONS)} (or torch.mean, "
                         f"torch.sum, torch.max, torch.min).")
    return fx


def _is_metric_object(value: Any) -> bool:
    return all(callable(getattr(value, m, None)) for m in ("update", "compute", "reset"))


def batch_size_of(batch: Any) -> int | None:
    """The first dimension of the first tensor found in ``batch`` (tensors, lists, tuples and
    dicts, depth first); ``None`` when it holds no tensor with a dimension."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() > 0 else None
    children = batch.values() if isinstance(batch, dict) else (
        batch if isinstance(batch, (list, tuple)) else ())
    for child in children:
        size = batch_size_of(child)
        if size is not None:
            return size
    return None


#: the attribute that marks a copy :meth:`MetricStore.own_values` made (a copy owns its memory)
OWNED = "_ptrain_owned_copy"


class MetricStore:
    """What ``TrainModule.log`` records during one stage, and what callbacks read.

    ``epoch_sums[stage][name]`` is ``[running value (tensor), weight, reduce_fx]``: for
    ``"mean"`` a weighted sum and the sum of the weights (batch sizes), else the running sum,
    max or min and the number of values. It is saved in checkpoints, so a resumed epoch's means
    include the batches before the interruption.
    """

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.step_values: dict[str, torch.Tensor] = {}  # training, until the next publish
        self.eval_step_values: dict[str, torch.Tensor] = {}  # evaluation, until its pass ends
        self.epoch_sums: dict[str, dict[str, list[Any]]] = {
            stage: {} for stage in ("train", "validate", "test", "predict")}
        self.epoch_objects: dict[str, dict[str, Any]] = {  # torchmetrics objects, per stage
            stage: {} for stage in ("train", "validate", "test", "predict")}
        self.prog_bar: set[str] = set()
        self.not_logged: set[str] = set()  # logger=False: callback_metrics only
        self.forked: dict[str, str] = {}  # NAME_step / NAME_epoch -> NAME
        self.callback_metrics: dict[str, torch.Tensor] = {}
        self.logged_metrics: dict[str, float] = {}  # the latest values sent to the loggers
        self.batch: Any = None  # the batch under way (for batch sizes), set by model_step
        self._epoch_level = False

    def own_values(self) -> None:
        """Replace each tensor the store holds that is not already a copy made here with a copy
        of it (one small device copy per value logged since the last call; a tensor held under
        several names is copied once).

        For plugins whose step outputs live in memory that a later step overwrites: CUDA graphs
        replay every step into the same buffers, so a value logged in one step would otherwise
        read as the next step's (torch raises instead). Such a plugin calls this after each
        step; the store itself never copies."""
        copies: dict[int, torch.Tensor] = {}

        def owned(value: Any) -> Any:
            if not isinstance(value, torch.Tensor) or getattr(value, OWNED, False):
                return value
            copy = copies.get(id(value))
            if copy is None:
                copy = copies[id(value)] = value.clone()
                setattr(copy, OWNED, True)
            return copy

        for values in (self.step_values, self.eval_step_values, self.callback_metrics):
            for name, value in values.items():
                values[name] = owned(value)
        for sums in self.epoch_sums.values():
            for entry in sums.values():
                entry[0] = owned(entry[0])

    @contextlib.contextmanager
    def epoch_level(self) -> Iterator[None]:
        """Within: ``log`` defaults to ``on_step=False, on_epoch=True`` in every stage (the
        epoch-level hooks)."""
        previous, self._epoch_level = self._epoch_level, True
        try:
            yield
        finally:
            self._epoch_level = previous

    def log(self, name: str, value: Any, prog_bar: bool = False, on_step: bool | None = None,
            on_epoch: bool | None = None, logger: bool = True, reduce_fx: Any = "mean",
            batch_size: int | None = None) -> None:
        stage = self.trainer.stage
        if stage == "predict":
            raise ModelError(f"self.log({name!r}, ...) was called in predict_step, where nothing "
                             f"is logged: return the value from predict_step instead (it is in "
                             f"what Trainer.predict returns).")
        per_step = stage == "train" and not self._epoch_level
        on_step = per_step if on_step is None else on_step
        on_epoch = (not per_step) if on_epoch is None else on_epoch
        if not (on_step or on_epoch):
            raise ModelError(f"self.log({name!r}, ..., on_step=False, on_epoch=False) would "
                             f"record nothing; set on_step=True (each step) or on_epoch=True "
                             f"(the epoch's aggregate).")
        fx = "mean" if reduce_fx == "mean" else _reduce_fx_name(reduce_fx, name)
        metric_object = None
        if isinstance(value, torch.Tensor):  # the usual case first: no more checks per call
            value = value.detach()
            if value.numel() != 1:
                raise ModelError(f"self.log({name!r}, ...) got a tensor of shape "
                                 f"{tuple(value.shape)}; log one number (a 0-dim or one-element "
                                 f"tensor), e.g. its .mean().")
        elif _is_metric_object(value):
            metric_object = value
            value = getattr(metric_object, "_forward_cache", None) if on_step else None
            if on_step and value is None:
                raise ModelError(f"self.log({name!r}, metric, on_step=True) needs the metric's "
                                 f"value for this batch: call metric(preds, target) (its "
                                 f"forward) before logging it, not only metric.update(...).")
        else:
            try:
                value = torch.tensor(float(value), device=self.trainer.device)
            except (TypeError, ValueError):
                raise ModelError(f"self.log({name!r}, ...) got a {type(value).__qualname__}; "
                                 f"log a number, a one-element tensor or a torchmetrics "
                                 f"Metric.") from None
        forked = on_step and on_epoch
        step_name, epoch_name = (f"{name}_step", f"{name}_epoch") if forked else (name, name)
        if forked:
            self.forked[step_name] = self.forked[epoch_name] = name
        if prog_bar:
            self.prog_bar.add(step_name)
            self.prog_bar.add(epoch_name)
        if not logger:
            self.not_logged.add(step_name)
            self.not_logged.add(epoch_name)
        if on_step:
            if stage == "train":
                self.step_values[step_name] = value
                self.callback_metrics[step_name] = value
                if forked:
                    self.callback_metrics[name] = value
            else:  # published with the pass's epoch values (the latest batch's)
                self.eval_step_values[step_name] = value
        if on_epoch:
            if metric_object is not None:
                self.epoch_objects[stage][epoch_name] = metric_object
                return
            self._accumulate(stage, epoch_name, value, fx, batch_size)

    def _accumulate(self, stage: str, name: str, value: torch.Tensor, fx: str,
                    batch_size: int | None) -> None:
        weight = 1
        if fx == "mean":
            weight = batch_size if batch_size is not None else (batch_size_of(self.batch) or 1)
        value = value.float().reshape(())
        sums = self.epoch_sums[stage]
        entry = sums.get(name)
        if entry is None:
            sums[name] = [value * weight if fx == "mean" else value, weight, fx]
            return
        if len(entry) > 2 and entry[2] != fx:
            raise ModelError(f"self.log({name!r}, ...) was called with reduce_fx={fx!r} after "
                             f"reduce_fx={entry[2]!r} in the same epoch; log one name with one "
                             f"reduce_fx.")
        combine = _REDUCTIONS[fx][0]
        entry[0] = combine(entry[0], value * weight if fx == "mean" else value)
        entry[1] += weight

    def preview_epoch(self, stage: str) -> None:
        """Put ``stage``'s epoch aggregates so far into ``callback_metrics``, as this process
        sees them (not yet reduced across processes; :meth:`publish_epoch` replaces them), so
        the epoch-end hooks read the epoch's values. Tensor arithmetic only: no host sync."""
        for name, entry in self.epoch_sums[stage].items():
            fx = entry[2] if len(entry) > 2 else "mean"
            value = entry[0] / entry[1] if fx == "mean" else entry[0]
            self.callback_metrics[name] = value
            if name in self.forked and name.endswith("_epoch"):
                self.callback_metrics[self.forked[name]] = value

    def publish_step(self) -> None:
        """Reduce and write the latest step values (a publish point: every process calls it)."""
        if self.step_values:
            self._publish({n: (v, "mean") for n, v in self.step_values.items()},
                          update_callback_metrics=False)
            self.step_values.clear()

    def publish_epoch(self, stage: str) -> dict[str, torch.Tensor]:
        """Aggregate, reduce and write ``stage``'s epoch values; they join ``callback_metrics``
        (a forked ``NAME_epoch`` also as ``NAME``)."""
        values: dict[str, tuple[torch.Tensor, str]] = {}
        for name, entry in self.epoch_sums[stage].items():
            total, weight = entry[0], entry[1]
            fx = entry[2] if len(entry) > 2 else "mean"
            values[name] = (total / weight if fx == "mean" else total, _REDUCTIONS[fx][1])
        self.epoch_sums[stage].clear()
        for name, metric in self.epoch_objects[stage].items():
            values[name] = (torch.as_tensor(metric.compute()).detach(), None)  # synced itself
            metric.reset()
        self.epoch_objects[stage].clear()
        if stage != "train":
            steps = {n: (v, "mean") for n, v in self.eval_step_values.items()}
            self.eval_step_values.clear()
            if steps:
                self._publish(steps, update_callback_metrics=False)
        if not values:
            return {}
        reduced = self._publish(values, update_callback_metrics=True)
        for name, value in reduced.items():
            if name in self.forked and name.endswith("_epoch"):
                self.callback_metrics[self.forked[name]] = value
        return reduced

    def discard(self, stage: str) -> None:
        """Forget what ``stage`` logged without publishing it (the sanity check, prediction)."""
        self.epoch_sums[stage].clear()
        for metric in self.epoch_objects[stage].values():
            metric.reset()
        self.epoch_objects[stage].clear()
        self.step_values.clear()
        self.eval_step_values.clear()

    def _publish(self, values: dict[str, tuple[torch.Tensor, str | None]],
                 update_callback_metrics: bool) -> dict[str, torch.Tensor]:
        trainer = self.trainer
        reduced: dict[str, torch.Tensor] = {}
        by_op: dict[str | None, dict[str, torch.Tensor]] = {}
        for name, (value, op) in values.items():
            by_op.setdefault(op, {})[name] = value
        for op, metrics in by_op.items():  # one collective per operation
            reduced.update(metrics if op is None else
                           trainer.hook.reduce_metrics(trainer=trainer, metrics=metrics, op=op))
        if update_callback_metrics:
            self.callback_metrics.update(reduced)
        names = [n for n in reduced if n not in self.not_logged]
        if names:
            numbers = dict(zip(names, torch.stack([reduced[n].float().reshape(())
                                                   for n in names]).tolist()))
            self.logged_metrics.update(numbers)
            trainer.hook.log_metrics(trainer=trainer, metrics=numbers, step=trainer.global_step)
        return reduced

    def progress_values(self) -> dict[str, float]:
        """The ``prog_bar`` metrics as numbers: the latest published values, and the running
        means of the epoch values the stage under way has logged so far (a host sync: call at
        a bounded rate)."""
        shown = {n: self.callback_metrics[n] for n in self.prog_bar if n in self.callback_metrics}
        for name, entry in self.epoch_sums.get(self.trainer.stage, {}).items():
            if name in self.prog_bar:
                fx = entry[2] if len(entry) > 2 else "mean"
                shown[name] = entry[0] / entry[1] if fx == "mean" else entry[0]
        if not shown:
            return {}
        names = list(shown)
        values = torch.stack([shown[n].detach().float().reshape(()).cpu() for n in names]).tolist()
        return dict(zip(names, values))
