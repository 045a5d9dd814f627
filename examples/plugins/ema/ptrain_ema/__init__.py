"""The ``ema`` callback: an exponential moving average of the weights, validated and checkpointed.

After every optimizer step the average moves towards the trained weights::

    average = d * average + (1 - d) * weights,   d = min(decay, (1 + n) / (10 + n)) with warm-up
                                                  (n: updates so far), else d = decay

It starts from the weights the run starts with. Validation (inside ``fit`` and in
``Trainer.validate``; not the sanity check before training) runs on the average: it is swapped
in when the validation loop starts (``on_loop_start(loop="validate")``, ``tryfirst``), and the
trained weights are put back before any other plugin's ``on_validation_end`` (``tryfirst``), so
checkpoints hold the trained weights as the model and the average as this plugin's state. The
average and its update count are restored on resume, so a resumed run ends with the average of
an unbroken one. The averaged tensors are the module's floating-point parameters that require
gradients, by name; the average lives on their device and in their dtype.

Built only on ptrain's public API (``ptrain``, ``ptrain.options``). One per-step hook, the
update: ``optimizer_step``, a wrapper (the average must include the step just taken before the
validation that may follow it in the same batch), which moves that hook off the core's
direct-call path, about two microseconds per step. The swaps cost nothing per step.
"""

from __future__ import annotations

from typing import Any

import torch

from ptrain import ConfigError, hookimpl
from ptrain.options import to_bool

__all__ = ["EMA"]


class EMA:
    """``-p ema``; from Python ``EMA(decay=0.999)``.

    :param decay: how much of the average each update keeps, in (0, 1).
    :param warmup: use ``min(decay, (1 + n) / (10 + n))`` so that early, poor weights are
        forgotten quickly.
    :param every_n_steps: update after every n-th optimizer step.
    :param validate: validate on the average (off: the average is only kept and saved).

    After a run: ``average`` (name -> tensor), ``updates`` and :meth:`averaged_state_dict`.
    """

    name = "ema"  # the entry point's name, also for an object given from Python (not "e-m-a")

    def __init__(self, decay: float = 0.999, warmup: bool = True, every_n_steps: int = 1,
                 validate: bool = True):
        if not 0.0 < decay < 1.0:
            raise ConfigError(f"ema decay must be between 0 and 1 (exclusive), got {decay}; "
                              f"0.999 averages over about the last 1000 steps.")
        if every_n_steps < 1:
            raise ConfigError(f"ema every_n_steps must be at least 1, got {every_n_steps}.")
        self.decay, self.warmup = decay, warmup
        self.every_n_steps, self.validate = every_n_steps, validate
        self.average: dict[str, torch.Tensor] = {}
        self.updates = 0
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (average, parameter)
        self._loaded: dict[str, Any] | None = None
        self._trained: list[torch.Tensor] | None = None  # the weights while the average is in

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("decay", float, default=0.999,
                    help="share of the average each update keeps, in (0, 1)")
        options.add("warmup", to_bool, default=True,
                    help="use min(decay, (1 + n) / (10 + n)) after n updates")
        options.add("every_n_steps", int, default=1, help="update every n optimizer steps")
        options.add("validate", to_bool, default=True, help="validate on the averaged weights")

    # -- start -------------------------------------------------------------------------------

    @staticmethod
    def _parameters(trainer) -> dict[str, torch.nn.Parameter]:
        return {name: p for name, p in trainer.module.named_parameters()
                if p.requires_grad and p.is_floating_point()}

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        params = self._parameters(trainer)
        if self._loaded is not None:
            saved, self._loaded = self._loaded["average"], None
            if set(saved) != set(params):
                raise ConfigError(f"the checkpoint's EMA averages {sorted(saved)}, but the model "
                                  f"trains {sorted(params)}; resume with the model that wrote "
                                  f"it, or without -p ema.")
            self.average = {n: saved[n].to(device=p.device, dtype=p.dtype)
                            for n, p in params.items()}
        elif stage == "fit" or set(self.average) != set(params):
            self.average = {n: p.detach().clone() for n, p in params.items()}
            self.updates = 0
        self._pairs = [(self.average[n], p) for n, p in params.items()]

    # -- updating ------------------------------------------------------------------------------

    @hookimpl(wrapper=True)
    def optimizer_step(self, trainer):
        stepped = yield
        if (trainer.global_step + 1) % self.every_n_steps == 0:  # the step just taken counts
            self._update()
        return stepped

    def _update(self) -> None:
        decay = self.decay
        if self.warmup:
            decay = min(decay, (1 + self.updates) / (10 + self.updates))
        with torch.no_grad():
            for average, param in self._pairs:
                average.lerp_(param.detach(), 1.0 - decay)
        self.updates += 1

    # -- validating on the average ------------------------------------------------------------

    @hookimpl(tryfirst=True)  # before anyone else looks at the model in the validation
    def on_loop_start(self, trainer, loop: str) -> None:
        # the sanity check before training validates the weights, as without the plugin
        if (loop == "validate" and self.validate and self._trained is None and self._pairs
                and not trainer.sanity_checking):
            self._swap_in()

    @hookimpl(tryfirst=True)  # before anyone else looks at the model after validation
    def on_validation_end(self) -> None:
        self._swap_out()

    @hookimpl
    def on_loop_end(self, loop: str) -> None:
        if loop == "validate":  # already done by on_validation_end, which follows every one
            self._swap_out()

    @hookimpl
    def teardown(self) -> None:
        self._swap_out()  # a validation that raised left the average in

    def _swap_in(self) -> None:
        with torch.no_grad():
            self._trained = [param.detach().clone() for _, param in self._pairs]
            for average, param in self._pairs:
                param.copy_(average)

    def _swap_out(self) -> None:
        if self._trained is None:
            return
        with torch.no_grad():
            for (_, param), trained in zip(self._pairs, self._trained):
                param.copy_(trained)
        self._trained = None

    # -- checkpoints and export -----------------------------------------------------------------

    @hookimpl
    def state_dict(self) -> dict[str, Any]:
        return {"average": {n: t.detach().cpu().clone() for n, t in self.average.items()},
                "updates": self.updates, "decay": self.decay}

    @hookimpl
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._loaded = state
        self.updates = int(state["updates"])

    def averaged_state_dict(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """``module.state_dict()`` with the averaged parameters in place of the trained ones
        (to save or load an averaged model)."""
        state = module.state_dict()
        for name, average in self.average.items():
            state[name] = average.detach().clone()
        return state
