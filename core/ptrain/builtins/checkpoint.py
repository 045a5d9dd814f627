"""The ``checkpoint`` callback: the resumable ``last.ckpt`` and the top-k checkpoints of a run.

Files go to ``<run folder>/checkpoints/``, or to ``dirpath``. Lightning's ``ModelCheckpoint``
words and semantics, except where ptrain differs on purpose (docs/configuration.md lists every
difference):

- a checkpoint is *taken* at the end of every ``every_n_epochs``-th epoch (or, when the top-k is
  decided on validation metrics, after that epoch's validations), every ``every_n_train_steps``
  optimizer steps and every ``train_time_interval`` seconds; taking one writes a top-k file (see
  below) and, with ``save_last`` (on by default), ``last.ckpt``, which ``--ckpt-path last`` resumes;
- with a ``monitor``, the ``save_top_k`` files with the best values are kept (``-1``: all); a file
  that falls out of the top k is deleted only after the new one is written, by global rank 0;
- without a ``monitor``, ``save_top_k=1`` keeps the newest checkpoint, which is ``last.ckpt``
  itself unless ``save_last`` is off or a ``filename`` is given (no second copy is written);
  ``-1`` keeps every one; ``0`` none; ``best_model_path`` is the newest;
- a file this callback did not write is never overwritten: a name already taken in the folder
  (another run's, in a shared ``dirpath``) gets ``-v1``, ``-v2``...;
- ``save_weights_only``: the top-k files hold the weights only (``Trainer.save_checkpoint``'s
  ``weights_only``); the full state for an exact resume is still kept, in ``last.ckpt``
  (in the run folder's ``checkpoints/`` when ``save_last`` is off), and the run says where;
- ``--ckpt-path best`` (the ``resolve_ckpt_path`` hook) finds the best file of this callback, or of
  ``dirpath`` or the newest run folder under ``default_root_dir`` whose ``best_k_models.json``
  (written by global rank 0 whenever the top-k changes) records one; with a ``dirpath``,
  ``--ckpt-path last`` finds this callback's newest ``last*.ckpt`` there.

A write the system refuses (disk full, permission, quota) leaves the previous files intact and
either ends the run with :class:`ptrain.CheckpointWriteError` or, with ``on_write_error="warn"``,
says so in one line and trains on, the top-k as it was.

Every rank takes the same decisions: they depend only on ``trainer.callback_metrics`` (reduced
identically on every rank), the counters, and, for the time interval, a flag reduced across ranks.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from ptrain.config import to_seconds
from ptrain.checkpoint_io import write_failed
from ptrain.errors import CheckpointError, CheckpointWriteError, ConfigError
from ptrain.hookspecs import hookimpl
from ptrain.options import to_bool

#: The record of a run's top-k, next to its checkpoints; what ``ckpt_path="best"`` reads.
RECORD = "best_k_models.json"
LAST = "last.ckpt"
#: what a checkpoint write the system refuses does (``on_write_error``)
WRITE_ERROR_CHOICES = ("stop", "warn")
_FIELD = re.compile(r"\{([^{}:!]*)((?:![rsa])?(?::[^{}]*)?)\}")


def _duration(value: Any) -> float | None:
    """Seconds, from a number, ``"DD:HH:MM:SS"`` or a ``datetime.timedelta``; ``None`` stays."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    return to_seconds(value)


def _optional_bool(value: Any) -> bool | None:
    return None if value is None or value == "auto" else to_bool(value)


class ModelCheckpoint:
    """``-p checkpoint`` is on by default; ``ModelCheckpoint(monitor="val_loss", save_top_k=3)``
    given in ``Trainer(callbacks=[...])`` replaces the default one.

    Attributes, as in Lightning: ``best_model_path``, ``best_model_score``, ``best_k_models``
    (path -> score), ``kth_best_model_path``, ``kth_value``, ``last_model_path`` (paths as text;
    ``""`` until a file is written; scores as floats)."""

    name = "checkpoint"  # its entry point's name, also when given as an object

    def __init__(self, filename: str | None = None, monitor: str | None = None,
                 mode: str = "min", save_top_k: int = 1, save_last: bool = True,
                 every_n_epochs: int = 1, every_n_train_steps: int = 0,
                 train_time_interval: float | str | timedelta | None = None,
                 save_on_train_epoch_end: bool | None = None,
                 auto_insert_metric_name: bool = True, on_write_error: str = "stop",
                 dirpath: str | os.PathLike | None = None, save_weights_only: bool = False):
        if mode not in ("min", "max"):
            raise ConfigError(f"checkpoint mode {mode!r} is not valid; valid choices: min, max "
                              f"(whether a lower or a higher monitored value is better).")
        if not isinstance(save_last, bool):
            raise ConfigError(f"checkpoint save_last must be true or false, got {save_last!r} "
                              f"(ptrain writes last.ckpt as a file; it has no 'link' mode).")
        for option, value in (("save_top_k", save_top_k), ("every_n_epochs", every_n_epochs),
                              ("every_n_train_steps", every_n_train_steps)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"checkpoint {option} must be an integer, got {value!r}.")
        if on_write_error not in WRITE_ERROR_CHOICES:
            raise ConfigError(f"checkpoint on_write_error {on_write_error!r} is not valid; valid "
                              f"choices: stop (end the run with the error), warn (say so and "
                              f"train on).")
        if save_top_k < -1:
            raise ConfigError(f"checkpoint save_top_k={save_top_k} is not valid; use -1 (keep "
                              f"every checkpoint), 0 (none) or k >= 1 (the k best).")
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise ConfigError(
                f"checkpoint save_top_k={save_top_k} needs a monitor to rank the checkpoints by, "
                f"and none is set; without a monitor save_top_k may be -1 (keep all), 0 (none) "
                f"or 1 (the newest). Set monitor (--checkpoint-monitor, e.g. val_loss) or change "
                f"save_top_k (--checkpoint-save-top-k).")
        for option, value in (("every_n_epochs", every_n_epochs),
                              ("every_n_train_steps", every_n_train_steps)):
            if value < 0:
                raise ConfigError(f"checkpoint {option}={value} is not valid; use 0 (off) or a "
                                  f"positive count.")
        try:
            interval = _duration(train_time_interval)
        except ValueError as exc:
            raise ConfigError(f"checkpoint train_time_interval: {exc}; give seconds (3600) or "
                              f"DD:HH:MM:SS (\"00:01:00:00\").") from None
        if filename is not None:
            if not filename or filename.endswith(".ckpt") or _FIELD.sub("", filename) \
                    .count("{") or _FIELD.sub("", filename).count("}"):
                raise ConfigError(
                    f"checkpoint filename {filename!r} is not a valid template: give a name "
                    f"without the .ckpt extension, with fields in braces such as "
                    f"\"{{epoch}}-{{val_loss:.3f}}\" (fields: epoch, step, any logged metric).")
        self.filename, self.monitor, self.mode = filename, monitor, mode
        self.save_top_k, self.save_last = save_top_k, save_last
        self.every_n_epochs, self.every_n_train_steps = every_n_epochs, every_n_train_steps
        self.train_time_interval = interval
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.auto_insert_metric_name = auto_insert_metric_name
        self.on_write_error = on_write_error
        self.dirpath = None if dirpath is None else os.fspath(dirpath)  # the folder once a fit
        self._given_dirpath = self.dirpath  # began; None: the run folder's checkpoints/
        self.save_weights_only = bool(save_weights_only)

        self.best_model_path = ""
        self.best_model_score: float | None = None
        self.best_k_models: dict[str, float] = {}
        self.kth_best_model_path = ""
        self.kth_value = math.inf if mode == "min" else -math.inf
        self.last_model_path = ""
        self._last_step_saved = -1  # step of the last step/time-triggered checkpoint
        # (step, monitored value) of the last ranking: the same one is not ranked twice
        self._last_ranked: tuple[int, float | None] | None = None
        self._last_time_checked: float | None = None
        self._topk_on_epoch_end = True
        self._metrics_published = False  # a validation or an epoch ended in this fit
        self._writes = True  # False under fast_dev_run, which writes no checkpoint
        self._taken_on_disk: set[str] = set()  # files in the folder this callback did not write

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("filename", str,
                    help="name of the top-k files, a template: \"{epoch}-{val_loss:.3f}\" gives "
                         "epoch=3-val_loss=0.123.ckpt (default: {epoch}-{step})")
        options.add("monitor", str, help="the logged metric that ranks the top-k checkpoints")
        options.add("mode", str, default="min", choices=("min", "max"),
                    help="whether a lower or a higher monitored value is better")
        options.add("save_top_k", int, default=1,
                    help="keep the k best checkpoints (-1: all, 0: none); without a monitor only "
                         "-1, 0 or 1 (the newest)")
        options.add("save_last", to_bool, default=True,
                    help="write the resumable last.ckpt each time a checkpoint is taken")
        options.add("every_n_epochs", int, default=1,
                    help="take a checkpoint at the end of every n-th epoch (0: never)")
        options.add("every_n_train_steps", int, default=0,
                    help="also take one every n optimizer steps (0: never)")
        options.add("train_time_interval", to_seconds,
                    help="also take one every this long of training: seconds or DD:HH:MM:SS")
        options.add("save_on_train_epoch_end", _optional_bool,
                    help="decide the top-k at the end of the training epoch (true) or after "
                         "validation (false); default: at epoch end only when validation runs "
                         "once per epoch at its end, or not at all")
        options.add("auto_insert_metric_name", to_bool, default=True,
                    help="write filename fields as name=value (epoch=3) rather than the value")
        options.add("dirpath", str,
                    help="the folder for the checkpoint files (default: the run folder's "
                         "checkpoints/); a name another run left there is not overwritten")
        options.add("save_weights_only", to_bool, default=False,
                    help="top-k files with the weights only; the full state for an exact resume "
                         "stays in last.ckpt (the run folder's, when save_last is off)")
        options.add("on_write_error", str, default="stop", choices=WRITE_ERROR_CHOICES,
                    help="when a checkpoint can't be written (disk full, permission, quota): "
                         "stop the run with the error, or warn and train on; either way the "
                         "previous checkpoint stays intact")

    # -- when ------------------------------------------------------------------------------------

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        if stage != "fit":
            return
        self._writes = not trainer.fast_dev_run
        self._last_time_checked = time.monotonic()
        self._metrics_published = False
        if self._writes:
            self.dirpath = str(self._folder(trainer))
            self._taken_on_disk = self._names_left_by_others(trainer)
            if self.save_weights_only and trainer.is_global_zero:
                warnings.warn(
                    f"checkpoint save_weights_only=True: the top-k files in {self.dirpath} hold "
                    f"the weights only, as Lightning writes them; the full training state for "
                    f"an exact resume is kept in {self._full_state_path(trainer)} "
                    f"(ckpt_path='last' resumes from it).", stacklevel=2)
        if self.save_on_train_epoch_end is not None:
            self._topk_on_epoch_end = self.save_on_train_epoch_end
        else:  # as Lightning: after validation, unless it runs exactly once at each epoch end
            validates = trainer.val_dataloader is not None and trainer.limit_val_batches != 0
            interval = trainer.val_check_interval
            self._topk_on_epoch_end = not validates or (
                trainer.check_val_every_n_epoch == 1
                and isinstance(interval, float) and interval == 1.0)

    @hookimpl
    def unused_step_hooks(self) -> list[str] | None:
        # without step or time triggers nothing is saved mid-epoch: no call per step
        if not self.every_n_train_steps and self.train_time_interval is None:
            return ["on_train_batch_end"]
        return None

    @hookimpl
    def on_train_batch_end(self, trainer, batch, batch_idx, loss) -> None:  # all: see hook_calls
        # only where an optimizer step just happened: mid-window gradients are not saved
        if not trainer.sync_gradients:
            return
        step = trainer.global_step
        n = self.every_n_train_steps
        due = bool(n) and step % n == 0 and step != self._last_step_saved
        if not due and self.train_time_interval is not None and step != self._last_step_saved:
            due = self._time_due(trainer, step)
        if due:
            self._last_step_saved = step
            self._last_time_checked = time.monotonic()
            self._take(trainer, check_now=False)

    def _time_due(self, trainer, step: int) -> bool:
        elapsed = time.monotonic() - self._last_time_checked >= self.train_time_interval
        if trainer.world_size == 1:
            return elapsed
        # the ranks' clocks differ: agree on rank-independent steps only (the core's publish
        # cadence), so no collective runs on the other steps
        if step % trainer.log_every_n_steps != 0:
            return False
        flag = torch.tensor([float(elapsed)], device=trainer.device)
        reduced = trainer.hook.reduce_metrics(trainer=trainer, metrics={"due": flag}, op="max")
        return bool(reduced["due"].item())

    @hookimpl
    def on_validation_end(self, trainer) -> None:
        if trainer.stage != "train":
            return
        self._metrics_published = True
        if self._topk_on_epoch_end or not self._epoch_due(trainer):
            return
        self._save_topk(trainer, check_now=True)

    @hookimpl
    def on_epoch_end(self, trainer) -> None:
        self._metrics_published = True
        if not self._epoch_due(trainer):
            return
        if self._topk_on_epoch_end:
            self._save_topk(trainer, check_now=True)
        if self._keeps_last:  # always: its loop state (the next epoch) is new even at one step
            self._write_last(trainer)

    def _epoch_due(self, trainer) -> bool:
        n = self.every_n_epochs
        return bool(n) and (trainer.current_epoch + 1) % n == 0

    @property
    def _keeps_last(self) -> bool:
        """Whether the resumable full state is written: with ``save_last``, and always when the
        top-k files hold the weights only."""
        return self.save_last or self.save_weights_only

    def _take(self, trainer, check_now: bool) -> None:
        self._save_topk(trainer, check_now)
        if self._keeps_last:
            self._write_last(trainer)

    # -- what ------------------------------------------------------------------------------------

    def _folder(self, trainer) -> Path:
        if self._given_dirpath is not None:
            return Path(self._given_dirpath)
        return Path(trainer.log_dir) / "checkpoints"

    def _names_left_by_others(self, trainer) -> set[str]:
        """The checkpoint files in the folder now that this callback's state does not name
        (another run's, in a shared ``dirpath``): never overwritten. Listed by rank 0, so every
        rank names files alike."""
        if self._given_dirpath is None:  # the run folder's own: every file in it is this run's
            return set()
        names = None
        if trainer.is_global_zero:
            folder = self._folder(trainer)
            own = {Path(p).name for p in (*self.best_k_models, self.best_model_path,
                                          self.last_model_path) if p}
            names = sorted(p.name for p in folder.glob("*.ckpt") if p.name not in own) \
                if folder.is_dir() else []
        if trainer.world_size > 1:
            names = trainer.hook.all_gather_object(trainer=trainer, obj=names)[0]
        return set(names)

    def _full_state_path(self, trainer) -> Path:
        """Where the resumable ``last.ckpt`` goes: this callback's folder with ``save_last``, the
        run folder's otherwise (``save_weights_only`` keeps it without ``save_last``)."""
        if not self.save_last:
            return trainer.last_checkpoint_path
        stem, version, folder = "last", 0, self._folder(trainer)
        while f"{stem}.ckpt" in self._taken_on_disk:
            version += 1
            stem = f"last-v{version}"
        return folder / f"{stem}.ckpt"

    def _write_last(self, trainer) -> None:
        if not self._writes:
            return
        path = self._full_state_path(trainer)
        previous, self.last_model_path = self.last_model_path, str(path)  # part of the state
        if not self._save(trainer, path):
            self.last_model_path = previous

    def _save_topk(self, trainer, check_now: bool) -> None:
        """``check_now``: the metrics of the epoch or validation are all there (a monitor missing
        now was never logged). Otherwise (a step or time trigger) a monitor missing before the
        first validation or epoch end may still come: this trigger then writes only last.ckpt."""
        if self.save_top_k == 0 or not self._writes:
            return
        if self.monitor is None:
            if self.save_top_k == 1 and self.save_last and self.filename is None \
                    and not self.save_weights_only:
                # last.ckpt is the newest checkpoint: no second copy (the epoch end writes it)
                self.best_model_path = str(self._full_state_path(trainer))
                return
            if self._last_ranked == (trainer.global_step, None):
                return
            self._last_ranked = (trainer.global_step, None)
            path = self._unique(trainer, self._format(trainer), reuse=self.best_model_path)
            previous, self.best_model_path = self.best_model_path, path
            if not self._save(trainer, path, self.save_weights_only):
                self.best_model_path = previous
                return
            if self.save_top_k == 1 and previous and previous != path:
                self._remove(trainer, previous)
            return
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            message = (f"checkpoint monitor {self.monitor!r} was not logged; logged metrics: "
                       f"{', '.join(sorted(metrics)) or '(none)'}. Log it with "
                       f"self.log({self.monitor!r}, ...) or change --checkpoint-monitor.")
            if check_now or self._metrics_published:
                raise ConfigError(message)
            return  # a step or time trigger before the first validation: decided there
        score = float(metrics[self.monitor])
        if math.isnan(score):  # ranked as the worst possible value
            score = math.inf if self.mode == "min" else -math.inf
        # a step trigger and the epoch end at one step: ranked again only if the value changed
        # (an epoch-level training metric is published at the epoch's end)
        if self._last_ranked == (trainer.global_step, score):
            return
        self._last_ranked = (trainer.global_step, score)
        k = self.save_top_k
        full = k != -1 and len(self.best_k_models) >= k
        if full and not self._better(score, self.best_k_models[self.kth_best_model_path]):
            return
        dropped = self.kth_best_model_path if full else None
        ranking = (dict(self.best_k_models), self.best_model_path, self.best_model_score,
                   self.kth_best_model_path, self.kth_value)
        if dropped is not None:
            del self.best_k_models[dropped]
        path = self._unique(trainer, self._format(trainer), reuse=dropped)
        self.best_k_models[path] = score
        self._rank()
        if not self._save(trainer, path, self.save_weights_only):  # the top-k is as before
            (self.best_k_models, self.best_model_path, self.best_model_score,
             self.kth_best_model_path, self.kth_value) = ranking
            return
        if trainer.is_global_zero:
            self._write_record(trainer)
        if dropped is not None and dropped != path:
            self._remove(trainer, dropped)

    def _save(self, trainer, path: str | Path, weights_only: bool = False) -> bool:
        """Write a checkpoint to ``path``; ``False`` when the system refused the write and
        ``on_write_error`` is ``warn`` (said on stderr), else the refusal is raised. Under
        several processes every rank learns of a refusal on any (a barrier after the write)."""
        try:
            trainer.save_checkpoint(path, weights_only=weights_only)
        except CheckpointWriteError as exc:
            if self.on_write_error == "stop":
                raise CheckpointWriteError(
                    f"{exc} To warn and train on instead when a checkpoint can't be written, "
                    f"pass --checkpoint-on-write-error warn.") from None
            if trainer.is_global_zero:
                print(f"ptrain: warning: {exc} Training goes on (--checkpoint-on-write-error "
                      f"warn).", file=sys.stderr, flush=True)
            return False
        return True

    def _better(self, score: float, than: float) -> bool:
        return score < than if self.mode == "min" else score > than

    def _rank(self) -> None:
        models = self.best_k_models
        worst = max if self.mode == "min" else min
        best = min if self.mode == "min" else max
        self.best_model_path = best(models, key=models.get)
        self.best_model_score = models[self.best_model_path]
        if self.save_top_k == -1 or len(models) >= self.save_top_k:
            self.kth_best_model_path = worst(models, key=models.get)
            self.kth_value = models[self.kth_best_model_path]

    def _format(self, trainer) -> str:
        template = self.filename if self.filename is not None else "{epoch}-{step}"
        metrics = trainer.callback_metrics
        counters = {"epoch": trainer.current_epoch, "step": trainer.global_step}

        def field(match: re.Match) -> str:
            name, spec = match.group(1).strip(), match.group(2)
            if name in counters:
                value: Any = counters[name]
            elif name in metrics:
                value = float(metrics[name])
            else:
                raise ConfigError(
                    f"checkpoint filename {template!r} names {name!r}, which was not logged; "
                    f"fields can be epoch, step and the logged metrics: "
                    f"{', '.join(sorted(metrics)) or '(none)'}. Log it with self.log({name!r}, "
                    f"...) or change --checkpoint-filename.")
            text = f"{{0{spec}}}".format(value)
            return f"{name}={text}" if self.auto_insert_metric_name else text

        return _FIELD.sub(field, template)

    def _unique(self, trainer, stem: str, reuse: str | None) -> str:
        """The path for ``stem``; a name already kept (other than the one about to be replaced,
        ``reuse``) or ``last.ckpt`` gets ``-v1``, ``-v2``... Decided from this callback's state
        alone, so every rank picks the same name."""
        folder = self._folder(trainer)
        taken = set(self.best_k_models) | {str(folder / LAST)} | {
            str(folder / name) for name in self._taken_on_disk}
        if self.monitor is None and self.save_top_k == -1 and self.best_model_path:
            taken.add(self.best_model_path)
        candidate, version = str(folder / f"{stem}.ckpt"), 0
        while candidate in taken and candidate != reuse:
            version += 1
            candidate = str(folder / f"{stem}-v{version}.ckpt")
        return candidate

    def _remove(self, trainer, path: str) -> None:
        if not trainer.is_global_zero:
            return
        target = Path(path)
        if target.is_dir():  # a sharded checkpoint is a folder
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)

    def _write_record(self, trainer) -> None:
        folder = self._folder(trainer)
        record = {"monitor": self.monitor, "mode": self.mode,
                  "best_model_path": Path(self.best_model_path).name,
                  "best_model_score": self.best_model_score,
                  "best_k_models": {Path(p).name: s for p, s in self.best_k_models.items()}}
        tmp = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{RECORD}.", suffix=".tmp", dir=folder)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(record, f, indent=1)
            os.replace(tmp, folder / RECORD)
        except OSError as exc:  # the checkpoint itself was written: the record is told apart
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            error = write_failed(folder / RECORD, exc)
            if self.on_write_error == "stop":
                raise error from None
            print(f"ptrain: warning: {error} Training goes on (--checkpoint-on-write-error "
                  f"warn).", file=sys.stderr, flush=True)

    # -- ckpt_path="best" -------------------------------------------------------------------------

    @hookimpl
    def resolve_ckpt_path(self, trainer, ckpt_path: str) -> str | None:
        if ckpt_path == "last":
            return self._resolve_last()
        if ckpt_path != "best":
            return None
        if self.best_model_path and Path(self.best_model_path).exists():  # trained here
            return self.best_model_path
        from ptrain.trainer import run_folders

        root = Path(trainer.default_root_dir)
        folders = [run / "checkpoints" for run in run_folders(root)]
        if trainer.log_dir is not None:  # this trainer's own last run first (workers held state)
            folders.insert(0, Path(trainer.log_dir) / "checkpoints")
        if self._given_dirpath is not None:
            folders.insert(0, Path(self._given_dirpath))
        for folder in folders:
            record_path = folder / RECORD
            if not record_path.is_file():
                continue
            record = json.loads(record_path.read_text(encoding="utf-8"))
            best = record_path.parent / record["best_model_path"]
            if not best.exists():
                raise CheckpointError(
                    f"ckpt_path='best': {str(record_path)!r} names {str(best)!r} as the best "
                    f"checkpoint ({record['monitor']} = {record['best_model_score']}), but it is "
                    f"gone. Give a checkpoint's path instead, or 'last'.")
            return str(best)
        raise CheckpointError(
            f"ckpt_path='best' found no best checkpoint: no run folder under {str(root)!r} has a "
            f"checkpoints/{RECORD}, which the checkpoint callback writes only when it monitors a "
            f"metric. Train with --checkpoint-monitor (e.g. val_loss), or give a checkpoint's "
            f"path or 'last'.")

    def _resolve_last(self) -> str | None:
        """With a ``dirpath``: the ``last.ckpt`` this callback wrote, else the newest
        ``last*.ckpt`` in ``dirpath`` (none there: a :class:`CheckpointError`); ``None`` (the
        run folders' ``last.ckpt``) without a ``dirpath``."""
        if self._given_dirpath is None:
            return None
        if self.last_model_path and Path(self.last_model_path).exists():
            return self.last_model_path
        candidates = sorted(Path(self._given_dirpath).glob("last*.ckpt"),
                            key=lambda p: p.stat().st_mtime)
        if not candidates:
            raise CheckpointError(
                f"ckpt_path='last' found no last*.ckpt in the checkpoint callback's dirpath "
                f"{self._given_dirpath!r} (it writes one there when save_last is on); give a "
                f"checkpoint's path, or start without ckpt_path.")
        return str(candidates[-1])

    # -- state -----------------------------------------------------------------------------------

    @hookimpl
    def state_dict(self, trainer) -> dict[str, Any]:
        """Paths are stored relative to the run's checkpoint folder, so a run folder can move."""
        folder = self._folder(trainer)

        def rel(path: str) -> str:
            return os.path.relpath(path, folder) if path else ""

        return {"monitor": self.monitor, "mode": self.mode,
                "best_model_path": rel(self.best_model_path),
                "best_model_score": self.best_model_score,
                "best_k_models": {rel(p): s for p, s in self.best_k_models.items()},
                "kth_best_model_path": rel(self.kth_best_model_path),
                "kth_value": self.kth_value,
                "last_model_path": rel(self.last_model_path)}

    @hookimpl
    def load_state_dict(self, trainer, state: dict[str, Any]) -> None:
        """A resumed run continues the same top-k (in its run folder, where ptrain resumes) when
        it monitors the same metric the same way; otherwise it starts a new top-k."""
        if state.get("monitor") != self.monitor or state.get("mode") != self.mode:
            return
        folder = self._folder(trainer)

        def full(path: str) -> str:
            return str(folder / path) if path else ""

        self.best_model_path = full(state["best_model_path"])
        self.best_model_score = state["best_model_score"]
        self.best_k_models = {full(p): s for p, s in state["best_k_models"].items()}
        self.kth_best_model_path = full(state["kth_best_model_path"])
        self.kth_value = state["kth_value"]
        self.last_model_path = full(state["last_model_path"])
