"""The ``batch-size-finder`` callback: the largest training batch size that fits in memory.

In ``setup(stage="fit")`` (``trylast``: after the other plugins' plain ``setup``; before the
``lr-finder``, whose search runs after every ``setup``), on every rank: trials of
``steps_per_trial`` real optimizer steps (see :mod:`.steps`) on the training loader rebuilt at
each size, doubling from the loader's batch size (or ``init``) until a trial runs out of memory or
reaches ``max_batch_size``, then a binary search between the last size that fit and the first
that did not. The training state is restored after every trial (see :mod:`.snapshot`), so each
trial starts from the same weights, the same (empty) optimizer state and free memory.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader

from ptrain import ConfigError, hookimpl
from ptrain.data import rebuild_dataloader
from ptrain_finders.common import Finder, base_lr, check_scalable, scale_learning_rates, \
    write_json
from ptrain_finders.snapshot import TrainingSnapshot, optimizers_to_snapshot
from ptrain_finders.steps import StepRunner, cycle, is_out_of_memory, release_memory

DATA_NAME = "batch_size_finder.json"
SCALE_LR = ("none", "linear", "sqrt")
#: Optimizers that scale each parameter's step by its own gradient statistics: the square-root
#: rule suits them; plain (momentum) SGD takes the linear rule.
_ADAPTIVE = tuple(getattr(torch.optim, name) for name in (
    "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop", "SparseAdam",
    "Adafactor") if hasattr(torch.optim, name))


def lr_rule(optimizer: torch.optim.Optimizer) -> str | None:
    """``"sqrt"`` for an adaptive optimizer, ``"linear"`` for SGD, ``None`` when unknown."""
    inner = optimizers_to_snapshot(optimizer)[-1]  # ZeRO: the optimizer class it partitions
    if isinstance(inner, _ADAPTIVE):
        return "sqrt"
    if isinstance(inner, torch.optim.SGD):
        return "linear"
    return None


def lr_factor(rule: str, old: int, new: int) -> float:
    return new / old if rule == "linear" else math.sqrt(new / old)


#: how far ``ptrain tune``'s candidate lets the batch grow: on the CPU nothing runs out, and a
#: batch of the whole dataset is no training configuration
TUNED_GROWTH = 16


class BatchSizeFinder(Finder):
    """``-p batch-size-finder``: find the largest batch size that trains without running out of
    memory, then train with it.

    :param init: the first size tried (default: the training loader's batch size).
    :param max_batch_size: the largest size tried (default: the number of samples one rank sees
        per epoch: the dataset's length, or its shard's under a ``DistributedSampler``).
    :param max_growth: try at most this many times the first size (default: no such limit);
        on a device that never runs out (the CPU's memory is the machine's) it keeps the search
        and the batch reasonable.
    :param steps_per_trial: optimizer steps per trial (the optimizer state is allocated in the
        first, so at least 2 show the steady state; default 3).
    :param margin: train with ``floor(found x margin)``: 1.0 takes the size that fit; below 1
        leaves headroom for what the trials did not exercise (see the card).
    :param scale_lr: ``none``, ``linear`` (lr x new/old) or ``sqrt`` (lr x sqrt(new/old)):
        rescale every param group's learning rate for the new batch size.
    :param then: ``fit`` (train at the result) or ``stop`` (end the run after the search).

    After the search: ``trials`` (``[{"batch_size", "fits"}]`` in the order tried), ``found``,
    ``batch_size`` (what training uses: found x margin), ``initial`` and ``seconds``, on every
    rank. A run resumed from a checkpoint holding the result searches nothing and sets only
    ``batch_size``, to the checkpoint's.
    """

    name = "batch-size-finder"

    def __init__(self, init: int | None = None, max_batch_size: int | None = None,
                 steps_per_trial: int = 3, margin: float = 1.0, scale_lr: str = "none",
                 then: str = "fit", max_growth: int | None = None):
        super().__init__(then)
        if max_growth is not None and max_growth < 2:
            raise ConfigError(f"batch-size-finder: max_growth={max_growth} must be at least 2 "
                              f"(or unset: no limit besides max_batch_size).")
        self.max_growth = max_growth
        if init is not None and init < 1:
            raise ConfigError(f"batch-size-finder: init={init} must be at least 1 (or unset: "
                              f"start from the training loader's batch size).")
        if max_batch_size is not None and max_batch_size < 1:
            raise ConfigError(f"batch-size-finder: max_batch_size={max_batch_size} must be at "
                              f"least 1 (or unset: the number of training samples per rank).")
        if init is not None and max_batch_size is not None and init > max_batch_size:
            raise ConfigError(f"batch-size-finder: init ({init}) is above max_batch_size "
                              f"({max_batch_size}); lower init or raise max_batch_size.")
        if steps_per_trial < 1:
            raise ConfigError(f"batch-size-finder: steps_per_trial={steps_per_trial} must be at "
                              f"least 1 (default 3: the first step also allocates the optimizer "
                              f"state).")
        if not 0 < margin <= 1:
            raise ConfigError(f"batch-size-finder: margin={margin} must be in (0, 1]: training "
                              f"uses floor(found x margin); 1 takes the size that fit, 0.9 "
                              f"leaves 10% headroom.")
        if scale_lr not in SCALE_LR:
            raise ConfigError(f"batch-size-finder: scale_lr={scale_lr!r} is not one of "
                              f"{', '.join(SCALE_LR)}.")
        self.init, self.max_batch_size = init, max_batch_size
        self.steps_per_trial, self.margin, self.scale_lr = steps_per_trial, margin, scale_lr
        self._reset_results()

    def _reset_results(self) -> None:
        self.trials: list[dict[str, Any]] = []
        self.found: int | None = None
        self.batch_size: int | None = None
        self.initial: int | None = None
        self.start: int | None = None  # the first size tried
        self.cap: int | None = None
        self.seconds = 0.0
        self.applied: dict[str, Any] | None = None

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("init", int, help="the first batch size tried (default: the training "
                                      "loader's)")
        options.add("max_batch_size", int,
                    help="the largest batch size tried (default: the training samples per rank)")
        options.add("max_growth", int, help="try at most this many times the first size "
                                            "(default: no limit besides max_batch_size)")
        options.add("steps_per_trial", int, default=3, help="optimizer steps per trial")
        options.add("margin", float, default=1.0,
                    help="train with floor(found x margin); below 1 leaves memory headroom")
        options.add("scale_lr", str, default="none", choices=SCALE_LR,
                    help="rescale the learning rates for the new batch size: linear (x new/old, "
                         "SGD) or sqrt (x sqrt(new/old), adaptive optimizers)")
        Finder.add_then_option(options)

    @staticmethod
    @hookimpl
    def tune_candidates(trainer):
        """``ptrain tune`` measures training with the largest batch that fits (the search is
        part of the trial's warm-up, reported apart); a batch size changes the numbers, so it
        is judged on its loss over the same samples."""
        if "batch-size-finder" in trainer.plugins:
            return []
        from ptrain.tuning import Candidate

        return [Candidate(f"largest batch that fits (up to {TUNED_GROWTH}x)", "batch-size",
                          callbacks=("batch-size-finder",),
                          plugin_options={"batch-size-finder": {"max_growth": TUNED_GROWTH}},
                          numerics="changed")]

    @hookimpl(trylast=True)
    def setup(self, trainer, stage: str) -> None:
        if stage == "fit":
            self.run(trainer)

    @hookimpl
    def state_dict(self) -> dict[str, Any] | None:
        return self.applied

    # -- the search ---------------------------------------------------------------------------

    def run(self, trainer) -> None:
        self._reset_results()
        loader = trainer.train_dataloader
        if self.resumed_state is not None and self.then == "fit":
            self.applied = self.resumed_state
            size = self.batch_size = int(self.applied["batch_size"])
            trainer.train_dataloader = rebuild_dataloader(loader, batch_size=size)
            self.report(trainer, f"batch-size-finder: resumed a run that trains with batch size "
                                 f"{size}; no new search.")
            return
        if self.resuming and self.then == "fit":  # a resume continues the run, its batches too
            size = getattr(loader, "batch_size", None)
            kept = f"its batch size {size}" if size is not None else "its own batches"
            self.report(trainer, f"batch-size-finder: no search: this run resumes from a "
                                 f"checkpoint without a batch-size-finder result, and continues "
                                 f"with {kept}; to search, start a fresh run (without "
                                 f"--ckpt-path), or see the sizes that fit with "
                                 f"--batch-size-finder-then stop.")
            return
        self.initial = self._check_loader(loader)
        self._check_strategy(trainer)
        if self.then == "fit" and self.scale_lr != "none":
            check_scalable(trainer, "batch-size-finder", "use --batch-size-finder-scale-lr none "
                           "and set the scheduler's learning rates yourself")
        self.cap = self._cap(loader)
        start = min(self.init or self.initial, self.cap)
        self.start = start
        if self.max_growth is not None:
            self.cap = min(self.cap, start * self.max_growth)
        snapshot = TrainingSnapshot(trainer, skip=self.finders(trainer))
        started = time.perf_counter()
        try:
            self.found = self._search(trainer, loader, snapshot, start)
        finally:
            snapshot.restore()
        self.seconds = time.perf_counter() - started
        self.batch_size = max(1, math.floor(self.found * self.margin))
        self._report(trainer)
        if self.then == "stop":
            self.stop_before_training(trainer)
            return
        trainer.train_dataloader = rebuild_dataloader(loader, batch_size=self.batch_size)
        if self.scale_lr != "none":
            scale_learning_rates(trainer, lr_factor(self.scale_lr, self.initial, self.batch_size))
        self.applied = {"batch_size": self.batch_size, "initial": self.initial}

    def _check_loader(self, loader: Any) -> int:
        """The loader's batch size, after checking that it can be rebuilt at another one."""
        if not isinstance(loader, DataLoader):
            raise ConfigError(f"batch-size-finder: the training data is a "
                              f"{type(loader).__name__}, not a torch DataLoader, so it can't be "
                              f"rebuilt at another batch size; return a DataLoader from "
                              f"train_dataloader().")
        # a BatchSampler given as batch_sampler= (batch_size then reads None) counts as own
        own = loader.batch_sampler is not None and (
            type(loader.batch_sampler) is not BatchSampler or loader.batch_size is None)
        if own:
            raise ConfigError(f"batch-size-finder: the training dataloader batches with its own "
                              f"batch sampler ({type(loader.batch_sampler).__name__}), whose "
                              f"batch size the finder can't change; give the DataLoader "
                              f"batch_size= and a sampler instead, or leave out "
                              f"-p batch-size-finder.")
        if loader.batch_size is None:
            raise ConfigError("batch-size-finder: the training dataloader has batch_size=None "
                              "(its dataset yields whole batches), so there is no batch size to "
                              "search; give the DataLoader a batch_size.")
        return int(loader.batch_size)

    def _check_strategy(self, trainer) -> None:
        """Under several processes only DDP-style replicas are searched: their steps can skip
        every collective (see :meth:`_trial`). Sharded engines gather parameters inside the
        forward and the optimizer step, so a rank that ran out of memory alone would leave the
        others waiting in a collective until the process group's timeout."""
        if trainer.world_size == 1:
            return
        from torch.nn.parallel import DistributedDataParallel

        sharded = any(hasattr(p, "to_local") for p in trainer.module.parameters())
        zero = any(len(optimizers_to_snapshot(o)) > 1 for o in trainer.optimizers)
        if sharded or zero or not isinstance(trainer.model, DistributedDataParallel):
            strategy = trainer.options["strategy"]
            raise ConfigError(
                f"batch-size-finder: under --strategy {strategy} the forward pass or the "
                f"optimizer step runs collectives (sharded parameters or optimizer state), so a "
                f"rank that runs out of memory alone would leave the others waiting until the "
                f"process group's timeout; the finder runs under ddp or in one process. Search "
                f"under ddp (its replicas hold more per rank than {strategy}'s shards, so its "
                f"answer is a lower bound), or try sizes by hand with short runs (--max-steps 3)."
            )

    def _cap(self, loader: DataLoader) -> int:
        """The largest size to try: ``max_batch_size``, but never more than the samples this
        rank sees per epoch (a larger batch would be that many samples again, not a test of the
        larger size)."""
        try:
            samples = len(loader.sampler)  # a DistributedSampler's length is this rank's share
        except TypeError:  # an IterableDataset: no length
            if self.max_batch_size is None:
                raise ConfigError("batch-size-finder: the training dataset has no length (an "
                                  "IterableDataset), so the largest sensible batch size is "
                                  "unknown; set --batch-size-finder-max-batch-size.") from None
            return self.max_batch_size
        if samples == 0:
            raise ConfigError("batch-size-finder: the training dataloader has no samples (on "
                              "this rank); there is nothing to search with.")
        return min(samples, self.max_batch_size or samples)

    def _search(self, trainer, loader: DataLoader, snapshot: TrainingSnapshot, start: int) -> int:
        """Double from ``start`` until a trial fails or reaches the cap, then bisect."""
        fits, fails = 0, None  # the largest size that fit, the smallest that did not
        size = start
        while True:
            if self._trial(trainer, loader, snapshot, size):
                fits = size
                if size >= self.cap:
                    break
                size = min(size * 2, self.cap)
            else:
                fails = size
                break
        if fits == 0:  # the first size failed: halve down to a size that fits
            while fits == 0:
                if fails == 1:
                    raise ConfigError(
                        "batch-size-finder: even a batch of 1 runs out of memory; the model "
                        "does not fit on this device as set up (try a lower precision, a "
                        "sharded strategy, activation checkpointing).")
                size = fails // 2
                if self._trial(trainer, loader, snapshot, size):
                    fits = size
                else:
                    fails = size
        while fails is not None and fails - fits > 1:
            size = (fits + fails) // 2
            if self._trial(trainer, loader, snapshot, size):
                fits = size
            else:
                fails = size
        return fits

    def _trial(self, trainer, loader: DataLoader, snapshot: TrainingSnapshot, size: int) -> bool:
        """``steps_per_trial`` optimizer steps at batch size ``size``; whether every rank got
        through them. Under several processes the steps run with gradient synchronisation off
        (DDP's ``no_sync``): no collective inside a step, so a rank that runs out of memory stops
        without stranding the others, and the ranks agree once per trial. DDP's communication
        buckets are allocated when the model is wrapped, so they count either way."""
        single = trainer.world_size == 1
        trial_loader = rebuild_dataloader(loader, batch_size=size, persistent_workers=False)
        source = cycle(trial_loader)
        runner = StepRunner(trainer)
        fits, error = True, None
        try:
            for _ in range(self.steps_per_trial):
                runner.step(source, sync_gradients=single)
        except RuntimeError as exc:  # torch.OutOfMemoryError is one
            if not is_out_of_memory(exc):
                raise
            fits, error = False, str(exc).splitlines()[0][:200]
        # out of the except block: the traceback, and the tensors its frames held, are gone
        source.close()
        del source, trial_loader, runner
        snapshot.restore()
        if hasattr(trainer.model, "require_forward_param_sync"):
            # DDP: a forward cut short by the error left this flag as it was on that rank only;
            # set on all, the next forward broadcasts buffers on every rank alike
            trainer.model.require_forward_param_sync = True
        if not fits:  # (a full collection costs ~0.2 s with torch imported: only when needed)
            release_memory(trainer.device)
        if not single:  # one collective per trial: the minimum of the ranks' "fits"
            failed = torch.tensor([0.0 if fits else 1.0], device=trainer.device)
            failed = trainer.hook.reduce_metrics(trainer=trainer, metrics={"failed": failed},
                                                 op="max")["failed"]
            agreed = not bool(failed.item())
            if fits and not agreed:
                error = "another rank ran out of memory"
            fits = agreed
        self.trials.append({"batch_size": size, "fits": fits, "error": error})
        return fits

    def _report(self, trainer) -> None:
        if not trainer.is_global_zero:
            return
        tried = ", ".join(f"{t['batch_size']} {'ok' if t['fits'] else 'out of memory'}"
                          for t in self.trials)
        limit = "max_growth" if self.max_growth is not None and \
            self.cap == self.start * self.max_growth else "max_batch_size"
        capped = (f" ({limit} {self.cap}: larger sizes not tried)"
                  if self.found == self.cap else "")
        margin = f", x margin {self.margin:g} = {self.batch_size}" if self.margin < 1 else ""
        line = (f"batch-size-finder: largest batch size that fits: {self.found}{capped}{margin}; "
                f"was {self.initial}; {self.seconds:.1f} s (tried: {tried}).")
        line += " " + self._lr_advice(trainer)
        if self.then == "fit":
            line += f" Training with batch size {self.batch_size}."
        write_json(trainer.run_dir / DATA_NAME, {
            "trials": self.trials, "found": self.found, "batch_size": self.batch_size,
            "initial": self.initial, "max_batch_size": self.cap, "margin": self.margin,
            "steps_per_trial": self.steps_per_trial, "seconds": self.seconds,
            "scale_lr": self.scale_lr, "then": self.then})
        self.report(trainer, line)

    def _lr_advice(self, trainer) -> str:
        """What the learning rate becomes under each rule, the one that suits the optimizer
        first."""
        optimizer = trainer.optimizers[0]
        lr = base_lr(optimizer.param_groups[0])
        old, new = self.initial, self.batch_size
        if new == old:
            return "Learning rate: no change needed (same batch size)."
        rule = lr_rule(optimizer)
        rules = [rule] if rule is not None else ["linear", "sqrt"]
        kind = type(optimizers_to_snapshot(optimizer)[-1]).__name__
        advice = "; ".join(f"{r} rule: lr {lr:.3g} x {lr_factor(r, old, new):.3g} = "
                           f"{lr * lr_factor(r, old, new):.3g}" for r in rules)
        why = {"sqrt": f" ({kind} is adaptive)", "linear": f" ({kind})", None: ""}[rule]
        if self.scale_lr != "none" and self.then == "fit":
            return f"Learning rate{why}: {advice}; applied the {self.scale_lr} rule."
        return (f"Learning rate{why}: {advice}; apply it with --batch-size-finder-scale-lr "
                f"{rules[0]}.")
