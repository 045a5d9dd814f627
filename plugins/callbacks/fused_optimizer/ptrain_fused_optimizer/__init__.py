"""The ``fused-optimizer`` callback: every optimizer of the run steps with torch's fused (or
foreach) kernels, without a change to the module's ``configure_optimizers``.

torch's optimizers have three implementations of the same update: a loop over the parameters
(the default for parameters off CUDA), ``foreach`` (one multi-tensor kernel per operation: the
default on CUDA) and ``fused`` (one kernel for the whole update: Adam, AdamW, SGD and Adagrad, on
CUDA, the CPU and a few more devices). They compute the same update; only the rounding order
differs. ``-p fused-optimizer`` switches each optimizer the module returns to ``fused`` (or, with
``--fused-optimizer-implementation foreach``, to ``foreach``) when the ``wrap_optimizer`` hook
fires, before the first step, by setting the implementation in every param group as the
optimizer's own constructor would: the optimizer stays the same object, so learning-rate
schedulers, checkpoints and resumes see nothing new.

What is refused before training starts, with the reason: an optimizer class without the chosen
implementation, ``differentiable=True`` param groups, parameters a fused kernel does not take
(not floating point, or on a device torch has no fused kernels for), and a strategy that
replaces the optimizer (ZeRO partitions it: give the implementation to the optimizer it wraps).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch

from ptrain import ConfigError, hookimpl

IMPLEMENTATIONS = ("fused", "foreach")
OPTION = "--fused-optimizer-implementation"


def _classes_with(implementation: str) -> list[str]:
    """torch's optimizer classes whose constructor takes ``implementation``."""
    return sorted(name for name, cls in vars(torch.optim).items()
                  if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)
                  and implementation in inspect.signature(cls.__init__).parameters)


def _fused_devices() -> list[str]:
    """The device types torch has fused optimizer kernels for."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:  # a torch that moved it: its own check at the first step still holds
        return []
    return list(_get_fused_kernels_supported_devices())


class FusedOptimizer:
    """``-p fused-optimizer [--fused-optimizer-implementation fused|foreach]`` (see the module
    doc). ``switched`` lists each optimizer this object switched, over its runs: its class and
    what it ran before (``"default"``, ``"foreach"`` or ``"fused"``)."""

    name = "fused-optimizer"

    def __init__(self, implementation: str = "fused"):
        if implementation not in IMPLEMENTATIONS:
            raise ConfigError(f"fused-optimizer: implementation={implementation!r} is not one of "
                              f"{', '.join(IMPLEMENTATIONS)}. Set {OPTION} fused (one kernel for "
                              f"the whole update) or foreach (one per operation).")
        self.implementation = implementation
        self.switched: list[tuple[str, str]] = []

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("implementation", str, default="fused", choices=IMPLEMENTATIONS,
                    help="fused: one kernel for the whole update (Adam, AdamW, SGD, Adagrad); "
                         "foreach: one multi-tensor kernel per operation (most optimizers)")

    @staticmethod
    @hookimpl
    def tune_candidates(trainer):
        """Both implementations, as one setting; each must train as before (the same update,
        rounded in another order). An optimizer without one fails its trial with the reason."""
        if "fused-optimizer" in trainer.plugins:
            return []
        from ptrain.tuning import Candidate

        return [Candidate(f"{impl} optimizer", "optimizer-implementation",
                          callbacks=("fused-optimizer",),
                          plugin_options={"fused-optimizer": {"implementation": impl}})
                for impl in IMPLEMENTATIONS]

    @hookimpl(wrapper=True)
    def wrap_optimizer(self, trainer, optimizer: torch.optim.Optimizer):
        result = yield
        if result is not optimizer:
            raise ConfigError(
                f"-p fused-optimizer: --strategy {trainer.options.get('strategy')} replaced the "
                f"optimizer with a {type(result).__name__} (as ZeRO does to partition its "
                f"state), whose inner optimizer this plugin can't reach. Give the "
                f"implementation to the optimizer in configure_optimizers "
                f"({type(optimizer).__name__}(..., {self.implementation}=True)) and leave "
                f"-p fused-optimizer out.")
        self._switch(optimizer)
        return result

    def _switch(self, optimizer: torch.optim.Optimizer) -> None:
        impl, other = self.implementation, ("foreach" if self.implementation == "fused"
                                            else "fused")
        cls = type(optimizer).__name__
        if impl not in inspect.signature(type(optimizer).__init__).parameters:
            raise ConfigError(
                f"-p fused-optimizer: {cls} has no {impl} implementation in torch "
                f"{torch.__version__} ({impl}: {', '.join(_classes_with(impl))}). "
                + (f"Use {OPTION} foreach, or leave the plugin out." if impl == "fused" else
                   "Leave the plugin out for this optimizer."))
        if any(group.get("differentiable") for group in optimizer.param_groups):
            raise ConfigError(f"-p fused-optimizer: {cls} was made with differentiable=True, "
                              f"which torch's {impl} kernels do not support; leave the plugin "
                              f"out for it.")
        if impl == "fused":
            self._check_fused_params(optimizer)
        before = ("fused" if optimizer.defaults.get("fused") else
                  "foreach" if optimizer.defaults.get("foreach") else "default")
        if before == other:
            warnings.warn(f"fused-optimizer: {cls} was made with {other}=True; -p "
                          f"fused-optimizer switches it to {impl}.", stacklevel=2)
        for settings in (optimizer.defaults, *optimizer.param_groups):
            settings[impl] = True
            settings[other] = False
        # as the constructor sets it: with fused=True a GradScaler hands the kernel its scale
        # and inf check instead of unscaling the gradients in a pass of its own; the other
        # implementations must not be handed them
        optimizer._step_supports_amp_scaling = impl == "fused"
        self.switched.append((cls, before))

    def _check_fused_params(self, optimizer: torch.optim.Optimizer) -> None:
        devices = _fused_devices()
        for group in optimizer.param_groups:
            for param in group["params"]:
                if not torch.is_floating_point(param):
                    raise ConfigError(
                        f"-p fused-optimizer: {type(optimizer).__name__} holds a {param.dtype} "
                        f"parameter; torch's fused kernels take floating-point parameters only. "
                        f"Use {OPTION} foreach.")
                if devices and param.device.type not in devices:
                    raise ConfigError(
                        f"-p fused-optimizer: torch has no fused optimizer kernels for "
                        f"{param.device.type!r} parameters (it has them for "
                        f"{', '.join(devices)}). Use {OPTION} foreach.")


__all__ = ["FusedOptimizer", "IMPLEMENTATIONS"]
