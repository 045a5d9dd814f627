"""The training and validation loops: epochs, batches, accumulation, validation, stopping, resume.

Hot-path rules kept here: per batch, a fixed handful of hook calls and no host-device sync. The
loss is kept as a tensor in a window that is checked for NaN/Inf (one sync) only at check points:
every ``log_every_n_steps`` optimizer steps, after each validation, at the end of each epoch and
before every checkpoint.
"""

from __future__ import annotations

import itertools
import math
import time
import warnings
from typing import TYPE_CHECKING, Any, Iterator

import torch

from ptrain import checkpoint_io
from ptrain.data import loader_batch_size, stop_workers
from ptrain.errors import ConfigError, ModelError, NonFiniteLossError
from ptrain.finite_state import last_written_checkpoint, state_error, state_is_finite
from ptrain.optimizers import check_gradients_reach, step_scheduler
from ptrain.evaluation_loop import (limit_batches, loader_length, run_sanity_check,
                                    run_validation)
from ptrain.trainer import no_limit

if TYPE_CHECKING:
    from ptrain.trainer import Trainer


def check_losses_finite(trainer: Trainer) -> None:
    """Raise :class:`NonFiniteLossError` naming the first non-finite loss since the last check."""
    window = trainer.loss_window
    if not window:
        return
    # a DTensor loss (under loss_parallel) whole, as its value on this rank: a check's ops and
    # the message's number work on plain tensors
    each = [loss.full_tensor() if hasattr(loss, "full_tensor") else loss
            for *_, loss in window]
    try:  # the usual case: 0-dim losses of one dtype, stacked without a copy each
        losses = torch.stack(each)
    except RuntimeError:  # shapes or dtypes differ
        losses = torch.stack([loss.float().reshape(()) for loss in each])
    finite = torch.isfinite(losses)
    if bool(finite.all()):
        window.clear()
        return
    first = int((~finite).reshape(len(window), -1).any(dim=1).nonzero()[0, 0])
    epoch, batch_idx, step, _ = window[first]
    loss = each[first]
    window.clear()
    saved = last_written_checkpoint(trainer)
    kept = (f" The last checkpoint written, {str(saved)!r}, was saved before that and is kept."
            if saved is not None else " No checkpoint was written over.")
    hint = trainer.precision_policy.non_finite_hint  # a cause the precision is known for
    raise NonFiniteLossError(
        f"the training loss became {float(loss)} at epoch {epoch}, batch {batch_idx} (global step "
        f"{step}); training stopped.{kept} Lower the learning rate, clip gradients "
        f"(--gradient-clip-val), or check the data of that batch." + (f" {hint}" if hint else "")
    )


def explain_loss(module: torch.nn.Module, loss: Any) -> ModelError | None:
    """Why ``loss``, as ``training_step`` returned it, can't be optimized, or ``None`` when it
    is not the loss's fault. Called only after the step failed: nothing is checked per step."""
    where = f"{type(module).__qualname__}.training_step"
    if not isinstance(loss, torch.Tensor):
        return ModelError(f"{where} returned {type(loss).__qualname__} {loss!r:.60} as the loss; "
                          f"return the loss as a tensor, as the loss function gives it (not its "
                          f".item() or float()), a dict with it under 'loss', or None to skip "
                          f"the batch.")
    if loss.numel() != 1:
        return ModelError(f"{where} returned a loss of shape {tuple(loss.shape)}; the loss must "
                          f"be one number: reduce it (e.g. .mean() or .sum()).")
    if not (loss.dtype.is_floating_point or loss.dtype.is_complex):
        return ModelError(f"{where} returned a loss of dtype {loss.dtype}, which has no "
                          f"gradient; compute it in floating point from the model's output.")
    if not loss.requires_grad:
        return ModelError(f"{where} returned a loss that is not connected to the model's "
                          f"parameters (no grad_fn): it was computed under torch.no_grad(), or "
                          f"through .detach(), .item() or .data. Return the loss as computed "
                          f"from the model's output.")
    return None


def resume_batch(saved: dict[str, Any], now: dict[str, Any], say: bool = True) -> int:
    """The batch of the checkpoint's epoch that a resumed run goes on after. Resuming mid-epoch
    drops the batches the checkpointed run already trained on; if the training loader's batch
    size changed since, what was trained is counted in samples, so none of the epoch's samples
    is skipped (up to a batch of them is trained again), and it is said. A changed loader
    length or number of processes can't be reconciled (the epoch's data is not what the
    checkpointed run saw): that is said too. ``saved`` is the checkpoint's loop state, ``now``
    this run's (their ``batch_size``, ``loader_batches``, ``world_size``); ``say``: whether this
    process says it (global rank 0: every rank computes the same, one says it)."""
    batch = saved["batch"]
    if batch == 0 or saved["epoch_rng"] is None:  # at an epoch boundary: nothing to reconcile
        return batch
    where = f"the checkpoint was saved after batch {batch} of epoch {saved['epoch']}"
    before, after = saved.get("batch_size"), now["batch_size"]
    warn = warnings.warn if say else _silent
    if saved.get("world_size") not in (None, now["world_size"]):
        saved_by = f"{saved['world_size']} process{'es' if saved['world_size'] != 1 else ''}"
        warn(
            f"resuming mid-epoch: {where} by {saved_by}; {now['world_size']} run now, so each "
            f"process's share of the epoch differs from the checkpointed run's and the rest of "
            f"this epoch repeats some samples and leaves others out. Resume with {saved_by}, or "
            f"from a checkpoint saved at an epoch's end.", stacklevel=3)
    elif before is not None and after is not None and before != after:
        samples = batch * before
        batch = samples // after
        again = samples - batch * after
        warn(
            f"resuming mid-epoch: {where} with batches of {before} ({samples} samples); the "
            f"training loader's batches now hold {after}, so the epoch goes on after its "
            f"first {batch} batches of {after}"
            + (f", training the {again} samples before that point again." if again else
               ", at the same sample.")
            + " Resume from a checkpoint saved at an epoch's end to start with a whole epoch.",
            stacklevel=3)
    elif saved.get("loader_batches") not in (None, now["loader_batches"]):
        warn(
            f"resuming mid-epoch: {where}, when the training loader had "
            f"{saved['loader_batches']} batches; it has {now['loader_batches']} now, so the "
            f"rest of the epoch is not the rest of the data the checkpointed run saw (it goes "
            f"on after batch {batch}). Resume with the same data, or from a checkpoint saved "
            f"at an epoch's end.", stacklevel=3)
    return batch


def _silent(*args: Any, **kwargs: Any) -> None:
    """What a rank other than 0 does with a warning every rank would give alike."""


class FitLoop:
    """Runs epochs until a limit or an agreed stop; resumes from ``checkpoint`` exactly."""

    def __init__(self, trainer: Trainer, checkpoint: dict[str, Any] | None):
        self.trainer = trainer
        self.hook = trainer.hook
        self.step_hooks = trainer.step_hooks
        self.accumulate = trainer.accumulate_grad_batches
        self.automatic = trainer.module.automatic_optimization
        self.clears_before_backward = trainer.clears_gradients_before_backward
        # with clears_before_backward: an optimizer step (or the start) came since the clearing,
        # so the next backward starts a window (whoever decided where windows end)
        self.gradients_stale = True
        self.batches_trained = False  # the running epoch's batches all ran (run_epoch)
        self.step_output: Any = None  # what the last training_step returned, for the hooks
        if not self.automatic and self.accumulate > 1:
            raise ConfigError(
                f"accumulate_grad_batches={self.accumulate} applies to automatic optimization; "
                f"{type(trainer.module).__name__} optimizes manually, so it accumulates itself: "
                f"step its optimizers every {self.accumulate} batches and leave the gradients "
                f"unsynchronised in the others (ptrain_toggling.toggle_model(opt, sync_grad=False)"
                f"). Remove accumulate_grad_batches."
            )
        # limit_train_batches=0: fit trains nothing (said in run()), as in Lightning
        self.disabled = trainer.limit_train_batches == 0
        self.num_batches = limit_batches(loader_length(trainer.train_dataloader),
                                         trainer.limit_train_batches)
        trainer.num_training_batches = self.num_batches
        if self.num_batches == 0 and not self.disabled:
            raise ConfigError(
                f"no training batches: the training dataloader has "
                f"{loader_length(trainer.train_dataloader)} and limit_train_batches="
                f"{trainer.limit_train_batches} keeps none of them. Raise the limit (an int "
                f"counts batches, a float is a fraction of them) or check the dataset."
            )
        # check_val_every_n_epoch=None: every val_interval batches counted across epochs
        self.across_epochs = trainer.check_val_every_n_epoch is None
        self.val_interval = 0 if self.disabled else self._val_interval()
        # reload_dataloaders_every_n_epochs: the epochs the loaders were last asked for
        self.reload_every = trainer.reload_dataloaders_every_n_epochs
        self.train_loaded = self.val_loaded = None
        self.step_schedulers = [s for s in trainer.lr_schedulers if s["interval"] == "step"]
        self.gradients_checked = False  # check_gradients_reach, once, before the first step
        # under manual optimization the module steps its schedulers itself, as in Lightning
        epoch = [s for s in trainer.lr_schedulers
                 if s["interval"] == "epoch" and self.automatic]
        # as Lightning: an epoch scheduler steps right after the epoch's last optimizer step
        # (before that batch's validation); one that monitors a metric at the epoch's end
        self.last_batch_schedulers = [s for s in epoch if s["monitor"] is None]
        self.epoch_end_schedulers = [s for s in epoch if s["monitor"] is not None]
        self.last_published = 0
        trainer.loss_window = []
        self.resume_rng: dict[str, Any] | None = None
        #: the training iterator made before the training hooks
        #: (``trainer.iterates_training_data_before_train_start``), for the fit's first epoch
        self.first_iterator: Iterator[Any] | None = None
        loader_batches = loader_length(trainer.train_dataloader)
        # what a mid-epoch resume compares (see resume_batch); saved with every checkpoint
        state = {"epoch": 0, "batch": 0, "epoch_rng": None, "elapsed_before": 0.0,
                 "batch_size": loader_batch_size(trainer.train_dataloader),
                 "loader_batches": None if math.isinf(loader_batches) else loader_batches,
                 "world_size": trainer.world_size}
        self.resumed = checkpoint is not None  # a fit that starts at its limits says why
        if checkpoint is not None:
            loop = checkpoint["loop"]
            batch = resume_batch(loop, state, say=trainer.is_global_zero)
            state.update(epoch=loop["epoch"], batch=batch, epoch_rng=loop["epoch_rng"],
                         elapsed_before=loop["elapsed"])
            trainer.global_step = self.last_published = loop["global_step"]
            self.resume_rng = checkpoint["rng"]
        elif trainer.fit_progress is not None:  # this trainer fitted before: its counters go on
            state["epoch"] = trainer.fit_progress["epoch"]
            trainer.global_step = self.last_published = trainer.fit_progress["global_step"]
        # from the fit's start (on_train_start), the epoch it goes on with, as in Lightning
        trainer.current_epoch = state["epoch"]
        trainer.loop_state = state
        self.train_loaded = self.val_loaded = state["epoch"]  # asked for when the stage began

    def _val_interval(self) -> float:
        t = self.trainer
        interval = t.val_check_interval
        if isinstance(interval, float):
            return math.inf if math.isinf(self.num_batches) else max(
                1, int(self.num_batches * interval))
        if interval > self.num_batches and not self.across_epochs:
            raise ConfigError(f"val_check_interval ({interval}) is more than the number of "
                              f"training batches per epoch ({self.num_batches}); use a smaller "
                              f"count, or a fraction such as 0.5.")
        return interval

    # -- epochs ----------------------------------------------------------------------------------

    def run(self) -> None:
        t = self.trainer
        t.should_stop = False
        t.hook.on_loop_start(trainer=t, loop="fit")
        if not self._limits_reached():
            run_sanity_check(t)
        elif self.resumed and t.is_global_zero:
            limit = ("max_epochs", t.max_epochs) if not no_limit(t.max_epochs) and \
                t.loop_state["epoch"] >= t.max_epochs else ("max_steps", t.max_steps)
            warnings.warn(
                f"fit: the checkpoint {t.ckpt_path} has trained {t.loop_state['epoch']} "
                f"epoch(s), {t.global_step} step(s), which already reaches {limit[0]}="
                f"{limit[1]}, so nothing is trained, as in Lightning. Raise {limit[0]} "
                f"(--{limit[0].replace('_', '-')}) above that to train further.", stacklevel=2)
        elif t.fit_progress is not None and t.is_global_zero:
            warnings.warn(
                f"fit: this trainer's earlier fit already reached its limits (epoch "
                f"{t.loop_state['epoch']}, step {t.global_step}; max_epochs={t.max_epochs}, "
                f"max_steps={t.max_steps}), so nothing is trained, as in Lightning. Raise "
                f"trainer.max_epochs or trainer.max_steps to train further, or fit with a new "
                f"Trainer to start again.", stacklevel=2)
        if self.disabled:
            if t.is_global_zero:
                warnings.warn("limit_train_batches=0: fit trains nothing (after the sanity "
                              "check), as in Lightning. Remove it to train.", stacklevel=2)
            t.hook.on_loop_end(trainer=t, loop="fit")
            return
        # max_time counts training from here, after set-up and the sanity check, as
        # Lightning's Timer starts at on_train_start (a resumed run adds its earlier time)
        t._start_time = time.monotonic()
        if (t.iterates_training_data_before_train_start and not self.resumed
                and not self._limits_reached()):
            if t.loop_state["epoch"] == 0:  # its first epoch reads it (else one made later)
                t.loop_state["epoch_rng"] = checkpoint_io.capture_rng_states()
            self.first_iterator = iter(t.train_dataloader)
        t.hook.on_loop_start(trainer=t, loop="train")
        try:
            while not self._limits_reached():
                stopped_early = self.run_epoch()
                if stopped_early or (t.should_stop and self._minimums_met(epoch_done=True)):
                    break
        except BaseException:
            # an epoch that failed (in a step, a validation, its end hooks) is not counted: the
            # counter stays at its index, as Lightning's. A next fit of this trainer runs it
            # again unless its batches were all trained (it failed in its end hooks), as there
            epoch = t.loop_state["epoch"]
            if self.batches_trained and t.loop_state["batch"]:
                epoch += 1
            t.fit_progress = {"epoch": epoch, "global_step": t.global_step}
            raise
        # Lightning's meaning after fit: the epochs run, one stopped part-way included
        t.current_epoch = t.loop_state["epoch"] + (1 if t.loop_state["batch"] else 0)
        t.fit_progress = {"epoch": t.current_epoch, "global_step": t.global_step}
        t.hook.on_loop_end(trainer=t, loop="train")
        t.hook.on_loop_end(trainer=t, loop="fit")

    def _limits_reached(self) -> bool:
        t = self.trainer
        epoch = t.loop_state["epoch"]
        return ((not no_limit(t.max_epochs) and epoch >= t.max_epochs)
                or (not no_limit(t.max_steps) and t.global_step >= t.max_steps))

    def _minimums_met(self, epoch_done: bool) -> bool:
        t = self.trainer
        epochs_done = t.current_epoch + (1 if epoch_done else 0)
        return ((t.min_epochs is None or epochs_done >= t.min_epochs)
                and (t.min_steps is None or t.global_step >= t.min_steps))

    def _batches(self, start: int) -> Iterator[tuple[int, Any]]:
        """The epoch's ``(batch_idx, batch)`` pairs from ``start``. On resume the generator states
        are replayed so the remaining batches (and every random draw after them) are those of an
        unbroken run: the epoch's data order comes from the state saved at its start, everything
        after the skipped batches from the state saved with the checkpoint. The pairs come from
        C iterators (no Python call per batch); they end early when the loader runs dry. A loader
        without a length is read one batch ahead (:meth:`_one_ahead`)."""
        t = self.trainer
        state = t.loop_state
        resume_rng, self.resume_rng = self.resume_rng, None
        first, self.first_iterator = self.first_iterator, None
        if first is not None and state["epoch"] == 0:  # made before the training hooks
            return self._pairs(first, start)
        if start == 0 and state["epoch_rng"] is None:  # a new epoch
            if resume_rng is not None:  # resumed at an epoch boundary
                checkpoint_io.restore_rng_states(resume_rng)
                resume_rng = None
            state["epoch_rng"] = checkpoint_io.capture_rng_states()
        elif start >= self.num_batches:  # resumed after the epoch's last batch
            checkpoint_io.restore_rng_states(resume_rng)
            return iter(())
        else:
            checkpoint_io.restore_rng_states(state["epoch_rng"])
        iterator = iter(t.train_dataloader)
        for _ in range(start):  # fetch and drop the batches the checkpointed run already used
            next(iterator)
        if resume_rng is not None:
            checkpoint_io.restore_rng_states(resume_rng)
        return self._pairs(iterator, start)

    def _pairs(self, iterator: Iterator[Any], start: int) -> Iterator[tuple[int, Any]]:
        """``(batch_idx, batch)`` from ``iterator`` (positioned at batch ``start``), up to the
        epoch's batch count."""
        if math.isinf(self.num_batches):
            return self._one_ahead(enumerate(iterator, start))
        return enumerate(itertools.islice(iterator, self.num_batches - start), start)

    def _one_ahead(self, pairs: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
        """``pairs``, each fetched before the one before it runs, so that the epoch's last batch
        is known while it runs (``trainer.is_last_batch``): it takes its optimizer step at the
        end of an accumulation window, and the epoch's validation, as a sized loader's does.
        A dataset whose code runs between items (a generator's, after its last ``yield``) runs
        it one batch earlier, as under Lightning."""
        t = self.trainer
        ahead = next(pairs, None)
        while ahead is not None:
            current, ahead = ahead, next(pairs, None)
            t.is_last_batch = ahead is None
            yield current

    def run_epoch(self) -> bool:
        """One epoch (or its rest, on resume); True when it ended before its last batch."""
        t, hook, state = self.trainer, self.hook, self.trainer.loop_state
        t.current_epoch = state["epoch"]
        if (self.reload_every and state["batch"] == 0
                and t.current_epoch - self.train_loaded >= self.reload_every):
            self._reload_training_data()
        validate_this_epoch = (t.val_dataloader is not None and t.limit_val_batches != 0
                               and (self.across_epochs
                                    or (t.current_epoch + 1) % t.check_val_every_n_epoch == 0))
        # the batch count validation goes by, and the batch that ends an epoch's count
        offset, end = 0, self.num_batches
        if self.across_epochs:
            offset = 0 if math.isinf(self.num_batches) else state["epoch"] * self.num_batches
            end = -1
        with t.metrics.epoch_level():
            hook.on_epoch_start(trainer=t)
        stopped_early = False
        steps_before, first_batch = t.global_step, state["batch"]
        pending_grads = False
        validated_last = True  # whether the last batch seen was followed by a validation
        ran_dry = False  # a loader without a length ended its epoch
        t.is_last_batch = False
        self.batches_trained = False  # the epoch's batch loop ended (its end hooks come next)
        for batch_idx, batch in self._batches(state["batch"]):
            loss = self.train_batch(batch, batch_idx)
            # a checkpoint's deferred copies overlap this batch's forward and backward only:
            # a batch that took no optimizer step (mid-window, or manual optimization) waits
            # here, before its hooks and a validation (which may swap weights through .data);
            # after a step this costs a lock (the step waited)
            t.wait_for_checkpoint_copies()
            pending_grads = self.automatic and not t.sync_gradients
            state["batch"] = batch_idx + 1
            if t.is_last_batch and self.last_batch_schedulers:
                self._step_epoch_schedulers(self.last_batch_schedulers)
            if self.step_hooks.has_on_train_step_end:
                self.step_hooks.on_train_step_end(trainer=t, batch=batch, batch_idx=batch_idx,
                                                  loss=loss, output=self.step_output)
            ran_check = False
            if t.global_step // t.log_every_n_steps > self.last_published // t.log_every_n_steps:
                self.last_published = t.global_step
                t.metrics.publish_step()
                ran_check = True
            validated_last = validate_this_epoch and (
                (offset + batch_idx + 1) % self.val_interval == 0 or batch_idx + 1 == end
                or (t.is_last_batch and not self.across_epochs))
            if validated_last:
                self._validate()
                ran_check = True
            # a background save here may copy the optimized tensors while the next batch's
            # forward and backward run (Trainer.save_checkpoint); one anywhere else may not
            with t._between_two_steps():
                self.step_hooks.on_train_batch_end(trainer=t, batch=batch, batch_idx=batch_idx,
                                                   loss=loss)
            if ran_check:  # after on_train_batch_end: a stop a callback asks for there counts
                self.agree_on_stop()
            if t.max_steps is not None and 0 <= t.max_steps <= t.global_step:  # -1: no limit
                stopped_early = not t.is_last_batch
                break
            if t.should_stop and ran_check and self._minimums_met(epoch_done=False):
                stopped_early = not t.is_last_batch
                break
        else:
            # a loader whose length said more batches than it gave (an empty one without a
            # length too): its last batch ran as any other, and its epoch ends here
            ran_dry = not t.is_last_batch and state["batch"] < self.num_batches
        self.batches_trained = not stopped_early
        # a checkpoint's deferred copies overlap the next batch only: what comes now (the
        # epoch's and fit's end, a callback that swaps in averaged weights) may change them
        t.wait_for_checkpoint_copies()
        if self.automatic and t.global_step == steps_before and state["batch"] > first_batch:
            raise ModelError(
                f"{type(t.module).__qualname__}.training_step returned None for all "
                f"{state['batch'] - first_batch} batches of epoch {t.current_epoch}, so nothing "
                f"was trained. Return the loss (a tensor, or a dict with it under 'loss'); None "
                f"skips a batch, for the few a step can't use.")
        if ran_dry:
            if pending_grads:
                self._step_optimizers()
            self._step_epoch_schedulers(self.last_batch_schedulers)
            if validate_this_epoch and not validated_last and not self.across_epochs:
                self._validate()
                self.agree_on_stop()
        t.metrics.preview_epoch("train")
        with t.metrics.epoch_level():
            hook.on_epoch_metrics(trainer=t, stage="train")
        t.metrics.publish_step()
        t.metrics.publish_epoch("train")
        if not stopped_early:
            self._step_epoch_schedulers(self.epoch_end_schedulers)
            state.update(epoch=t.current_epoch + 1, batch=0, epoch_rng=None)
        hook.on_epoch_end(trainer=t)
        self.agree_on_stop()
        return stopped_early

    # -- data --------------------------------------------------------------------------------

    def _validate(self) -> None:
        """A validation pass; with ``reload_dataloaders_every_n_epochs``, over a validation
        loader asked for again when that many epochs passed since it last was."""
        t = self.trainer
        if self.reload_every and t.current_epoch - self.val_loaded >= self.reload_every:
            stop_workers(t.val_dataloader)
            t.val_dataloader = t._dataloader("validate")
            self.val_loaded = t.current_epoch
        run_validation(t)

    def _reload_training_data(self) -> None:
        """``reload_dataloaders_every_n_epochs``: the training loader asked for again (at the
        start of an epoch), and what depends on its length counted again."""
        t = self.trainer
        stop_workers(t.train_dataloader)
        t.train_dataloader = t._dataloader("train")
        if t.iterates_reloaded_training_data_twice:
            iter(t.train_dataloader)  # made and dropped, for its random draws (see Trainer)
        self.train_loaded = t.current_epoch
        length = loader_length(t.train_dataloader)
        self.num_batches = t.num_training_batches = limit_batches(length, t.limit_train_batches)
        if self.num_batches == 0:
            raise ConfigError(f"no training batches: the training dataloader asked for again at "
                              f"epoch {t.current_epoch} (reload_dataloaders_every_n_epochs="
                              f"{self.reload_every}) has {length}, and limit_train_batches="
                              f"{t.limit_train_batches} keeps none of them.")
        self.val_interval = self._val_interval()
        t.loop_state.update(batch_size=loader_batch_size(t.train_dataloader),
                            loader_batches=None if math.isinf(length) else length)

    # -- batches -----------------------------------------------------------------------------

    def train_batch(self, batch: Any, batch_idx: int) -> Any:
        t, hook = self.trainer, self.step_hooks
        t.batch_idx = batch_idx
        if not math.isinf(self.num_batches):  # an unsized loader's is set one batch ahead
            t.is_last_batch = batch_idx + 1 == self.num_batches
        t.sync_gradients = (batch_idx + 1) % self.accumulate == 0 or t.is_last_batch
        batch = t.metrics.batch = hook.transfer_batch(trainer=t, batch=batch)
        if hook.has_on_batch_start:
            hook.on_batch_start(trainer=t, stage="train", batch=batch, batch_idx=batch_idx)
        output = self.step_output = hook.model_step(trainer=t, stage="train", batch=batch,
                                                    batch_idx=batch_idx)
        if isinstance(output, dict):
            if "loss" not in output and self.automatic:
                raise ModelError(
                    f"{type(t.module).__qualname__}.training_step returned a dict without "
                    f"'loss' (keys: {', '.join(map(repr, output)) or 'none'}); put the loss "
                    f"to optimize under 'loss', or return it alone.")
            loss = output.get("loss")
        else:
            loss = output
        if loss is None:  # the module skipped this batch
            return None
        try:  # free when nothing fails; a failure caused by the loss is named
            t.loss_window.append((t.current_epoch, batch_idx, t.global_step, loss.detach()))
            if self.automatic:
                # Trainer.run_backward's steps, inlined: the hot path saves a call per batch
                scaled = loss / self.accumulate if self.accumulate > 1 else loss
                if self.clears_before_backward and self.gradients_stale:
                    for optimizer in t.optimizers:
                        self._clear_gradients(optimizer)
                    self.gradients_stale = False
                if hook.has_on_before_backward:
                    hook.on_before_backward(trainer=t, loss=scaled)
                hook.backward(trainer=t, loss=scaled)
                if hook.has_on_after_backward:
                    hook.on_after_backward(trainer=t)
                if t.sync_gradients:
                    self._step_optimizers()
        except (AttributeError, TypeError, RuntimeError) as exc:
            explained = explain_loss(t.module, loss)
            if explained is None:
                raise
            raise explained from exc
        return loss

    def _step_optimizers(self) -> None:
        t = self.trainer
        hooks = self.step_hooks
        if not self.gradients_checked:
            check_gradients_reach(t.optimizers, t.module, stop=t.stops_on_unreached_optimizer)
            self.gradients_checked = True
        t.wait_for_checkpoint_copies()
        for optimizer in t.optimizers:
            # Trainer.run_optimizer_step's steps, inlined: the hot path saves a call per batch
            if hooks.has_on_before_optimizer_step:
                hooks.on_before_optimizer_step(trainer=t, optimizer=optimizer)
            if t.gradient_clip_val is not None or hooks.clips_every_step:
                hooks.clip_gradients(trainer=t, optimizer=optimizer)
            hooks.optimizer_step(trainer=t, optimizer=optimizer)
            t.global_step += 1
            if not self.clears_before_backward:
                self._clear_gradients(optimizer)
        self.gradients_stale = True
        for entry in self.step_schedulers:
            if t.global_step % entry["frequency"] == 0:
                step_scheduler(entry, t.callback_metrics)

    def _clear_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """``on_before_zero_grad``, then the optimizer's gradients set to ``None``."""
        if self.step_hooks.has_on_before_zero_grad:
            self.step_hooks.on_before_zero_grad(trainer=self.trainer, optimizer=optimizer)
        optimizer.zero_grad(set_to_none=True)

    def _step_epoch_schedulers(self, entries: list[dict[str, Any]]) -> None:
        t = self.trainer
        for entry in entries:
            if (t.current_epoch + 1) % entry["frequency"] == 0:
                step_scheduler(entry, t.callback_metrics)

    # -- stopping -----------------------------------------------------------------------------

    def agree_on_stop(self) -> None:
        """Check the losses, then agree across processes on ``should_stop`` and ``max_time``."""
        t = self.trainer
        check_losses_finite(t)
        time_up = t.max_time is not None and t._elapsed() >= t.max_time
        # the state check rides on the flags' reduction and host read: no extra sync
        flags = torch.stack([torch.tensor(float(t.should_stop), device=t.device),
                             torch.tensor(float(time_up), device=t.device),
                             (~state_is_finite(t)).float()])
        reduced = t.hook.reduce_metrics(trainer=t, metrics={"flags": flags}, op="max")["flags"]
        stop, time_up, state_bad = (bool(v) for v in reduced.tolist())
        if state_bad:
            raise state_error(t)
        t.finite_state_step = t.global_step
        t.should_stop = stop or time_up
