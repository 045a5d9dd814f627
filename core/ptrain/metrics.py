"""Logged metrics: kept as tensors on the device, turned into numbers only when published.

The names and aggregation follow Lightning's ``self.log``:

- ``on_step`` publishes the latest value at the next publish point (every
  ``log_every_n_steps`` steps); ``on_epoch`` aggregates over the epoch (or evaluation pass) with
  ``reduce_fx`` (``"mean"``, weighted by the batch size; ``"sum"``, ``"max"``, ``"min"``; or
  ``torch.mean``, ``max``, ... and ``"avg"``, in any case, as Lightning reads them) and publishes
  at its end. With both, the logger receives ``NAME_step`` and ``NAME_epoch``, and
  ``callback_metrics`` holds ``NAME`` (the latest of the two) and ``NAME_epoch`` (plus
  ``NAME_step`` in training), so ``monitor="NAME"`` matches either way. Both off is an error
  (it would record nothing), as in Lightning.
- Defaults: ``on_step=True, on_epoch=False`` in training steps and the per-batch hooks of
  training; ``on_step=False, on_epoch=True`` in validation and test steps and in the epoch-level
  hooks (``on_epoch_metrics``, Lightning's ``on_*_epoch_end``).
- The batch size of a mean is ``batch_size`` if given, else read from the batch under way (the
  first dimension of its first tensor), as Lightning does: a short last batch weighs less.
- A ``torchmetrics.Metric`` (anything with ``update``, ``compute`` and ``reset``) logged as the
  value: its per-batch value on step; at epoch end ``compute()`` (it synchronises across
  processes itself) and ``reset()``, every logged metric computed before any is reset, as in
  Lightning (a composed metric, ``elbo = rec + kl``, resets the metrics it is made of).
- Every published value is reduced across processes with its ``reduce_fx`` (one collective per
  publish point and operation), whatever ``sync_dist`` says: a metric never differs between
  ranks.
- Several evaluation dataloaders (``trainer.dataloader_idx`` set while one of them runs): a name
  logged there gets ``/dataloader_idx_N``, as Lightning names it (``add_dataloader_idx=False``
  leaves it as logged); :attr:`MetricStore.results` then holds one dict per dataloader.

What is kept, as Lightning keeps it: :attr:`MetricStore.callback_metrics` (what callbacks
monitor), :attr:`MetricStore.logged_metrics` (the latest values sent to the loggers) and
:attr:`MetricStore.progress_bar` (the latest ``prog_bar`` values), all tensors.

Nothing here calls ``.item()``: :meth:`MetricStore.publish_step` and :meth:`publish_epoch`
convert once per publish point, for every metric together.
"""

from __future__ import annotations

import contextlib
import numbers
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from ptrain.errors import ConfigError, ModelError

if TYPE_CHECKING:
    from ptrain.trainer import Trainer

#: reduce_fx -> (how two running values combine, the reduce_metrics op across processes)
_REDUCTIONS: dict[str, tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], str]] = {
    "mean": (torch.add, "mean"), "sum": (torch.add, "sum"),
    "max": (torch.maximum, "max"), "min": (torch.minimum, "min"),
}
#: the functions Lightning takes as reduce_fx, by the name of their reduction
_FX_FUNCTIONS = {torch.mean: "mean", torch.sum: "sum", sum: "sum", torch.max: "max", max: "max",
                 torch.min: "min", min: "min"}
#: what a name logged under one of several evaluation dataloaders gets (Lightning's suffix)
DATALOADER_SUFFIX = "/dataloader_idx_{}"


def reduce_fx_name(reduce_fx: Any, name: str) -> str:
    """``reduce_fx`` as one of ``"mean"``, ``"sum"``, ``"max"``, ``"min"``: a name in any case
    (``"avg"`` is ``"mean"``), or ``torch.mean``/``sum``/``max``/``min`` (the builtins too)."""
    if isinstance(reduce_fx, str):
        fx = reduce_fx.lower()
        fx = "mean" if fx == "avg" else fx
    else:
        try:
            fx = _FX_FUNCTIONS.get(reduce_fx)
        except TypeError:  # unhashable
            fx = None
    if fx not in _REDUCTIONS:
        raise ConfigError(f"self.log({name!r}, ..., reduce_fx={reduce_fx!r}): the epoch "
                          f"aggregate must be one of 'mean', 'sum', 'max', 'min' (a name, or "
                          f"torch.mean, torch.sum, torch.max, torch.min). For another reduction, "
                          f"log a torchmetrics.Metric instead.")
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
        self.step_ops: dict[str, str] = {}  # a step value's reduction across processes
        self.epoch_sums: dict[str, dict[str, list[Any]]] = {
            stage: {} for stage in ("train", "validate", "test", "predict")}
        self.epoch_objects: dict[str, dict[str, Any]] = {  # torchmetrics objects, per stage
            stage: {} for stage in ("train", "validate", "test", "predict")}
        #: torchmetrics objects logged per step only, per stage: reset at the epoch's end too,
        #: as Lightning resets every logged metric there (their state would grow otherwise)
        self.step_objects: dict[str, dict[str, Any]] = {
            stage: {} for stage in ("train", "validate", "test", "predict")}
        self.prog_bar: set[str] = set()
        self.not_logged: set[str] = set()  # logger=False: callback_metrics only
        self.local: set[str] = set()  # rank_zero_only=True: not reduced across processes
        self.forked: dict[str, str] = {}  # NAME_epoch -> NAME (both on_step and on_epoch)
        self.forked_steps: dict[str, str] = {}  # NAME_step -> NAME
        self.loader_of: dict[str, int] = {}  # an epoch name -> the dataloader it was logged in
        self.callback_metrics: dict[str, torch.Tensor] = {}
        self.logged_metrics: dict[str, torch.Tensor] = {}  # the latest values sent to loggers
        self.progress_bar: dict[str, torch.Tensor] = {}  # the latest prog_bar values
        #: the last validation or test pass: per dataloader, the epoch values it logged for the
        #: loggers, as numbers (what ``validate``/``test`` return)
        self.results: list[dict[str, float]] = []
        self.batch: Any = None  # the batch under way (for batch sizes), set by model_step
        #: True while the ``log_metrics`` hook receives what the program logged (``self.log``),
        #: not another plugin's values (a monitor's learning rates): Lightning's loggers get
        #: ``epoch`` beside the former only
        self.publishing_logged = False
        self._epoch_level = False
        self._said_no_step_value: set[str] = set()

    def _no_step_value(self, name: str, on_epoch: bool) -> None:
        """Say once per name that a metric object logged per step was only ``update()``d, so it
        has no value for the batch and none is published for the step (Lightning publishes
        none either, without a word)."""
        if name in self._said_no_step_value:
            return
        self._said_no_step_value.add(name)
        kept = ("its epoch value is still published" if on_epoch else
                "nothing is published for it")
        warnings.warn(f"self.log({name!r}, metric) per step: the metric was only update()d, so "
                      f"it has no value for the batch and none is published for the step; "
                      f"{kept}. Call metric(preds, target) (its forward) instead of update() "
                      f"for a value per step, or log it with on_epoch=True for the epoch's.",
                      stacklevel=4)

    def reset(self) -> None:
        """Forget what an earlier stage published (a stage reports its own metrics only)."""
        self.callback_metrics.clear()
        self.logged_metrics.clear()
        self.progress_bar.clear()
        self.results = []

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

        for values in (self.step_values, self.eval_step_values, self.callback_metrics,
                       self.progress_bar):
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
            batch_size: int | None = None, add_dataloader_idx: bool = True,
            reduced: bool = True) -> None:
        """Record one value (see :meth:`ptrain.TrainModule.log` for the arguments);
        ``reduced=False``: published as this process has it, not reduced across processes."""
        stage = self.trainer.stage
        if stage == "predict":
            raise ModelError(f"self.log({name!r}, ...) was called in predict_step, where "
                             f"nothing is logged: return the value from predict_step instead "
                             f"(it is in what Trainer.predict returns).")
        per_step = stage == "train" and not self._epoch_level
        on_step = per_step if on_step is None else on_step
        on_epoch = (not per_step) if on_epoch is None else on_epoch
        if not (on_step or on_epoch):
            raise ConfigError(f"self.log({name!r}, ..., on_step=False, on_epoch=False) is not "
                              f"useful: it would record nothing. Set on_step=True (each step) "
                              f"or on_epoch=True (the epoch's aggregate).")
        fx = "mean" if reduce_fx == "mean" else reduce_fx_name(reduce_fx, name)
        metric_object = None
        if isinstance(value, torch.Tensor):  # the usual case first: no more checks per call
            value = value.detach()
            if hasattr(value, "full_tensor"):  # a DTensor (a loss under loss_parallel): whole
                value = value.full_tensor()
            if value.numel() != 1:
                raise ConfigError(f"self.log({name!r}, ...) got a tensor of shape "
                                  f"{tuple(value.shape)}; log one number (a 0-dim or "
                                  f"one-element tensor), e.g. its .mean().")
        elif isinstance(value, numbers.Number):
            # the default dtype, but no narrower than float32 (a true-precision step makes it
            # bfloat16 there): a logged number keeps its digits
            dtype = torch.get_default_dtype()
            value = torch.tensor(value, dtype=dtype if dtype == torch.float64 else torch.float32,
                                 device=self.trainer.device)
        elif _is_metric_object(value):
            metric_object = value
            if not on_epoch:
                self.step_objects[stage][name] = metric_object
            value = getattr(metric_object, "_forward_cache", None) if on_step else None
            if isinstance(value, torch.Tensor):  # its forward's result holds the step's graph
                value = value.detach()
            if on_step and value is None:  # only update()d: no value for this batch
                self._no_step_value(name, on_epoch)
                if not on_epoch:
                    return
        else:
            raise ConfigError(f"self.log({name!r}, {value!r:.60}) got a "
                              f"{type(value).__qualname__}, which can't be logged; log a "
                              f"number, a one-element tensor or a torchmetrics Metric (for "
                              f"several values, self.log_dict with one number each).")
        loader = self.trainer.dataloader_idx
        if add_dataloader_idx and DATALOADER_SUFFIX.format("") in name:
            raise ConfigError(f"self.log({name!r}, ...): the name already says which "
                              f"dataloader it comes from, which ptrain adds itself under "
                              f"several evaluation dataloaders; log it without "
                              f"'/dataloader_idx_N', or pass add_dataloader_idx=False.")
        suffix = DATALOADER_SUFFIX.format(loader) if loader is not None and add_dataloader_idx \
            else ""
        forked = on_step and on_epoch
        step_name, epoch_name = ((f"{name}_step{suffix}", f"{name}_epoch{suffix}") if forked
                                 else (name + suffix, name + suffix))
        if forked:
            self.forked[epoch_name] = self.forked_steps[step_name] = name + suffix
        if prog_bar:
            self.prog_bar.add(step_name)
            self.prog_bar.add(epoch_name)
        if not logger:
            self.not_logged.add(step_name)
            self.not_logged.add(epoch_name)
        if not reduced:
            self.local.add(step_name)
            self.local.add(epoch_name)
        if on_step and value is not None:
            if fx != "mean":
                self.step_ops[step_name] = fx
            if prog_bar:
                self.progress_bar[step_name] = value
            if stage == "train":
                self.step_values[step_name] = value
                self.callback_metrics[step_name] = value
                if forked:
                    self.callback_metrics[name + suffix] = value
            else:  # published with the pass's epoch values (the latest batch's)
                self.eval_step_values[step_name] = value
        if on_epoch:
            if loader is not None:
                self.loader_of[epoch_name] = loader
            if metric_object is not None:
                self.epoch_objects[stage][epoch_name] = metric_object
                return
            self._accumulate(stage, epoch_name, value, fx, batch_size)

    def _accumulate(self, stage: str, name: str, value: torch.Tensor, fx: str,
                    batch_size: int | None) -> None:
        weight = 1
        if fx == "mean":
            weight = batch_size if batch_size is not None else (batch_size_of(self.batch) or 1)
        value = _wide(value).reshape(())
        sums = self.epoch_sums[stage]
        entry = sums.get(name)
        if entry is None:
            sums[name] = [value * weight if fx == "mean" else value, weight, fx]
            return
        if len(entry) > 2 and entry[2] != fx:
            raise ConfigError(f"self.log({name!r}, ...) was called with reduce_fx={fx!r} after "
                              f"reduce_fx={entry[2]!r} in the same epoch; log one name with "
                              f"one reduce_fx.")
        combine = _REDUCTIONS[fx][0]
        entry[0] = combine(entry[0], value * weight if fx == "mean" else value)
        entry[1] += weight

    def preview_epoch(self, stage: str) -> None:
        """Put ``stage``'s epoch aggregates so far into ``callback_metrics``, as this process
        sees them (not yet reduced across processes; :meth:`publish_epoch` replaces them), so
        the epoch-end hooks read the epoch's values. Tensor arithmetic only: no host sync, but
        for a logged ``torchmetrics.Metric``, whose ``compute()`` runs here as in Lightning (it
        synchronises across processes itself and keeps its result for :meth:`publish_epoch`)."""
        values = {}
        for name, entry in self.epoch_sums[stage].items():
            fx = entry[2] if len(entry) > 2 else "mean"
            values[name] = entry[0] / entry[1] if fx == "mean" else entry[0]
        for name, metric in self.epoch_objects[stage].items():
            values[name] = torch.as_tensor(metric.compute()).detach()
        for name, value in values.items():
            self.callback_metrics[name] = value
            if name in self.forked:
                self.callback_metrics[self.forked[name]] = value

    def publish_step(self) -> None:
        """Reduce and write the latest step values (a publish point: every process calls it,
        with values or without: another may have some)."""
        if not self.step_values and self.trainer.world_size == 1:
            return
        reduced = self._publish({n: (v, self.step_ops.get(n, "mean"))
                                 for n, v in self.step_values.items()},
                                update_callback_metrics=False)
        self._step_values_to_callback_metrics(reduced)
        self.step_values.clear()

    def agree_step_values(self) -> None:
        """Under several processes: the training step values logged since the last publish
        point, reduced across the processes into ``callback_metrics`` as :meth:`publish_step`
        would reduce them, but neither logged nor cleared (the next publish point publishes
        them as usual). Between two publish points ``callback_metrics`` holds each process's
        own step values, so a decision taken there from them (the checkpoint callback's top-k
        at a step trigger) would differ between the processes. A collective: every process
        calls it at the same point."""
        if self.trainer.world_size == 1:
            return
        by_op: dict[str, dict[str, torch.Tensor]] = {}
        for name, value in self.step_values.items():
            if name not in self.local:  # rank_zero_only: as this process has it
                by_op.setdefault(self.step_ops.get(name, "mean"), {})[name] = value
        self._step_values_to_callback_metrics(self._reduce_across_ranks(by_op))

    def _step_values_to_callback_metrics(self, reduced: dict[str, torch.Tensor]) -> None:
        """Put the reduced step values into ``callback_metrics`` (under a forked name's
        ``NAME_step`` too), where no later value replaced the logged one."""
        callback = self.callback_metrics
        for name, value in reduced.items():
            logged = self.step_values.get(name)
            if logged is None:  # logged by other processes only
                callback[name] = value
                continue
            for key in (name, self.forked_steps.get(name)):
                if key is not None and callback.get(key) is logged:
                    callback[key] = value

    def publish_epoch(self, stage: str, dataloaders: int = 1) -> dict[str, torch.Tensor]:
        """Aggregate, reduce and write ``stage``'s epoch values; they join ``callback_metrics``
        (a forked ``NAME_epoch`` also as ``NAME``). After a validation or test pass (over
        ``dataloaders`` dataloaders), :attr:`results` holds what it logged for the loggers, per
        dataloader."""
        several = self.trainer.world_size > 1  # every process publishes: they agree on names
        values: dict[str, tuple[torch.Tensor, str | None]] = {}
        for name, entry in self.epoch_sums[stage].items():
            total, weight = entry[0], entry[1]
            fx = entry[2] if len(entry) > 2 else "mean"
            values[name] = (total / weight if fx == "mean" else total, _REDUCTIONS[fx][1])
        self.epoch_sums[stage].clear()
        objects = self.epoch_objects[stage]
        for name, metric in objects.items():
            values[name] = (torch.as_tensor(metric.compute()).detach(), None)  # synced itself
        for metric in objects.values():  # after every compute: resetting a composed metric
            metric.reset()  # (``a + b``) resets the metrics it is made of, logged or not
        objects.clear()
        self._reset_step_objects(stage)
        if stage != "train":
            steps = {n: (v, self.step_ops.get(n, "mean"))
                     for n, v in self.eval_step_values.items()}
            self.eval_step_values.clear()
            if steps or several:  # another process may have some
                self._publish(steps, update_callback_metrics=False)
        reduced = (self._publish(values, update_callback_metrics=True) if values or several
                   else {})
        for name, value in reduced.items():
            if name in self.forked:
                self.callback_metrics[self.forked[name]] = value
        if stage in ("validate", "test"):
            self.results = self._results(reduced, dataloaders)
        return reduced

    def _results(self, reduced: dict[str, torch.Tensor],
                 loaders: int) -> list[dict[str, float]]:
        """Per dataloader of the pass, the epoch values logged for the loggers: those logged
        under it, and those logged outside any (the epoch-end hooks); numbers."""
        logged = [n for n in reduced if n not in self.not_logged]
        numbers = self._numbers(reduced, logged)
        if loaders <= 1:
            return [numbers]
        return [{n: v for n, v in numbers.items() if self.loader_of.get(n, i) == i}
                for i in range(loaders)]

    def discard(self, stage: str) -> None:
        """Forget what ``stage`` logged without publishing it (the sanity check, prediction)."""
        self.epoch_sums[stage].clear()
        for metric in self.epoch_objects[stage].values():
            metric.reset()
        self.epoch_objects[stage].clear()
        self._reset_step_objects(stage)
        self.step_values.clear()
        self.eval_step_values.clear()

    def _reset_step_objects(self, stage: str) -> None:
        for metric in self.step_objects[stage].values():
            metric.reset()
        self.step_objects[stage].clear()

    @staticmethod
    def _numbers(values: dict[str, torch.Tensor], names: list[str]) -> dict[str, float]:
        if not names:
            return {}
        # one host copy for them all; stack promotes to float64 if any value is float64
        return dict(zip(names, torch.stack([_wide(values[n].detach()).reshape(())
                                            for n in names]).tolist()))

    def _publish(self, values: dict[str, tuple[torch.Tensor, str | None]],
                 update_callback_metrics: bool) -> dict[str, torch.Tensor]:
        trainer = self.trainer
        reduced: dict[str, torch.Tensor] = {}
        by_op: dict[str | None, dict[str, torch.Tensor]] = {}
        for name, (value, op) in values.items():
            by_op.setdefault(None if name in self.local else op, {})[name] = value
        reduced.update(by_op.pop(None, {}))  # rank_zero_only: this process's own
        if trainer.world_size > 1:
            reduced.update(self._reduce_across_ranks(by_op))
        else:
            for op, metrics in by_op.items():
                reduced.update(trainer.hook.reduce_metrics(trainer=trainer, metrics=metrics,
                                                           op=op))
        if update_callback_metrics:
            self.callback_metrics.update(reduced)
        self.progress_bar.update({n: v for n, v in reduced.items() if n in self.prog_bar})
        names = [n for n in reduced if n not in self.not_logged]
        if names:
            self.logged_metrics.update({n: reduced[n] for n in names})
            self.publishing_logged = True
            try:
                trainer.hook.log_metrics(trainer=trainer, metrics=self._numbers(reduced, names),
                                         step=trainer.global_step)
            finally:
                self.publishing_logged = False
        return reduced

    def _reduce_across_ranks(self, by_op: dict[str, dict[str, torch.Tensor]]
                             ) -> dict[str, torch.Tensor]:
        """Reduce each value across the processes, one collective per operation, in an order
        every process shares. The processes first agree on what they publish (names, their
        reductions and shapes: one small exchange per publish point, which needs the host
        anyway). A name only some processes logged (a value per class seen, a branch on the
        rank) is reduced over those that did, and published on every process; positions alone
        would have mixed other names' values into it, or left the processes in collectives of
        different sizes."""
        trainer = self.trainer
        mine = sorted((name, op, tuple(value.shape)) for op, metrics in by_op.items()
                      for name, value in metrics.items())
        views = trainer.hook.all_gather_object(trainer=trainer, obj=mine)
        if all(view == mine for view in views):  # the usual case: every process logged alike
            return {name: value for op in sorted(by_op) for name, value in
                    trainer.hook.reduce_metrics(trainer=trainer, op=op, metrics={
                        n: by_op[op][n] for n in sorted(by_op[op])}).items()}
        union: dict[str, tuple[str, tuple[int, ...], int]] = {}
        for rank, view in enumerate(views):
            for name, op, shape in view:
                seen = union.setdefault(name, (op, shape, rank))
                if seen[:2] != (op, shape):
                    raise ModelError(
                        f"{name!r} is logged with reduce_fx={seen[0]!r} and shape "
                        f"{list(seen[1])} on rank {seen[2]}, with reduce_fx={op!r} and shape "
                        f"{list(shape)} on rank {rank}: a value is reduced across the "
                        f"processes, so every process that logs it must log it alike.")
        logged = {name: value for metrics in by_op.values() for name, value in metrics.items()}
        reduced: dict[str, torch.Tensor] = {}
        for op in sorted({op for op, _, _ in union.values()}):
            names = sorted(n for n, (o, _, _) in union.items() if o == op)
            absent = {"max": -torch.inf, "min": torch.inf}.get(op, 0.0)
            values = {n: logged[n] if n in logged else torch.full(union[n][1], absent)
                      for n in names}
            if op != "mean":
                reduced.update(trainer.hook.reduce_metrics(trainer=trainer, metrics=values,
                                                           op=op))
                continue
            counts = {f"\0count {n}": torch.tensor(float(n in logged)) for n in names}
            summed = trainer.hook.reduce_metrics(trainer=trainer, metrics={**values, **counts},
                                                 op="sum")
            reduced.update({n: summed[n] / summed[f"\0count {n}"] for n in names})
        return reduced

    def progress_values(self) -> dict[str, float]:
        """The ``prog_bar`` metrics as numbers: the latest values (published, or logged on
        step), and the running means of the epoch values the stage under way has logged so far
        (a host sync: call at a bounded rate)."""
        shown = dict(self.progress_bar)
        for name, entry in self.epoch_sums.get(self.trainer.stage, {}).items():
            if name in self.prog_bar:
                fx = entry[2] if len(entry) > 2 else "mean"
                shown[name] = entry[0] / entry[1] if fx == "mean" else entry[0]
        if not shown:
            return {}
        names = list(shown)
        values = torch.stack([shown[n].detach().float().reshape(()).cpu() for n in names]).tolist()
        return dict(zip(names, values))


def _wide(value: torch.Tensor) -> torch.Tensor:
    """``value`` in the dtype its epoch aggregate is kept in: float64 stays float64 (a
    ``64-true`` step's values, which Lightning aggregates in float64 too), anything else is
    float32, so a half-precision value sums without losing digits."""
    return value.to(torch.float64 if value.dtype == torch.float64 else torch.float32)
