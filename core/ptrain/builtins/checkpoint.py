"""The ``checkpoint`` callback: the resumable ``last.ckpt`` and the top-k checkpoints of a run.

Files go to ``<run folder>/checkpoints/``, or to ``dirpath``. Lightning's ``ModelCheckpoint``
words and semantics, except where ptrain differs on purpose (docs/configuration.md lists every
difference):

- a checkpoint is *taken* at the end of every ``every_n_epochs``-th epoch (or, when the top-k is
  decided on validation metrics, after that epoch's validations), every ``every_n_train_steps``
  optimizer steps and every ``train_time_interval`` seconds; taking one writes a top-k file (see
  below) and, with ``save_last`` (on by default), ``last.ckpt``, which ``--ckpt-path last`` resumes.
  ``last.ckpt`` is also written after every top-k file, and at a due epoch end unless it was
  written at that step already (then it resumes into that epoch's end);
- ``save_last="link"``: ``last.ckpt`` is a symbolic link to the newest top-k file, made
  atomically (in a resumed run too: the file it resumed from is the newest); where the
  filesystem allows no links it is a copy (said once). With weights-only top-k files, or none
  written yet, it is written as a file;
- with a ``monitor``, the ``save_top_k`` files with the best values are kept (``-1``: all); a file
  that falls out of the top k is deleted only after the new one (and ``last.ckpt``) is written
  and ``best_k_models.json`` no longer names it, by global rank 0; the checkpoints written
  until then list it, so that a fit resumed after a kill in between deletes it. ``epoch`` and
  ``step`` can be monitored and named without being logged;
- without a ``monitor``, ``save_top_k=1`` keeps the newest checkpoint, which is ``last.ckpt``
  itself unless ``save_last`` is off or a ``filename`` is given (no second copy is written);
  ``-1`` keeps every one; ``0`` none; ``best_model_path`` is the newest;
- a file this callback did not write is never overwritten: a name already taken in the folder
  (another run's, in a shared ``dirpath``) gets ``-v1``, ``-v2``...; with
  ``enable_version_counter=False`` names are reused as given, and replacing another run's file
  is said once;
- ``save_weights_only``: the top-k files hold the weights only (``Trainer.save_checkpoint``'s
  ``weights_only``); the full state for an exact resume is still kept, in ``last.ckpt``
  (in the run folder's ``checkpoints/`` when ``save_last`` is off), and the run says where;
- ``save_on_exception``: when ``fit`` ends with an error (``KeyboardInterrupt`` included) and
  something was trained since the last save, the state at that moment is written under the
  top-k name (``filename`` formatted, ``-vN`` if taken), not ranked and not replacing
  ``last.ckpt``, which stays the last state written at a checkpoint point. Nothing is written
  after a non-finite loss (that state is not worth resuming), under ``fast_dev_run``, or under
  several processes (the others can't join a save after one failed); each is said;
- ``verbose``: a line per top-k decision, on global rank 0;
- ``--ckpt-path best`` (the ``resolve_ckpt_path`` hook) finds the best file of this callback, or of
  ``dirpath`` or the newest run folder under ``default_root_dir`` whose ``best_k_models.json``
  (written by global rank 0 whenever the top-k changes) records one; with a ``dirpath``,
  ``--ckpt-path last`` finds this callback's newest ``last*.ckpt`` there.

``async_save``: each checkpoint point's files are copied to host memory and written on a
background thread while training goes on (:mod:`ptrain.background_write`: for a save between two
steps, what only an optimizer step changes is copied on that thread too, before the next
optimizer step; should the next step's forward change it first, as ``nn.Embedding(max_norm=...)``
does, that checkpoint is said lost and taken again at the next step, and the run's later saves
copy everything first; where the run can't write in the background, it is said once and the
files are written as before). Every promise above holds: what replaces
or records a file (deleting the one it replaces, ``best_k_models.json``, the link of
``last.ckpt``) happens only once the file is complete; a refused write is found at the next
optimizer step at the latest, and then stops the run or, with ``on_write_error="warn"``, puts
the top-k back as it was; the next checkpoint point, the end of fit and a signal's save wait for
the write in flight.

A write the system refuses (disk full, permission, quota) leaves the previous files intact and
either ends the run with :class:`ptrain.CheckpointWriteError` or, with ``on_write_error="warn"``,
says so in one line and trains on, the top-k as it was.

Every rank takes the same decisions: they depend only on ``trainer.callback_metrics`` (reduced
identically on every rank: a checkpoint point reduces the step values logged since the last publish
point first), the counters, and, for the time interval, a flag reduced across ranks.
"""

from __future__ import annotations

import contextlib
import glob
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
from typing import Any, Callable, Iterator

import torch

from ptrain import replaced_files
from ptrain.config import to_seconds
from ptrain.checkpoint_io import _intact_checkpoint, new_file_mode, write_failed
from ptrain.errors import (ChangedBeforeCopiedError, CheckpointError, CheckpointWriteError,
                           ConfigError, NoCheckpointYetError, NonFiniteLossError)
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


def _save_last(value: Any) -> bool | str:
    """``save_last``: true, false or ``"link"``."""
    if isinstance(value, str) and value.strip().lower() == "link":
        return "link"
    try:
        return to_bool(value)
    except ValueError:
        raise ValueError(f"expected true, false or link (last.ckpt links to the newest top-k "
                         f"file), got {type(value).__name__} {value!r}") from None


def _yaml_number(value: float) -> str:
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    return repr(float(value))


def _identity(path: str | Path) -> tuple[int, int] | None:
    """A file's size and modification time (ns), a link's own; ``None`` where there is none."""
    try:
        found = os.lstat(path)
    except OSError:
        return None
    return found.st_size, found.st_mtime_ns


def _refusal_cause(error: CheckpointWriteError) -> str:
    """What tells two refused writes' causes apart: the rank named (several processes) and the
    system's error name, ``"rank 1: ENOSPC"`` (the message where it names none)."""
    text = str(error)
    rank = re.match(r"rank \d+: ", text)
    code = re.search(r"\((E[A-Z0-9]+)\)", text)
    return (rank.group(0) if rank else "") + code.group(1) if code else text


def _writes(n: int) -> str:
    return f"{n} write" + ("s" if n != 1 else "")


def link_or_copy(target: str | Path, link: str | Path) -> bool:
    """Make ``link`` a symbolic link to ``target`` (relative to the link's folder), replacing
    what is at ``link`` in one rename, so a reader finds the old or the new one, never none.
    Where the filesystem allows no symbolic link: a hard link, else a copy. Returns whether it
    is a link of either kind (``False``: a copy)."""
    target, link = Path(target), Path(link)
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.parent / f".{link.name}.{os.getpid()}.link"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    linked = True
    try:
        os.symlink(os.path.relpath(target, link.parent), tmp)
    except OSError:
        try:
            os.link(target, tmp)
        except OSError:
            shutil.copy2(target, tmp)
            linked = False
    if link.is_dir() and not link.is_symlink():  # a sharded checkpoint's folder
        shutil.rmtree(link)
    os.replace(tmp, link)
    return linked


class ModelCheckpoint:
    """``-p checkpoint`` is on by default; ``ModelCheckpoint(monitor="val_loss", save_top_k=3)``
    given in ``Trainer(callbacks=[...])`` replaces the default one.

    Attributes, as in Lightning: ``best_model_path``, ``best_model_score``, ``best_k_models``
    (path -> score), ``kth_best_model_path``, ``kth_value``, ``last_model_path`` (paths as text;
    ``""`` until a file is written; scores as floats), ``current_score`` (the monitored value of
    the last top-k decision) and ``dirpath`` (the folder, once a fit began). The names are made
    of Lightning's class attributes ``CHECKPOINT_JOIN_CHAR``, ``CHECKPOINT_EQUALS_CHAR``,
    ``CHECKPOINT_NAME_LAST`` (a template too: ``"last-{epoch}"``), ``FILE_EXTENSION`` and
    ``STARTING_VERSION``; a subclass may change them."""

    name = "checkpoint"  # its entry point's name, also when given as an object

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1
    #: A monitor that was never logged is a ConfigError at the first top-k decision; ``False``:
    #: in a fit that runs no validation (none given, or limited to 0 batches) it is said once
    #: and nothing is saved for it (``ptrain.lightning``'s class: Lightning's rule; darts
    #: monitors ``val_loss`` also when fitted without validation series)
    stops_on_unlogged_monitor_without_validation = True

    def __init__(self, filename: str | None = None, monitor: str | None = None,
                 mode: str = "min", save_top_k: int = 1, save_last: bool | str = True,
                 every_n_epochs: int = 1, every_n_train_steps: int = 0,
                 train_time_interval: float | str | timedelta | None = None,
                 save_on_train_epoch_end: bool | None = None,
                 auto_insert_metric_name: bool = True, on_write_error: str = "stop",
                 dirpath: str | os.PathLike | None = None, save_weights_only: bool = False,
                 save_on_exception: bool = False, enable_version_counter: bool = True,
                 verbose: bool = False, async_save: bool = False):
        if mode not in ("min", "max"):
            raise ConfigError(f"checkpoint mode {mode!r} is not valid; valid choices: min, max "
                              f"(whether a lower or a higher monitored value is better).")
        if not (isinstance(save_last, bool) or save_last == "link"):
            raise ConfigError(f"checkpoint save_last must be true, false or 'link', got "
                              f"{save_last!r} (link: last.ckpt is a link to the newest top-k "
                              f"file).")
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
            if not filename or filename.endswith(self.FILE_EXTENSION) or _FIELD.sub(
                    "", filename).count("{") or _FIELD.sub("", filename).count("}"):
                raise ConfigError(
                    f"checkpoint filename {filename!r} is not a valid template: give a name "
                    f"without the {self.FILE_EXTENSION} extension, with fields in braces such "
                    f"as \"{{epoch}}-{{val_loss:.3f}}\" (fields: epoch, step, any logged "
                    f"metric).")
        self.filename, self.monitor, self.mode = filename, monitor, mode
        self.save_top_k, self.save_last = save_top_k, save_last
        self.every_n_epochs, self.every_n_train_steps = every_n_epochs, every_n_train_steps
        self.train_time_interval = interval
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.auto_insert_metric_name = auto_insert_metric_name
        self.on_write_error = on_write_error
        if dirpath is not None and "://" in os.fspath(dirpath):
            raise ConfigError(
                f"checkpoint dirpath {os.fspath(dirpath)!r} is a URL; ptrain writes checkpoints "
                f"to a local or mounted folder (atomically, with fsync), not through a remote "
                f"filesystem. Give a folder path (mount the storage, or copy the files there "
                f"after the run).")
        # the folder once a fit began; None: the run folder's checkpoints/
        self.dirpath = None if not os.fspath(dirpath or "") else os.path.realpath(
            os.path.expanduser(os.fspath(dirpath)))
        self._given_dirpath = self.dirpath
        self.save_weights_only = bool(save_weights_only)
        self.save_on_exception = bool(save_on_exception)
        self.enable_version_counter = bool(enable_version_counter)
        self.verbose = bool(verbose)
        self.async_save = bool(async_save)

        self.best_model_path = ""
        self.best_model_score: float | None = None
        self.best_k_models: dict[str, float] = {}
        self.kth_best_model_path = ""
        self.kth_value = math.inf if mode == "min" else -math.inf
        self.last_model_path = ""
        self.current_score: float | None = None
        self._last_step_saved = -1  # step of the last step/time-triggered checkpoint
        self._take_again = False  # a background write's copies failed: the next step saves
        # (step, monitored value) of the last ranking: the same one is not ranked twice
        self._last_ranked: tuple[int, float | None] | None = None
        self._last_time_checked: float | None = None
        self._topk_on_epoch_end = True
        self._metrics_published = False  # a validation or an epoch ended in this fit
        self._said_unlogged = False  # see stops_on_unlogged_monitor_without_validation
        self._writes = True  # False under fast_dev_run, which writes no checkpoint
        self._taken_on_disk: set[str] = set()  # files in the folder this callback did not write
        self._last_global_step_saved = 0  # nothing trained since: no save on an exception
        self._last_checkpoint_saved = ""  # the newest file written (a link's target)
        self._last_written_step: int | None = None  # step at which last.ckpt was last written
        self._last_writes = 0  # how many times last.ckpt was written (or linked, or begun)
        self._wrote_this_fit = True  # a file was written since the fit began (see on_loop_end)
        self._said: set[str] = set()  # what was said once already
        self._said_refusal: BaseException | None = None  # the write refusal counted last
        # refused writes since the last complete one, and the cause of the one said in full
        # (the same cause again is counted, not said: see _warn_refused)
        self._refusals = 0
        self._refusal_cause: str | None = None
        #: files this callback wrote that are to be deleted (path -> their size and modification
        #: time when the deletion was decided), listed in every checkpoint until deleted
        self._due: dict[str, tuple[int, int] | None] = {}
        self._ready: set[str] = set()  # due files whose replacement is complete
        self._record_stale = False  # the last write of best_k_models.json was refused

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("filename", str,
                    help="name of the top-k files, a template: \"{epoch}-{val_loss:.3f}\" gives "
                         "epoch=3-val_loss=0.123.ckpt (default: {epoch}-{step})")
        options.add("monitor", str, help="the logged metric that ranks the top-k checkpoints "
                                         "(or epoch, step)")
        options.add("mode", str, default="min", choices=("min", "max"),
                    help="whether a lower or a higher monitored value is better")
        options.add("save_top_k", int, default=1,
                    help="keep the k best checkpoints (-1: all, 0: none); without a monitor only "
                         "-1, 0 or 1 (the newest)")
        options.add("save_last", _save_last, default=True,
                    help="write the resumable last.ckpt each time a checkpoint is taken; 'link': "
                         "last.ckpt links to the newest top-k file")
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
        options.add("save_on_exception", to_bool, default=False,
                    help="when fit ends with an error, write the state at that moment under the "
                         "top-k name (last.ckpt stays the last state saved at a checkpoint point)")
        options.add("enable_version_counter", to_bool, default=True,
                    help="give a name already in the folder -v1, -v2...; false: reuse it, "
                         "replacing the file there (said)")
        options.add("verbose", to_bool, default=False,
                    help="print a line for each top-k decision")
        options.add("async_save", to_bool, default=False,
                    help="copy each checkpoint to host memory and write it in the background "
                         "while training goes on (one write in flight; single files and "
                         "sharded folders, on any number of processes)")
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
                # stacklevel=1 in a hook: the warning is this callback's (its caller is pluggy,
                # which the CLI would name as the warning's source)
                warnings.warn(
                    f"checkpoint save_weights_only=True: the top-k files in {self.dirpath} hold "
                    f"the weights only, as Lightning writes them; the full training state for "
                    f"an exact resume is kept in {self._full_state_path(trainer)} "
                    f"(ckpt_path='last' resumes from it)"
                    + (", written as a file, not a link" if self.save_last == "link" else "")
                    + ".", stacklevel=1)
        if self.async_save and self._writes and trainer.is_global_zero:
            why = trainer.why_not_asynchronous()
            if why is not None:
                self._say_once("sync", f"checkpoint async_save=True: this run's checkpoints are "
                                       f"written synchronously, because {why}.")
        if self.save_on_exception and trainer.world_size > 1 and trainer.is_global_zero:
            self._say_once("several", f"checkpoint save_on_exception=True writes nothing under "
                                      f"several processes ({trainer.world_size} here): after an "
                                      f"error on one, the others can't join a save. Resume from "
                                      f"the last checkpoint written (ckpt_path='last').")
        if self.save_on_train_epoch_end is not None:
            self._topk_on_epoch_end = self.save_on_train_epoch_end
        else:  # as Lightning: after validation, unless it runs exactly once at each epoch end
            validates = trainer.val_dataloader is not None and trainer.limit_val_batches != 0
            interval = trainer.val_check_interval
            self._topk_on_epoch_end = not validates or (
                trainer.check_val_every_n_epoch == 1
                and isinstance(interval, float) and interval == 1.0)

    @hookimpl
    def on_loop_start(self, trainer, loop: str) -> None:
        if loop == "fit":  # what a resumed or a repeated fit starts from is saved already
            self._last_global_step_saved = trainer.global_step
            self._last_written_step = None
            self._wrote_this_fit = False
            self._take_again = False
            if self._writes and trainer.ckpt_path:  # what a kill left undeleted
                self._tidy(trainer)

    @hookimpl
    def on_loop_end(self, trainer, loop: str) -> None:
        if loop != "train" or not self._writes:
            return
        with self._checkpoint_point(trainer):
            if self.async_save:  # a write whose copies failed is taken again: no step follows
                trainer.finish_checkpoint_write()
                if self._take_again:
                    self._take_again = False
                    self._take(trainer, check_now=False)
            # save_last: a fit that trained but whose triggers never came due still ends with
            # a last.ckpt (one that trained nothing, stopped by a finder, rewrites nothing)
            if self.save_last and not self._wrote_this_fit \
                    and trainer.global_step != self._last_global_step_saved:
                self._write_last(trainer)

    @hookimpl
    def unused_step_hooks(self) -> list[str] | None:
        # without step or time triggers nothing is saved mid-epoch: no call per step
        if not self.every_n_train_steps and self.train_time_interval is None \
                and not self.async_save:  # async: each step looks for a finished write
            return ["on_train_batch_end"]
        return None

    @hookimpl
    def on_train_batch_end(self, trainer, batch, batch_idx, loss) -> None:  # all: see hook_calls
        if self.async_save:  # a write that ended is settled: a refusal is said, or stops the run
            trainer.settle_checkpoint_write()
        # only where an optimizer step just happened: mid-window gradients are not saved
        if not trainer.sync_gradients:
            return
        if self.async_save and self._writes:  # once the optimizers hold their state
            trainer.prepare_background_copies()
        step = trainer.global_step
        n = self.every_n_train_steps
        due = bool(n) and step % n == 0 and step != self._last_step_saved
        if not due and self.train_time_interval is not None and step != self._last_step_saved:
            due = self._time_due(trainer, step)
        if due or self._take_again:
            self._take_again = False  # once: a retake that saves nothing is not retried
            self._last_step_saved = step
            self._last_time_checked = time.monotonic()
            with self._checkpoint_point(trainer):
                self._take(trainer, check_now=False)

    @contextlib.contextmanager
    def _checkpoint_point(self, trainer) -> Iterator[None]:
        """A checkpoint point (:meth:`Trainer.checkpoint_point`) whose decisions read metrics
        every process has alike: under several processes, the training step values logged
        since the last publish point (each process's own until then) are reduced first
        (:meth:`MetricStore.agree_step_values`, a collective; the points are taken on every
        rank alike). Once its files are written (or refused), the files due for deletion whose
        replacement is complete are deleted (:meth:`_tidy`)."""
        with trainer.checkpoint_point():
            trainer.metrics.agree_step_values()
            yield
            if self._writes:
                trainer.after_checkpoint_write(lambda error: self._tidy(trainer, error))

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

    # trylast here and at the epoch's end: the state saved is the one after the other callbacks
    # handled the validation (early stopping's count of checks without improvement, so a resume
    # stops where the run would have), as Lightning runs its checkpoint callbacks last
    @hookimpl(trylast=True)
    def on_validation_end(self, trainer) -> None:
        if trainer.stage != "train":
            return
        self._metrics_published = True
        if self._topk_on_epoch_end or not self._epoch_due(trainer):
            return
        with self._checkpoint_point(trainer):
            self._save_topk(trainer, check_now=True)

    @hookimpl(trylast=True)
    def on_epoch_end(self, trainer) -> None:
        self._metrics_published = True
        if not self._epoch_due(trainer):
            return
        with self._checkpoint_point(trainer):
            writes = self._last_writes
            if self._topk_on_epoch_end:
                self._save_topk(trainer, check_now=True)
            # written again even when a validation at this step wrote it: the state after the
            # epoch's end resumes into the next epoch, the same with any number of processes;
            # not twice for this state (the top-k file just written was followed by it)
            if self._keeps_last and not self._last_beside_topk_only() \
                    and self._last_writes == writes:
                self._write_last(trainer)

    @hookimpl
    def teardown(self, trainer, stage: str) -> None:
        if stage == "fit":
            self._remind_refusals(trainer)
        error = trainer.exception
        if stage != "fit" or error is None or not self.save_on_exception:
            return
        try:
            self._save_on_exception(trainer, error)
        except Exception as exc:  # noqa: BLE001 - the run's own error is the one to raise
            if trainer.is_global_zero:
                warnings.warn(f"checkpoint save_on_exception: the state at the error was not "
                              f"written: {type(exc).__name__}: {exc}", stacklevel=1)

    def _save_on_exception(self, trainer, error: BaseException) -> None:
        if not self._writes or trainer.world_size > 1:
            return  # fast_dev_run writes nothing; several processes: said at setup
        if trainer.global_step == self._last_global_step_saved:
            return  # nothing trained since the last save (or since the fit began)
        if isinstance(error, NonFiniteLossError):
            if trainer.is_global_zero:
                warnings.warn(f"checkpoint save_on_exception: the state at the error was not "
                              f"written: the loss went non-finite, so the weights are not worth "
                              f"resuming. {self._kept_note()}", stacklevel=1)
            return
        candidates = self._candidates(trainer)
        # the epoch in progress (after fit, trainer.current_epoch counts a part-run one as run)
        epoch = trainer.loop_state.get("epoch", trainer.current_epoch)
        if "epoch" not in trainer.callback_metrics:
            candidates["epoch"] = epoch
        try:
            stem = self._format(trainer, candidates)
        except ConfigError:  # a field the run never logged: the default name instead
            stem = self._format(trainer, candidates, self._default_template())
        path = self._unique(trainer, stem, reuse=None)
        try:
            trainer.save_checkpoint(path)
        except NonFiniteLossError:
            if trainer.is_global_zero:
                warnings.warn(f"checkpoint save_on_exception: the state at the error was not "
                              f"written: the loss went non-finite before it, so the weights are "
                              f"not worth resuming. {self._kept_note()}", stacklevel=1)
            return
        self._saved(trainer, path)
        if trainer.is_global_zero:
            warnings.warn(
                f"fit ended with {type(error).__name__}: {error}; the state at that moment "
                f"(epoch {epoch}, step {trainer.global_step}, possibly part-way "
                f"through a batch) was saved to {path} (save_on_exception). It is not among the "
                f"top-k files" + (f", and {self.last_model_path} still holds the last state "
                                  f"saved at a checkpoint point, which resumes exactly"
                                  if self.last_model_path else "") + ".", stacklevel=1)

    def _kept_note(self) -> str:
        if self.last_model_path:
            return f"The last checkpoint written, {self.last_model_path}, is kept."
        return "No checkpoint was written over."

    def _epoch_due(self, trainer) -> bool:
        n = self.every_n_epochs
        return bool(n) and (trainer.current_epoch + 1) % n == 0

    @property
    def _keeps_last(self) -> bool:
        """Whether the resumable full state is written: with ``save_last``, and always when the
        top-k files hold the weights only."""
        return bool(self.save_last) or self.save_weights_only

    def _take(self, trainer, check_now: bool) -> None:
        self._save_topk(trainer, check_now)
        if self._keeps_last and not self._last_beside_topk_only() \
                and self._last_written_step != trainer.global_step:
            self._write_last(trainer)

    # -- what ------------------------------------------------------------------------------------

    def _folder(self, trainer) -> Path:
        own = self._own_folder(trainer)
        return own if own is not None else Path(trainer.run_dir) / "checkpoints"

    def _own_folder(self, trainer) -> Path | None:
        """The folder of this callback's files when it is not the run folder's
        ``checkpoints/`` (``dirpath``): such a folder may hold other runs' files, and
        ``ckpt_path='last'`` looks there. A subclass may choose one (Lightning's, without a
        logger)."""
        return None if self._given_dirpath is None else Path(self._given_dirpath)

    def _record_folder(self, trainer) -> Path | None:
        """Where the record of the top-k (``best_k_models.json``) goes: beside the files."""
        return self._folder(trainer)

    def _names_left_by_others(self, trainer) -> set[str]:
        """The checkpoint files in the folder now that this callback's state does not name
        (another run's, in a shared ``dirpath``): never overwritten. Listed by rank 0, so every
        rank names files alike."""
        if self._own_folder(trainer) is None:  # the run folder's: every file in it is this run's
            return set()
        names = None
        if trainer.is_global_zero:
            folder = self._folder(trainer)
            own = {Path(p).name for p in (*self.best_k_models, self.best_model_path,
                                          self.last_model_path) if p}
            names = sorted(p.name for p in folder.glob(f"*{self.FILE_EXTENSION}")
                           if p.name not in own) if folder.is_dir() else []
        if trainer.world_size > 1:
            names = trainer.hook.all_gather_object(trainer=trainer, obj=names)[0]
        return set(names)

    def _default_template(self) -> str:
        return "{epoch}" + self.CHECKPOINT_JOIN_CHAR + "{step}"

    def _full_state_path(self, trainer, candidates: dict[str, Any] | None = None) -> Path:
        """Where the resumable ``last.ckpt`` goes: this callback's folder with ``save_last``, the
        run folder's otherwise (``save_weights_only`` keeps it without ``save_last``)."""
        if not self.save_last:
            return trainer.last_checkpoint_path
        if candidates is None:
            candidates = self._candidates(trainer)
        stem = self._format(trainer, candidates, self.CHECKPOINT_NAME_LAST,
                            auto_insert=self.auto_insert_metric_name)
        folder = self._folder(trainer)
        path = folder / f"{stem}{self.FILE_EXTENSION}"
        version = self.STARTING_VERSION
        while self.enable_version_counter and path.name in self._taken_on_disk:
            path = folder / f"{stem}{self.CHECKPOINT_JOIN_CHAR}v{version}{self.FILE_EXTENSION}"
            version += 1
        self._say_if_replacing(path)
        return path

    def _write_last(self, trainer) -> None:
        if not self._writes:
            return
        self._settle(trainer)
        candidates = self._candidates(trainer)
        path = self._full_state_path(trainer, candidates)
        previous, self.last_model_path = self.last_model_path, str(path)  # part of the state
        # a templated name ("last-{epoch}") leaves the previous one behind: one last file
        replaced = previous if previous and previous != str(path) \
            and self._own_file(trainer, previous) else None
        self._due_for_deletion(replaced)

        def undo() -> None:
            self.last_model_path = previous
            self._not_due(replaced)

        if self._links_last(path):
            target = self._last_checkpoint_saved
            self._when_written(trainer, lambda: self._link_last(trainer, path, target))
            trainer.after_checkpoint_write(lambda error: undo() if error is not None else None)
        elif not self._save(trainer, path, undo=undo):
            return
        self._last_written_step = trainer.global_step
        self._last_writes += 1
        self._deletable_once_written(trainer, replaced)

    def _links_last(self, path: Path) -> bool:
        """Whether ``last.ckpt`` is a link to the newest top-k file: ``save_last="link"``, a
        full-state top-k file written, and ``path`` in this callback's folder."""
        return (self.save_last == "link" and not self.save_weights_only
                and bool(self._last_checkpoint_saved)
                and self._last_checkpoint_saved != str(path))

    def _link_last(self, trainer, path: Path, target: str) -> None:
        if trainer.writes_run_files:
            if not link_or_copy(target, path):
                self._say_once("copy", f"checkpoint save_last='link': the filesystem of "
                                       f"{path.parent} allows no links, so {path.name} is a copy "
                                       f"of the newest top-k file instead.")
        if trainer.world_size > 1:  # every rank goes on once the link is there
            trainer.hook.all_gather_object(trainer=trainer, obj=None)

    def _own_file(self, trainer, path: str) -> bool:
        """Whether ``path`` may be deleted: in this callback's folder, and not the checkpoint
        the run resumed from."""
        target = Path(path).absolute()
        resumed = Path(trainer.ckpt_path).absolute() if trainer.ckpt_path else None
        return Path(self._folder(trainer)).absolute() in target.parents and target != resumed

    def _save_topk(self, trainer, check_now: bool) -> None:
        """``check_now``: the metrics of the epoch or validation are all there (a monitor missing
        now was never logged). Otherwise (a step or time trigger) a monitor missing before the
        first validation or epoch end may still come: this trigger then writes only last.ckpt."""
        if self.save_top_k == 0 or not self._writes:
            return
        self._settle(trainer)
        candidates = self._candidates(trainer)
        if self.monitor is None:
            if self._newest_is_last():
                # last.ckpt is the newest checkpoint: no second copy (the epoch end writes it)
                self.best_model_path = str(self._full_state_path(trainer, candidates))
                return
            if self._last_ranked == (trainer.global_step, None):
                return
            self._last_ranked = (trainer.global_step, None)
            path = self._unique(trainer, self._format(trainer, candidates),
                                reuse=self.best_model_path)
            previous, self.best_model_path = self.best_model_path, path
            replaced = previous if self.save_top_k == 1 and previous and previous != path \
                and self._own_file(trainer, previous) else None
            self._due_for_deletion(replaced)

            def undo_newest() -> None:
                self.best_model_path = previous
                self._not_due(replaced)

            if not self._save(trainer, path, self.save_weights_only, undo=undo_newest):
                return
            self._deletable_once_written(trainer, replaced)
            self._after_topk_write(trainer)
            return
        if self.monitor not in candidates:
            message = (f"checkpoint monitor {self.monitor!r} was not logged; logged metrics: "
                       f"{', '.join(sorted(trainer.callback_metrics)) or '(none)'}. Log it with "
                       f"self.log({self.monitor!r}, ...) or change --checkpoint-monitor.")
            if not self.stops_on_unlogged_monitor_without_validation and \
                    trainer.stage == "train" and trainer.val_dataloader is None:
                if not self._said_unlogged:
                    self._said_unlogged = True
                    warnings.warn(f"{message} This fit runs no validation, so nothing is saved "
                                  f"for this monitor.", stacklevel=2)
                return
            if check_now or self._metrics_published:
                raise ConfigError(message)
            return  # a step or time trigger before the first validation: decided there
        raw = candidates[self.monitor]
        score = float(raw)
        if math.isnan(score):  # ranked as the worst possible value
            score = math.inf if self.mode == "min" else -math.inf
        # a step trigger and the epoch end at one step: ranked again only if the value changed
        # (an epoch-level training metric is published at the epoch's end)
        if self._last_ranked == (trainer.global_step, score):
            return
        self._last_ranked = (trainer.global_step, score)
        k = self.save_top_k
        full = k != -1 and len(self.best_k_models) >= k
        if full and not self._better(score, float(
                self.best_k_models[self.kth_best_model_path])):
            self._tell(trainer, f"{self.monitor} = {score:.5g} is not among the best {k}; "
                                f"nothing saved")
            return
        dropped = self.kth_best_model_path if full else None
        ranking = (dict(self.best_k_models), self.best_model_path, self.best_model_score,
                   self.kth_best_model_path, self.kth_value, self.current_score)
        if dropped is not None:
            del self.best_k_models[dropped]
        path = self._unique(trainer, self._format(trainer, candidates), reuse=dropped)
        self.current_score = self.best_k_models[path] = self._kept_score(raw, score)
        self._rank()
        replaced = dropped if dropped is not None and dropped != path \
            and self._own_file(trainer, dropped) else None
        self._due_for_deletion(replaced)

        def undo_ranking() -> None:  # the top-k as before
            (self.best_k_models, self.best_model_path, self.best_model_score,
             self.kth_best_model_path, self.kth_value, self.current_score) = ranking
            self._not_due(replaced)

        if not self._save(trainer, path, self.save_weights_only, undo=undo_ranking):
            return
        self._tell(trainer, f"{self.monitor} = {score:.5g} is among the best "
                            f"{k if k != -1 else len(self.best_k_models)} (best "
                            f"{float(self.best_model_score):.5g}); saved {path}")
        folder = self._record_folder(trainer)
        if trainer.writes_run_files and folder is not None:
            record = self._record(folder)  # the ranking with this file: it is written first
            self._when_written(trainer, lambda: self._write_record(trainer, folder, record))
        self._deletable_once_written(trainer, replaced)
        self._after_topk_write(trainer)

    def _newest_is_last(self) -> bool:
        """Whether the one top-k file kept without a monitor would be a copy of ``last.ckpt``
        (``save_top_k=1``, ``save_last``, no ``filename``, full state), so none is written and
        ``best_model_path`` names ``last.ckpt``. A subclass writing both returns ``False``."""
        return (self.save_top_k == 1 and self.save_last is True and self.filename is None
                and not self.save_weights_only)

    def _last_beside_topk_only(self) -> bool:
        """Whether ``last.ckpt`` is written beside a kept top-k file only
        (:meth:`_after_topk_write`), not at every checkpoint point. ptrain's is at every point
        (it resumes the newest state); a subclass may choose otherwise (Lightning's)."""
        return False

    def _after_topk_write(self, trainer) -> None:
        """``last.ckpt`` follows each top-k file (before a dropped file is deleted)."""
        if self._keeps_last:
            self._write_last(trainer)

    def _save(self, trainer, path: str | Path, weights_only: bool = False,
              undo: Callable[[], None] | None = None) -> bool:
        """Write a checkpoint to ``path`` (in the background with ``async_save``); ``False``
        when the system refused the write and ``on_write_error`` is ``warn`` (said on stderr,
        and ``undo`` puts back what the caller changed for it), else the refusal is raised.
        Under several processes every rank learns of a refusal on any (a barrier after the
        write). A background write refused later is handled alike once it ends
        (:meth:`_written`)."""
        try:
            background = trainer.save_checkpoint(path, weights_only=weights_only,
                                                 asynchronous=self.async_save)
        except CheckpointWriteError as exc:
            self._refused(trainer, exc, undo)
            return False
        if background:  # what _saved records below is put back too if the write fails
            before = (self._last_checkpoint_saved, self._last_global_step_saved)

            def undo_all() -> None:
                self._last_checkpoint_saved, self._last_global_step_saved = before
                if undo is not None:
                    undo()

            trainer.after_checkpoint_write(lambda error: self._written(trainer, error,
                                                                       undo_all))
        self._when_written(trainer, lambda: self._written_again(trainer, path))
        self._saved(trainer, path, weights_only)
        return True

    def _refused(self, trainer, exc: CheckpointWriteError,
                 undo: Callable[[], None] | None) -> None:
        if self.on_write_error == "stop":
            raise CheckpointWriteError(
                f"{exc} To warn and train on instead when a checkpoint can't be written, "
                f"pass --checkpoint-on-write-error warn.") from None
        self._warn_refused(trainer, exc)
        if undo is not None:
            undo()

    def _warn_refused(self, trainer, exc: CheckpointWriteError) -> None:
        """Under ``on_write_error="warn"``: say a refused write on global rank 0, in full the
        first time; the same cause again (the disk still full) is only counted until a write
        is complete again (:meth:`_written_again`), and the end of fit says how many there
        were (:meth:`_remind_refusals`). Every rank counts alike (each learns of a refusal)."""
        if exc is self._said_refusal:  # a background write's later files: its first refusal
            return
        self._said_refusal = exc
        self._refusals += 1
        cause = _refusal_cause(exc)
        if cause == self._refusal_cause:
            return
        self._refusal_cause = cause
        if trainer.is_global_zero:
            print(f"ptrain: warning: {exc} Training goes on (--checkpoint-on-write-error "
                  f"warn); further refusals for this cause are counted, not said, until a "
                  f"checkpoint is written again.", file=sys.stderr, flush=True)

    def _written_again(self, trainer, path: str | Path) -> None:
        """A write completed: after refused ones, that is said (they are over)."""
        if not self._refusals:
            return
        if trainer.is_global_zero:
            print(f"ptrain: warning: checkpoint {str(path)!r} was written after "
                  f"{_writes(self._refusals)} refused: checkpoints are saved again.",
                  file=sys.stderr, flush=True)
        self._refusals, self._refusal_cause = 0, None

    def _remind_refusals(self, trainer) -> None:
        """At the end of fit, where writes were refused since the last complete one and not
        all were said: how many, and the newest complete checkpoint (the one to resume)."""
        refusals, self._refusals, self._refusal_cause = self._refusals, 0, None
        if refusals <= 1 or not trainer.is_global_zero:
            return
        newest = _intact_checkpoint(Path(self.last_model_path)
                                    if self.last_model_path else self._folder(trainer) / LAST)
        print(f"ptrain: warning: checkpoint: {_writes(refusals)} refused since the last "
              f"complete one (the first is said above); " + (
                  f"the newest complete checkpoint is {str(newest)!r}." if newest is not None
                  else "no checkpoint of this run is complete."),
              file=sys.stderr, flush=True)

    def _written(self, trainer, error: BaseException | None,
                 undo: Callable[[], None] | None) -> None:
        """A background write ended: a refusal is handled as a synchronous one is; a tensor
        changed before its copy was made is said, and the checkpoint taken again at the next
        step boundary (the trainer copies everything on the training thread from then on);
        any other error is raised (a bug)."""
        if error is None:
            return
        if isinstance(error, ChangedBeforeCopiedError):
            if trainer.is_global_zero and not self._take_again:  # once for the write's files
                print(f"ptrain: warning: {error} Training goes on; the checkpoint is taken "
                      f"again at the next step (or at the end of the training loop), and this "
                      f"run's later background saves copy everything before training goes on "
                      f"(a longer stall).",
                      file=sys.stderr, flush=True)
            if undo is not None:
                undo()
            # not taken: the retake at this same step (the loop's end) ranks and writes again
            self._last_ranked = self._last_written_step = None
            self._take_again = True
            return
        if not isinstance(error, CheckpointWriteError):
            raise error
        self._refused(trainer, error, undo)

    def _settle(self, trainer) -> None:
        """Before a checkpoint point changes the top-k: the write of an earlier point is
        finished and settled (a refusal undone), so that undoing it can't touch this one."""
        trainer.finish_checkpoint_write(unless_this_point=True)

    def _when_written(self, trainer, effect: Callable[[], None]) -> None:
        """Run ``effect`` (it replaces or records a file) once the files being written are
        complete, and only if they were: at once after a synchronous write."""
        trainer.after_checkpoint_write(lambda error: effect() if error is None else None)

    def _saved(self, trainer, path: str | Path, weights_only: bool = False) -> None:
        self._take_again = False
        self._last_global_step_saved = trainer.global_step
        self._wrote_this_fit = True
        if not weights_only:
            self._last_checkpoint_saved = str(path)

    def _tell(self, trainer, what: str) -> None:
        """With ``verbose``: one line about a top-k decision, on global rank 0."""
        if self.verbose and trainer.is_global_zero:
            print(f"checkpoint: epoch {trainer.current_epoch}, step {trainer.global_step}: "
                  f"{what}", flush=True)

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            warnings.warn(message, stacklevel=2)  # the sentence's line, here

    def _kept_score(self, raw: Any, score: float) -> Any:
        """What a score is kept as (``best_k_models``' values, ``current_score``): a float,
        ``score`` (a NaN made the worst value); a subclass may keep ``raw``, as logged."""
        return score

    def _better(self, score: float, than: float) -> bool:
        return score < than if self.mode == "min" else score > than

    def _rank(self) -> None:
        models = self.best_k_models
        worst = max if self.mode == "min" else min
        best = min if self.mode == "min" else max
        self.best_model_path = best(models, key=lambda path: float(models[path]))
        self.best_model_score = models[self.best_model_path]
        if self.save_top_k == -1 or len(models) >= self.save_top_k:
            self.kth_best_model_path = worst(models, key=lambda path: float(models[path]))
            self.kth_value = models[self.kth_best_model_path]

    # -- names -----------------------------------------------------------------------------------

    def _candidates(self, trainer) -> dict[str, Any]:
        """What a monitor and a filename field may name: the logged metrics, and ``epoch`` and
        ``step`` (the counters, unless logged under those names)."""
        candidates: dict[str, Any] = dict(trainer.callback_metrics)
        for name, counter in (("epoch", trainer.current_epoch), ("step", trainer.global_step)):
            value = candidates.get(name)
            candidates[name] = counter if value is None else int(float(value))
        return candidates

    def _format(self, trainer, candidates: dict[str, Any], template: str | None = None,
                auto_insert: bool | None = None) -> str:
        template = template if template is not None else (
            self.filename if self.filename is not None else self._default_template())
        return self._format_name(template, candidates, self.auto_insert_metric_name
                                 if auto_insert is None else auto_insert)

    def _format_name(self, template: str, metrics: dict[str, Any], auto_insert: bool) -> str:
        """``template`` with each ``{name[:spec]}`` field filled from ``metrics`` (as
        ``name=value`` with ``auto_insert``)."""

        def field(match: re.Match) -> str:
            name, spec = match.group(1).strip(), match.group(2)
            if name in metrics:
                value = metrics[name]
                value = value.item() if isinstance(value, torch.Tensor) else value
            else:
                value = self._missing_field(template, name, metrics)
            text = f"{{0{spec}}}".format(value)
            return f"{name}{self.CHECKPOINT_EQUALS_CHAR}{text}" if auto_insert else text

        return _FIELD.sub(field, template)

    def _missing_field(self, template: str, name: str, metrics: dict[str, Any]) -> Any:
        """The value of a filename field nothing was logged under: refused (a subclass may
        answer a value)."""
        logged = sorted(k for k in metrics if k not in ("epoch", "step"))
        raise ConfigError(
            f"checkpoint filename {template!r} names {name!r}, which was not logged; fields can "
            f"be epoch, step and the logged metrics: {', '.join(logged) or '(none)'}. Log it "
            f"with self.log({name!r}, ...) or change --checkpoint-filename.")

    def format_checkpoint_name(self, metrics: dict[str, Any], filename: str | None = None,
                               ver: int | None = None, prefix: str | None = None) -> str:
        """The path a checkpoint with these ``metrics`` gets (Lightning's method): ``filename``
        (default: this callback's template) filled in, ``prefix`` and ``-v<ver>`` joined with
        ``CHECKPOINT_JOIN_CHAR``, ``FILE_EXTENSION`` added, in ``dirpath`` when it is known."""
        template = filename or self.filename or self._default_template()
        name = self._format_name(template, dict(metrics), self.auto_insert_metric_name)
        if prefix is not None:
            name = self.CHECKPOINT_JOIN_CHAR.join([prefix, name])
        if ver is not None:
            name = self.CHECKPOINT_JOIN_CHAR.join([name, f"v{ver}"])
        name += self.FILE_EXTENSION
        return os.path.join(self.dirpath, name) if self.dirpath else name

    def _unique(self, trainer, stem: str, reuse: str | None) -> str:
        """The path for ``stem``; a name already kept (other than the one about to be replaced,
        ``reuse``) or ``last.ckpt`` gets ``-v1``, ``-v2``... (with ``enable_version_counter``).
        Decided from this callback's state alone, so every rank picks the same name."""
        folder = self._folder(trainer)
        candidate = str(folder / f"{stem}{self.FILE_EXTENSION}")
        if not self.enable_version_counter:
            self._say_if_replacing(Path(candidate))
            return candidate
        taken = set(self.best_k_models) | {
            str(folder / name) for name in self._taken_on_disk}
        if self.last_model_path:
            taken.add(self.last_model_path)
        if "{" not in self.CHECKPOINT_NAME_LAST and self._last_name_reserved():
            taken.add(str(folder / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"))
        if self.monitor is None and self.save_top_k == -1 and self.best_model_path:
            taken.add(self.best_model_path)
        version = self.STARTING_VERSION
        while candidate in taken and candidate != reuse:
            candidate = str(folder / f"{stem}{self.CHECKPOINT_JOIN_CHAR}v{version}"
                                     f"{self.FILE_EXTENSION}")
            version += 1
        return candidate

    def _last_name_reserved(self) -> bool:
        """Whether a top-k file may not take the name ``last.ckpt``: ptrain's callback keeps it
        for the resumable state (a subclass may free it where it writes none)."""
        return True

    def _say_if_replacing(self, path: Path) -> None:
        if path.name in self._taken_on_disk:
            self._say_once(f"replace {path.name}", (
                f"checkpoint enable_version_counter=False: {path} was there before this run "
                f"and is replaced by this run's file of the same name (atomically: the old "
                f"file stays whole until the new one is complete)."))

    def _remove(self, trainer, path: str) -> None:
        if not trainer.writes_run_files:
            return
        replaced_files.remove(path)  # its blocks freed off the training thread

    # -- deletions -------------------------------------------------------------------------------

    def _due_for_deletion(self, path: str | None) -> None:
        """``path`` (a file this callback wrote; ``None``: nothing) is to be deleted once what
        replaces it is complete. From now on the checkpoints this callback's state goes into
        list it, with its size and modification time (where this process sees it), so that a
        run resumed from one deletes it if a kill came first (:meth:`_restore_state`)."""
        if path is not None:
            self._due[path] = _identity(path)

    def _not_due(self, path: str | None) -> None:
        """What replaced ``path`` was not written: it stays."""
        if path is not None:
            self._due.pop(path, None)
            self._ready.discard(path)

    def _deletable_once_written(self, trainer, path: str | None) -> None:
        """``path`` may go once the file just saved is complete (the checkpoint point's end
        deletes it: :meth:`_tidy`)."""
        if path is not None:
            self._when_written(trainer, lambda: self._ready.add(path))

    def _tidy(self, trainer, error: BaseException | None = None) -> None:
        """Delete the due files whose replacement is complete, on the process that writes the
        run's files: at a checkpoint point's end once its files are written, with the error of
        the last one (under ``on_write_error="stop"`` a refusal ends the run: nothing is
        deleted), and as a resumed fit begins. A file the top-k record on disk names stays
        until the record is rewritten: where the record's last write was refused, or it names
        a due file, it is rewritten first, when every file of the ranking is there. A file
        that is no longer as this callback wrote it (another file by that name) is not
        deleted."""
        if error is not None and self.on_write_error == "stop":
            return
        ready = [path for path in self._due if path in self._ready]
        if not ready and not self._record_stale:
            return
        if trainer.writes_run_files:
            folder = self._record_folder(trainer)
            named = self._recorded(folder)
            if folder is not None and (self._record_stale or named is None
                                       or named.intersection(ready)) and self._ranking_on_disk():
                self._write_record(trainer, folder, self._record(folder))
                named = self._recorded(folder)
            if named is None:  # unreadable: which files it names is not known
                return
            kept = {self.best_model_path, self.last_model_path, *self.best_k_models} | named
            ready = [path for path in ready if path not in kept]
        for path in ready:
            identity = self._due.pop(path)
            self._ready.discard(path)
            if identity is not None and _identity(path) == identity \
                    and self._own_file(trainer, path):
                self._remove(trainer, path)

    def _recorded(self, folder: Path | None) -> set[str] | None:
        """The files the top-k record in ``folder`` names (none where there is none);
        ``None`` where it can't be read."""
        if folder is None or not (folder / RECORD).exists():
            return set()
        try:
            record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
            return {str(folder / path) for path in (record["best_model_path"],
                                                    *record["best_k_models"])}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _ranking_on_disk(self) -> bool:
        """Whether the top-k is monitored and every file it names is there (the record may
        then be rewritten to it)."""
        return self.monitor is not None and bool(self.best_k_models) and all(
            os.path.lexists(path) for path in self.best_k_models)

    def _record(self, folder: Path) -> dict[str, Any]:
        """The top-k as ``best_k_models.json`` records it, relative to ``folder``."""
        return {"monitor": self.monitor, "mode": self.mode,
                "best_model_path": os.path.relpath(self.best_model_path, folder),
                "best_model_score": float(self.best_model_score),
                "best_k_models": {os.path.relpath(p, folder): float(s)
                                  for p, s in self.best_k_models.items()}}

    def _write_record(self, trainer, folder: Path, record: dict[str, Any]) -> None:
        tmp = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{RECORD}.", suffix=".tmp", dir=folder)
            os.fchmod(fd, new_file_mode())  # mkstemp's 0600 would outlive the rename
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(record, f, indent=1)
            os.replace(tmp, folder / RECORD)
            self._record_stale = False
        except OSError as exc:  # the checkpoint itself was written: the record is told apart
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            self._record_stale = True  # rewritten at the next checkpoint point's end
            error = write_failed(folder / RECORD, exc, what="the top-k record",
                                 checkpoint=self.last_model_path or folder / LAST)
            if self.on_write_error == "stop":
                raise CheckpointWriteError(
                    f"{error} To warn and train on instead when a checkpoint can't be written, "
                    f"pass --checkpoint-on-write-error warn.") from None
            self._warn_refused(trainer, error)

    def to_yaml(self, filepath: str | os.PathLike | None = None) -> None:
        """Write ``best_k_models`` (path -> score) as YAML to ``filepath``, by default
        ``best_k_models.yaml`` in ``dirpath`` (Lightning's method)."""
        if filepath is None:
            if not self.dirpath:
                raise ConfigError("to_yaml(): this callback has no dirpath yet (it is known "
                                  "once fit began); pass the file to write.")
            filepath = os.path.join(self.dirpath, "best_k_models.yaml")
        lines = [f"{json.dumps(str(path))}: {_yaml_number(float(score))}"
                 for path, score in self.best_k_models.items()]
        Path(filepath).write_text("\n".join(lines) + "\n" if lines else "{}\n",
                                  encoding="utf-8")

    # -- ckpt_path="best" -------------------------------------------------------------------------

    @hookimpl
    def resolve_ckpt_path(self, trainer, ckpt_path: str) -> str | None:
        if ckpt_path == "last":
            return self._resolve_last(trainer)
        if ckpt_path != "best":
            return None
        if self.best_model_path and Path(self.best_model_path).exists():  # trained here
            return self.best_model_path
        from ptrain.trainer import run_folders

        root = Path(trainer.run_root)
        folders = [run / "checkpoints" for run in run_folders(root)]
        if trainer.run_dir is not None:  # this trainer's own last run first (workers held state)
            folders.insert(0, Path(trainer.run_dir) / "checkpoints")
        own = self._own_folder(trainer)
        if own is not None:
            folders.insert(0, own)
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

    def _resolve_last(self, trainer) -> str | None:
        """With a folder of its own (``dirpath``): the ``last.ckpt`` this callback wrote, else
        the newest ``last*.ckpt`` there (none there: a :class:`CheckpointError`); ``None`` (the
        run folders' ``last.ckpt``) otherwise."""
        folder = self._own_folder(trainer)
        if folder is None:
            return None
        if self.last_model_path and Path(self.last_model_path).exists():
            return self.last_model_path
        candidates = sorted(self._last_files(folder), key=lambda p: p.stat().st_mtime)
        if not candidates:
            raise NoCheckpointYetError(
                f"ckpt_path='last' found no {self.CHECKPOINT_NAME_LAST}*{self.FILE_EXTENSION} in "
                f"the checkpoint callback's dirpath {str(folder)!r} (it writes one there when "
                f"save_last is on); give a checkpoint's path, or start without ckpt_path.")
        return str(candidates[-1])

    def _last_files(self, folder: Path) -> list[Path]:
        """The files in ``folder`` named as this callback names ``last.ckpt``."""
        prefix = self.CHECKPOINT_NAME_LAST.split("{", 1)[0]
        return [p for p in folder.glob(f"{glob.escape(prefix)}*{self.FILE_EXTENSION}")
                if p.is_file()] if folder.is_dir() else []

    # -- state -----------------------------------------------------------------------------------

    @hookimpl(specname="state_dict")
    def _checkpoint_state(self, trainer) -> dict[str, Any]:
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
                "last_model_path": rel(self.last_model_path),
                "current_score": self.current_score,
                "due_for_deletion": self._due_state(rel)}

    def _due_state(self, rel: Callable[[str], str]) -> dict[str, list[int]]:
        """The files due for deletion (``rel``: how a path is stored) with their size and
        modification time: deleted by the run that resumes, if a kill came before this one
        deleted them (:meth:`_restore_due`)."""
        return {rel(p): list(identity) for p, identity in self._due.items() if identity}

    def _restore_due(self, trainer, due: dict[str, list[int]],
                     full: Callable[[str], str]) -> None:
        """A fit resumed from a checkpoint listing ``due`` (:meth:`_due_state`; ``full``: a
        stored path as a path) deletes them as it begins (:meth:`_tidy`), as far as they are
        still as the callback left them."""
        if trainer.stage_call == "fit":
            self._due = {full(p): (int(identity[0]), int(identity[1]))
                         for p, identity in due.items()}
            self._ready = set(self._due)  # the checkpoint holding them was complete

    @hookimpl(specname="load_state_dict")
    def _restore_state(self, trainer, state: dict[str, Any]) -> None:
        """A resumed run continues the same top-k (in its run folder, where ptrain resumes) when
        it monitors the same metric the same way; otherwise it starts a new top-k. Either way,
        the files the checkpoint lists as due for deletion are deleted as the fit begins, as
        far as they are still as the callback left them (:meth:`_tidy`)."""
        folder = self._folder(trainer)

        def full(path: str) -> str:
            return str(folder / path) if path else ""

        self._restore_due(trainer, state.get("due_for_deletion", {}), full)
        if state.get("monitor") != self.monitor or state.get("mode") != self.mode:
            return

        self.best_model_path = full(state["best_model_path"])
        self.best_model_score = state["best_model_score"]
        self.best_k_models = {full(p): s for p, s in state["best_k_models"].items()}
        self.kth_best_model_path = full(state["kth_best_model_path"])
        self.kth_value = state["kth_value"]
        self.last_model_path = full(state["last_model_path"])
        self.current_score = state.get("current_score")
        resumed = Path(os.path.realpath(trainer.ckpt_path)) if trainer.ckpt_path else None
        if trainer.stage_call == "fit" and resumed is not None \
                and resumed.parent == Path(os.path.realpath(folder)):
            # the newest file written at that state is the one resumed from (a link's target:
            # with save_last="link", last.ckpt links to it as in a run never stopped)
            self._last_checkpoint_saved = str(folder / resumed.name)
            if Path(trainer.ckpt_path).name == LAST:  # the run's newest state, not an older
                self._due_if_unknown(trainer)  # top-k file a user goes back to on purpose

    def _due_if_unknown(self, trainer) -> None:
        """As a fit resumes from ``last.ckpt`` in this callback's folder: a top-k file the record
        on disk names but the state resumed from does not was written after that state (a kill
        came before the ``last.ckpt`` that would hold it). A fit resumed from an older top-k
        file keeps the later ones (a user went back to it; they are theirs to delete). Such a
        file is no part of the resumed run, and a name made of a metric would stay an orphan:
        it is due for deletion (the record is first rewritten to the resumed ranking:
        :meth:`_tidy`)."""
        named = self._recorded(self._record_folder(trainer)) or set()
        known = {self.best_model_path, self.last_model_path, *self.best_k_models, *self._due}
        for path in sorted(named - known):
            identity = _identity(path)
            if identity is not None:
                self._due[path] = identity
                self._ready.add(path)
