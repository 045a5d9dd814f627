"""``lightning.pytorch.tuner``'s ``Tuner`` over ptrain's finders (``ptrain-finders``).

``Tuner(trainer).lr_find(model, ...)`` runs ptrain's ``lr-finder`` (the LR range test, real
steps through the run's hooks, then every state put back exactly) in a fit of its own with the
trainer's settings, its learning rates spaced as Lightning's and its losses smoothed as
Lightning smooths them, and returns Lightning's result object: ``results`` (``{"lr": [...],
"loss": [...]}``), ``suggestion()`` (Lightning's rule: the steepest descent of the smoothed loss
against the learning rate), ``plot()``. ``scale_batch_size`` runs ptrain's
``batch-size-finder`` likewise and sets the attribute the dataloader hooks read. Neither trains:
the model comes back with its weights, and the trainer runs your ``fit`` afterwards, as in
Lightning. The search runs in a scratch folder, so it adds no run folder.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ptrain.errors import ConfigError
from ptrain.lightning._common import refuse

__all__ = ["Tuner"]

#: Lightning's smoothing of the LR finder's losses (the weight of the past)
_BETA = 0.98


class _LRFinder:
    """The result of :meth:`Tuner.lr_find` (Lightning's): ``results["lr"]`` holds the learning
    rate of each step of the test and ``results["loss"]`` its smoothed loss."""

    def __init__(self, mode: str, lr_min: float, lr_max: float, num_training: int) -> None:
        self.mode, self.lr_min, self.lr_max = mode, lr_min, lr_max
        self.num_training = num_training
        self.results: dict[str, list[float]] = {}
        self._total_batch_idx = 0
        self._optimal_idx: int | None = None

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The learning rate where the smoothed loss falls fastest against the learning rate,
        leaving out the first ``skip_begin`` and last ``skip_end`` points and non-finite losses
        (Lightning's rule); ``None`` with fewer than two points left."""
        import torch

        end = len(self.results.get("loss", [])) - skip_end
        kept = [i for i in range(skip_begin, end) if math.isfinite(self.results["loss"][i])]
        if len(kept) < 2:
            self._optimal_idx = None
            return None
        losses = torch.tensor([self.results["loss"][i] for i in kept], dtype=torch.float64)
        lrs = torch.tensor([self.results["lr"][i] for i in kept], dtype=torch.float64)
        slopes = torch.gradient(losses, spacing=[lrs])[0]
        self._optimal_idx = kept[int(torch.argmin(slopes))]
        return self.results["lr"][self._optimal_idx]

    def plot(self, suggest: bool = False, show: bool = False, ax: Any = None) -> Any:
        """The smoothed loss against the learning rate (log axis for the exponential test), the
        suggestion marked with ``suggest=True``; the matplotlib figure (``None`` with ``ax``
        given)."""
        import matplotlib.pyplot as plt

        figure = None
        if ax is None:
            figure, ax = plt.subplots()
        ax.plot(self.results["lr"], self.results["loss"])
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        if suggest:
            lr = self.suggestion()
            if self._optimal_idx is not None:
                ax.plot(lr, self.results["loss"][self._optimal_idx], markersize=10, marker="o",
                        color="red")
        if show:
            plt.show()
        return figure


def _smooth_as_lightning(losses: list[float], threshold: float | None) -> list[float]:
    """Lightning's smoothed losses of the steps, up to the step where it would have stopped:
    a moving average with weight 0.98 on the past, bias-corrected with the step counted from 1
    (so the first point's correction is ``1 - 0.98**2``), stopping after the first step past
    the first two whose smoothed loss exceeds ``threshold`` times the lowest before it."""
    smoothed, average, best = [], 0.0, 0.0
    for step, loss in enumerate(losses, start=1):
        average = _BETA * average + (1 - _BETA) * loss
        value = average / (1 - _BETA ** (step + 1))
        stop = threshold is not None and step > 1 and value > threshold * best
        if value < best or step == 1:
            best = value
        smoothed.append(value)
        if stop:
            break
    return smoothed


def _holders(model: Any, name: str) -> list[Any]:
    """Where attribute ``name`` lives, as Lightning looks for it: the model, its ``hparams``,
    the datamodule of its trainer and that one's ``hparams``."""
    holders = []
    for owner in (model, getattr(getattr(model, "_trainer", None), "datamodule", None)):
        if owner is None:
            continue
        if hasattr(owner, name):
            holders.append(owner)
        hparams = getattr(owner, "hparams", None)
        if hparams is not None and name in hparams:
            holders.append(hparams)
    return holders


def _is_datamodule(value: Any) -> bool:
    from ptrain.module import DataModule

    return isinstance(value, DataModule)


def _from_rank_zero(value: Any) -> Any:
    """Process 0's ``value`` on every process of this program's process group; ``value`` itself
    where there is no group of several processes (one process, or the search ran in worker
    processes that are gone)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _set(holder: Any, name: str, value: Any) -> None:
    if isinstance(holder, dict):
        holder[name] = value
    else:
        setattr(holder, name, value)


class Tuner:
    """Lightning's tuner for ``trainer``: :meth:`lr_find` and :meth:`scale_batch_size`, each a
    search that runs before your ``fit`` with the trainer's settings (accelerator, strategy,
    precision, accumulation, limits) and leaves the model as it found it, except for the
    attribute it sets."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    # -- the search run ------------------------------------------------------------------------

    def _search(self, finder: Any, model: Any, train_dataloaders: Any, val_dataloaders: Any,
                datamodule: Any, data_file: str) -> dict[str, Any]:
        """Fit ``model`` with ``finder`` (``then="stop"``) in a trainer like this one, with no
        other callback, no logger, no checkpoint and no sanity check, in a scratch folder; what
        the finder wrote (``data_file``, by global rank 0, also from worker processes)."""
        import ptrain.lightning as pl
        from ptrain.trainer import Trainer as NativeTrainer

        scratch = Path(tempfile.mkdtemp(prefix="ptrain-tuner-"))
        # the Tuner says what it sets, as Lightning's does; the finder's line would name its
        # own suggestion and a plot in the scratch folder, deleted when the search returns
        finder.prints = False
        try:
            given = dict(self._trainer._init_kwargs)
            if isinstance(self._trainer, pl.Trainer):
                given.update(callbacks=[finder, "no:results"], logger=False,
                             enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0, default_root_dir=str(scratch),
                             profiler=None, fast_dev_run=False)
                search = pl.Trainer(**given)
            elif isinstance(self._trainer, NativeTrainer):
                given.update(callbacks=[finder, "no:checkpoint", "no:tensorboard",
                                        "no:progress-bar", "no:results",
                                        "no:model-summary"],
                             num_sanity_val_steps=0, default_root_dir=str(scratch))
                search = NativeTrainer(**given)
            else:
                raise ConfigError(f"Tuner needs a ptrain.lightning.Trainer (or a ptrain.Trainer), "
                                  f"got {type(self._trainer).__name__}.")
            search.fit(model, train_dataloaders=train_dataloaders,
                       val_dataloaders=val_dataloaders, datamodule=datamodule)
            # rank 0 wrote the file, in its own scratch folder (on its own node, maybe); in a
            # job whose every process runs this program, the others take its contents
            written = next(scratch.rglob(data_file), None) if search.global_rank == 0 else None
            data = _from_rank_zero(json.loads(written.read_text()) if written else None)
            if data is None:
                raise ConfigError(f"the tuner's search wrote no {data_file}; it ran no search "
                                  f"(a resumed finder, or the run stopped before setup).")
            # the optimizer steps one epoch has (known in this process unless workers ran it)
            batches = getattr(search, "num_training_batches", None)
            if isinstance(batches, int):
                data["steps_per_epoch"] = math.ceil(batches / search.accumulate_grad_batches)
            return data
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    @staticmethod
    def _check_method(method: str, dataloaders: Any, what: str, fit_only: bool) -> None:
        if method not in ("fit", "validate", "test", "predict"):
            raise ConfigError(f"method {method!r} is not one of 'fit', 'validate', 'test', "
                              f"'predict'.")
        if method != "fit" and fit_only:
            raise refuse(f"Tuner.{what}", "method", method,
                         "ptrain's finders search with training steps, so only method='fit' "
                         "is there; for an evaluation batch size, try sizes with "
                         "trainer.validate on a few batches")
        if method == "fit" and dataloaders is not None:
            raise ConfigError(f"Tuner.{what}(method='fit') takes train_dataloaders and "
                              f"val_dataloaders, not dataloaders (that is for the other "
                              f"methods).")

    # -- the learning rate ---------------------------------------------------------------------

    def lr_find(self, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None,
                dataloaders: Any = None, datamodule: Any = None, method: str = "fit",
                min_lr: float = 1e-8, max_lr: float = 1, num_training: int = 100,
                mode: str = "exponential", early_stop_threshold: float | None = 4.0,
                update_attr: bool = True, attr_name: str = "") -> _LRFinder | None:
        """The LR range test: ``num_training`` optimizer steps on training batches (no more
        than the trainer's ``max_epochs`` hold, as in Lightning), step ``k`` at ``min_lr *
        (max_lr / min_lr) ** ((k + 1) / num_training)`` as in Lightning (whose first step runs
        at ``min_lr`` itself), every param group at its ratio to the first group (Lightning:
        all at that rate), stopping once the smoothed loss exceeds ``early_stop_threshold``
        times its lowest (``None``: never). With ``update_attr`` the
        suggestion is set on the model's ``lr`` or ``learning_rate`` (or ``attr_name``; in the
        model or its ``hparams``). ``None`` under ``fast_dev_run``, as in Lightning.
        ``mode="linear"`` is refused: ptrain's test spaces the rates exponentially."""
        from ptrain_finders import LRFinder

        self._check_method(method, dataloaders, "lr_find", fit_only=True)
        if mode != "exponential":
            raise refuse("Tuner.lr_find", "mode", mode,
                         "ptrain's LR range test spaces the learning rates exponentially; use "
                         "mode='exponential'")
        if _is_datamodule(train_dataloaders):  # lr_find(model, datamodule) positionally
            train_dataloaders, datamodule = None, train_dataloaders
        if getattr(self._trainer, "fast_dev_run", False):
            import warnings

            warnings.warn("Skipping learning rate finder since `fast_dev_run` is enabled.",
                          stacklevel=2)
            return None
        names = [attr_name] if attr_name else ["lr", "learning_rate"]
        holders = next(((n, h) for n in names if (h := _holders(model, n))), None)
        if update_attr and holders is None:
            raise AttributeError(
                f"When using the learning rate finder either rename your attribute to `lr` or "
                f"`learning_rate`, or pass attr_name= naming it; {type(model).__name__} has "
                f"{' or '.join(names)} neither as an attribute nor in its hparams.")
        if num_training < 3:
            raise refuse("Tuner.lr_find", "num_training", num_training,
                         "test at least 3 learning rates")
        # Lightning's step k >= 1 runs at min_lr * q ** (k + 1), q = (max_lr / min_lr) **
        # (1 / num_training); ptrain's test spaces its rates evenly from its min_lr to its max_lr
        first = min_lr * (max_lr / min_lr) ** (1 / num_training)
        finder = LRFinder(min_lr=first, max_lr=max_lr, num_steps=num_training,
                          diverge_factor=math.inf, smoothing=0.0, then="stop")
        # Lightning's test runs epochs of a fit, validating between them
        finder.validates_between_passes = True
        # the rates as Lightning computes them (the same numbers up to rounding otherwise)
        finder.rate_of_step = lambda k: min_lr * (max_lr / min_lr) ** ((k + 1) / num_training)
        data = self._search(finder, model, train_dataloaders, val_dataloaders, datamodule,
                            "lr_finder.json")
        losses = data["losses"]
        epochs = self._trainer._init_kwargs.get("max_epochs")
        if isinstance(epochs, int) and epochs > 0 and "steps_per_epoch" in data:
            # Lightning's test runs within the trainer's max_epochs: no more steps than those
            losses = losses[:epochs * data["steps_per_epoch"]]
        losses = _smooth_as_lightning(losses, early_stop_threshold)
        result = _LRFinder(mode, min_lr, max_lr, num_training)
        result.results = {"lr": data["lrs"][:len(losses)], "loss": losses}
        result._total_batch_idx = len(losses)
        if update_attr:
            lr = result.suggestion()
            if lr is not None:
                name, found = holders
                for holder in found:
                    _set(holder, name, lr)
                from ptrain.lightning.utilities.rank_zero import rank_zero_info

                rank_zero_info(f"Learning rate set to {lr}")
        return result

    # -- the batch size ------------------------------------------------------------------------

    def scale_batch_size(self, model: Any, train_dataloaders: Any = None,
                         val_dataloaders: Any = None, dataloaders: Any = None,
                         datamodule: Any = None, method: str = "fit", mode: str = "power",
                         steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
                         batch_arg_name: str = "batch_size", margin: float = 0.05,
                         max_val: int = 8192) -> int | None:
        """The largest training batch size that fits in memory, set on ``batch_arg_name`` (in
        the model, its ``hparams``, the datamodule or its ``hparams``: each place that has it)
        and returned. Trials of ``steps_per_trial`` steps from ``init_val``, doubling up to
        ``max_trials`` sizes and ``max_val`` (and the samples a process sees per epoch).
        ``mode="power"``: the largest doubled size that fit; ``"binsearch"``: then bisected
        towards the first that did not, less ``margin``. ``None`` under ``fast_dev_run``."""
        from ptrain_finders import BatchSizeFinder

        self._check_method(method, dataloaders, "scale_batch_size", fit_only=True)
        if mode not in ("power", "binsearch"):
            raise ValueError(f"`mode` should be either 'power' or 'binsearch', got {mode!r}")
        if train_dataloaders is not None and not _is_datamodule(train_dataloaders):
            raise ConfigError("The batch size finder cannot be used with dataloaders passed "
                              "directly to fit: the size it finds is set on an attribute that "
                              "your train_dataloader() reads. Build the loader in the "
                              "LightningModule or LightningDataModule.")
        if train_dataloaders is not None:
            train_dataloaders, datamodule = None, train_dataloaders
        if getattr(self._trainer, "fast_dev_run", False):
            import warnings

            warnings.warn("Skipping batch size scaler since `fast_dev_run` is enabled.",
                          stacklevel=2)
            return None
        holders = _holders(model, batch_arg_name)
        if datamodule is not None:
            holders += [h for h in (datamodule, getattr(datamodule, "hparams", None))
                        if h is not None and (batch_arg_name in h if isinstance(h, dict)
                                              else hasattr(h, batch_arg_name))]
        if not holders:
            raise ConfigError(f"Field {batch_arg_name} not found in `model`, `datamodule`, nor "
                              f"their `hparams` attributes.")
        if not 0 <= margin < 1:
            raise ValueError(f"`margin` should be within [0, 1), got {margin}")
        finder = BatchSizeFinder(init=min(init_val, max_val), max_batch_size=max_val,
                                 steps_per_trial=steps_per_trial,
                                 margin=1.0 if mode == "power" else 1.0 - margin,
                                 max_growth=max(2, 2 ** (max_trials - 1)), then="stop")
        data = self._search(finder, model, None, val_dataloaders, datamodule,
                            "batch_size_finder.json")
        size = data["batch_size"]
        if mode == "power":  # the doubling phase's answer: the largest size before a failure
            doubled = []
            for trial in data["trials"]:
                if not trial["fits"]:
                    break
                doubled.append(trial["batch_size"])
            size = max(doubled) if doubled else data["batch_size"]
        for holder in holders:
            _set(holder, batch_arg_name, size)
        return size


#: modules here that Lightning's package has imported and that this one imports when first read
_SUBMODULES = ("tuning",)


def __getattr__(name: str) -> Any:
    from ptrain.lightning._common import submodule

    return submodule(__name__, name, _SUBMODULES)
