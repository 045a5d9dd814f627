"""Real training steps run by a finder before the first epoch.

A finder step goes through the run's own per-step hooks (``trainer.step_hooks``), the ones the
loop calls: ``transfer_batch``, ``model_step`` (the strategy's wrapped model, the precision
plugin's autocast), ``backward`` (loss scaling, sharded engines) and, through
``trainer.run_optimizer_step``, ``on_before_optimizer_step``/``clip_gradients``/
``optimizer_step``; then ``zero_grad(set_to_none=True)``, as the loop does. Nothing of a step is
re-implemented here, only its order, which is the loop's (``ptrain.fit_loop.FitLoop``).

What differs from a loop step, on purpose:

- LR schedulers are not stepped (the LR finder sets the learning rates itself; the state of
  both is restored afterwards anyway);
- the loop's NaN window is not fed (a diverging LR range test is expected to produce huge losses);
- ``on_train_batch_end`` fires only for the accelerator, strategy and precision plugins, which
  keep per-batch state the next step depends on (a float16 loss scaler updates its scale there;
  XLA marks its step). Callbacks do not see it: these are not training batches of the run, and
  a callback would otherwise write a step checkpoint, draw progress or count a profiled step.
"""

from __future__ import annotations

import gc
import itertools
from typing import Any, Callable, Iterable, Iterator

import torch

from ptrain import ConfigError
from ptrain.loading import bind_impl


class StepRunner:
    """Runs optimizer steps of ``trainer``'s kind on batches drawn from a source."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.hooks = trainer.step_hooks
        self.automatic = trainer.module.automatic_optimization
        own = {trainer.options[kind] for kind in ("accelerator", "strategy", "precision")}
        impls = [impl for impl in reversed(trainer.hook.on_train_batch_end.get_hookimpls())
                 if impl.plugin_name in own and not (impl.wrapper or impl.hookwrapper)]
        self.batch_end = [bind_impl(impl) for impl in impls]
        self.batch_idx = 0

    def step(self, batches: Iterator[Any], accumulate: int = 1,
             sync_gradients: bool = True) -> tuple[torch.Tensor | None, int]:
        """One optimizer step over ``accumulate`` batches (an accumulation window, gradients
        synchronised across processes on its last batch when ``sync_gradients``). Returns the
        sum of the window's losses (detached, on the device; ``None`` if the module skipped
        every batch) and how many batches gave a loss. No host-device sync."""
        t, hooks = self.trainer, self.hooks
        total, count = None, 0
        for index in range(accumulate):
            batch = next(batches)
            last = index == accumulate - 1
            t.batch_idx = self.batch_idx
            t.sync_gradients = sync_gradients and last
            batch = hooks.transfer_batch(trainer=t, batch=batch)
            output = hooks.model_step(trainer=t, stage="train", batch=batch,
                                      batch_idx=self.batch_idx)
            loss = output["loss"] if isinstance(output, dict) else output
            if loss is not None:
                if self.automatic:
                    hooks.backward(trainer=t, loss=loss / accumulate if accumulate > 1 else loss)
                loss = loss.detach()
                total = loss if total is None else total + loss
                count += 1
            if self.automatic and last:
                for optimizer in t.optimizers:
                    t.run_optimizer_step(optimizer)
                    optimizer.zero_grad(set_to_none=True)
            for function in self.batch_end:
                function(trainer=t, batch=batch, batch_idx=self.batch_idx, loss=loss)
            self.batch_idx += 1
        return total, count


def cycle(loader: Iterable[Any], limit: int | float | None = None,
          between: Callable[[int], None] | None = None) -> Iterator[Any]:
    """The batches of ``loader`` (the first ``limit`` of each pass), pass after pass, for as long
    as they are asked for. Each pass makes a new iterator, so a shuffling loader reshuffles.
    ``between(passes)``, if given, is called before each pass after the first, with the number
    of passes done."""
    passes = 0
    while True:
        if passes and between is not None:
            between(passes)
        produced = 0
        # islice: a batch fetched past the limit and dropped would load and draw for nothing
        for batch in loader if limit is None else itertools.islice(loader, int(limit)):
            yield batch
            produced += 1
        if produced == 0:
            raise ConfigError("the training dataloader produced no batch (is the dataset empty, "
                              "or does limit_train_batches keep none?); a finder needs "
                              "training batches to run steps on.")
        passes += 1


def batches_per_pass(loader: Any, limit: int | float) -> int | float | None:
    """How many batches of ``loader`` an epoch uses under ``limit_train_batches`` (as the loop
    counts them), or ``None`` for all of them."""
    try:
        total = len(loader)
    except TypeError:  # no length: an int limit still counts batches
        return limit if isinstance(limit, int) else None
    if isinstance(limit, float):
        return total if limit == 1.0 else int(total * limit)
    return min(total, limit)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure: ``torch.OutOfMemoryError`` (CUDA's caching
    allocator, and other device allocators that raise it), or the ``RuntimeError`` that torch's
    CPU allocator raises when ``posix_memalign`` fails ("DefaultCPUAllocator: can't allocate
    memory", e.g. under an address-space limit or when the kernel refuses the mapping)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return (type(exc) is RuntimeError
            and "DefaultCPUAllocator: can't allocate memory" in str(exc))


def release_memory(device: torch.device) -> None:
    """Collect what a failed step left in reference cycles and, on CUDA, hand the caching
    allocator's free blocks back, so the next trial starts from the same free memory."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
