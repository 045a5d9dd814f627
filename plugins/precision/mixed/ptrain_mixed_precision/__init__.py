"""Mixed precision: float32 weights, the forward pass and the loss under ``torch.autocast``.

- ``bf16-mixed`` autocasts to bfloat16. bfloat16 has float32's range: no loss scaling.
- ``16-mixed`` autocasts to float16 and scales the loss with one ``torch.amp.GradScaler`` shared
  by all optimizers (as PyTorch's AMP recipe has it): the loss is scaled before backward, the
  gradients are unscaled before any callback sees them and before clipping, a step whose
  gradients overflowed is skipped and the scale lowered, and the scale is updated once per batch
  after every optimizer has stepped. So each optimizer steps at most once per batch (a module
  that optimizes manually and steps one optimizer twice in a training_step gets a usage error,
  where GradScaler would fail on unscaling it twice before an update). One scaler
  rather than one per optimizer: an overflow anywhere lowers the scale for all, which costs a
  skipped step at worst, and a backward needs no owner. Its state is saved in checkpoints.

Autocast's weight cache (``autocast_cache``, on by default as in ``torch.autocast``) casts
each weight once per step; a weight used twice then sums its two low-precision gradients before
the cast back to float32. Off, each use casts it again and the sum is taken in float32, as
Lightning does (``ptrain.lightning`` turns it off, so its runs give Lightning's numbers).
Manual optimization always runs without it: the optimizers step inside the training step, and
a cached copy would go stale when its weight changed.

The backward pass and the optimizer step run outside autocast, on the float32 weights. Where the
device's autocast does not support the dtype, start-up fails with a usage error; there is never a
silent switch to another precision.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ptrain import PluginError, PrecisionPolicy, hookimpl
from ptrain.options import to_bool
from ptrain.tuning import precision_candidate


class MixedPrecision:
    dtype: torch.dtype
    name: str
    alternative: str  # what to use where this dtype's autocast is missing
    loss_scaling = False

    def __init__(self, autocast_cache: bool = True) -> None:
        self.autocast_cache = autocast_cache

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("autocast_cache", to_bool, default=True,
                    help="cast each weight once per step, under automatic optimization "
                         "(off: once per use, gradients summed in float32, as Lightning)")

    @classmethod
    @hookimpl
    def tune_candidates(cls, trainer):
        return precision_candidate(trainer, cls.name)

    @hookimpl
    def precision_policy(self) -> PrecisionPolicy:
        return PrecisionPolicy(param_dtype=torch.float32, compute_dtype=self.dtype,
                               reduce_dtype=torch.float32, loss_scaling=self.loss_scaling)

    @hookimpl(wrapper=True)
    def setup_device(self):
        device = yield
        if not self._autocast_works(device):
            raise PluginError(
                f"{self.name} needs {self.dtype} autocast on the {device.type!r} device, which "
                f"this torch {torch.__version__} does not support; use --precision "
                f"{self.alternative} instead."
            )
        self.device_setup(device)
        return device

    def _autocast_works(self, device: torch.device) -> bool:
        try:
            with warnings.catch_warnings():  # torch warns and disables an unsupported dtype
                warnings.simplefilter("ignore")
                with torch.autocast(device_type=device.type, dtype=self.dtype):
                    return torch.is_autocast_enabled(device.type)
        except RuntimeError:  # no autocast at all for this device type
            return False

    def device_setup(self, device: torch.device) -> None:
        """What a subclass prepares once the device is known."""

    @hookimpl(wrapper=True)
    def model_step(self, trainer):
        # Automatic optimization: forward and loss only, backward and the optimizer step run
        # after this returns, so autocast may cache each weight's low-precision copy for the
        # step. Manual optimization steps optimizers inside: a cached copy would go stale when
        # its weight changes in place, so the cache is off there.
        cache = self.autocast_cache and trainer.module.automatic_optimization
        with torch.autocast(device_type=trainer.device.type, dtype=self.dtype,
                            cache_enabled=cache):
            return (yield)


class BF16MixedPrecision(MixedPrecision):
    """``bf16-mixed``: bfloat16 autocast, no loss scaling."""

    dtype = torch.bfloat16
    name = "bf16-mixed"
    alternative = "bf16-true or 32-true"


class Float16MixedPrecision(MixedPrecision):
    """``16-mixed``: float16 autocast with dynamic loss scaling."""

    dtype = torch.float16
    name = "16-mixed"
    alternative = "bf16-mixed (bfloat16 autocast, no loss scaling)"
    loss_scaling = True

    def __init__(self, init_scale: float = 2.0**16, growth_interval: int = 2000,
                 autocast_cache: bool = True) -> None:
        super().__init__(autocast_cache)
        self.init_scale, self.growth_interval = init_scale, growth_interval
        self.scaler: torch.amp.GradScaler | None = None
        self._stepped: set[int] = set()  # id() of the optimizers stepped since the last update

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        MixedPrecision.add_options(options)
        options.add("init_scale", float, default=2.0**16,
                    help="the loss scale to start from (steps that overflow halve it)")
        options.add("growth_interval", int, default=2000,
                    help="double the scale after this many steps without overflow")

    def device_setup(self, device: torch.device) -> None:
        self.scaler = torch.amp.GradScaler(device.type, init_scale=self.init_scale,
                                           growth_interval=self.growth_interval)

    @hookimpl
    def backward(self, loss: torch.Tensor) -> bool:
        self.scaler.scale(loss).backward()
        return True

    @hookimpl(tryfirst=True)  # before any callback or clipping looks at the gradients
    def on_before_optimizer_step(self, trainer, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) in self._stepped:
            index = next(i for i, o in enumerate(trainer.optimizers) if o is optimizer)
            raise PluginError(
                f"optimizer {index} stepped twice in batch {trainer.batch_idx} under 16-mixed, "
                f"whose one loss scale is updated once per batch; step each optimizer at most "
                f"once per training_step (accumulate its losses in one backward, or over "
                f"batches), or use --precision bf16-mixed, which needs no loss scaling."
            )
        self.scaler.unscale_(optimizer)

    @hookimpl
    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        self.scaler.step(optimizer)  # skipped when unscale_ found inf/NaN gradients
        self._stepped.add(id(optimizer))
        return True

    def _update_scale(self) -> None:
        """Once per batch, after every optimizer stepped (a no-op when none did)."""
        if self._stepped:
            self.scaler.update()
            self._stepped.clear()

    # tryfirst on both: before a checkpoint written at this point reads the scale
    @hookimpl(tryfirst=True)
    def on_train_batch_end(self, trainer, batch, batch_idx, loss) -> None:
        self._update_scale()

    @hookimpl(tryfirst=True)  # a loader without a length steps its last window after the batch
    def on_epoch_end(self) -> None:
        self._update_scale()

    @hookimpl
    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict() if self.scaler is not None else {}

    @hookimpl
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scaler.load_state_dict(state)
