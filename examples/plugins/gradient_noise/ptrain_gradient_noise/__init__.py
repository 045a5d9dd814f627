"""The ``gradient-noise`` callback: annealed Gaussian noise added to the gradients before each
optimizer step.

At optimizer step ``t`` (``trainer.global_step``, the steps taken before this one) every gradient
of the optimizer's parameters gets independent noise ``N(0, sigma_t^2)`` with::

    sigma_t^2 = eta / (1 + t) ** gamma

(the schedule of Neelakantan et al., "Adding Gradient Noise Improves Learning for Very Deep
Networks", 2015: ``eta`` in {0.01, 0.3, 1.0}, ``gamma = 0.55``).

- **Seeded and reproducible.** The noise comes from a ``torch.Generator`` of its own on the
  training device, seeded with ``seed`` at the start of ``fit``; the global generators (data
  order, dropout) draw exactly what they would without the plugin. The noise is drawn parameter
  by parameter in the optimizer's order. The generator's state is saved in checkpoints, so a
  resumed run adds the noise the unbroken run would have added (a run resumed with another
  ``seed`` starts the noise afresh from that seed).
- **Order.** ``on_before_optimizer_step`` runs after a loss-scaling precision unscaled the
  gradients (its implementation is ``tryfirst``) and before gradient clipping, so the noise is
  on the true gradients and clipping bounds gradient plus noise.
- **Several processes.** Every rank uses the same seed and so adds the same noise to the
  gradients, which ``ddp`` and ``zero1``/``zero2`` have already averaged: the replicas stay
  equal. Sharded parameters (``fsdp``, ``zero3``) would get noise per shard, drawn differently
  from an unsharded run: refused at start-up.

Per step it adds one ``randn`` and one ``add_`` per parameter on the device and no host-device
sync. Built only on ptrain's public API.
"""

from __future__ import annotations

from typing import Any

import torch

from ptrain import ConfigError, hookimpl

__all__ = ["GradientNoise"]


class GradientNoise:
    """``-p gradient-noise``; from Python ``GradientNoise(eta=0.01, gamma=0.55, seed=0)``."""

    name = "gradient-noise"  # where its state goes in checkpoints, however it was given

    def __init__(self, eta: float = 0.01, gamma: float = 0.55, seed: int = 0):
        if not eta > 0:
            raise ConfigError(f"gradient-noise eta (the noise variance at step 0) must be "
                              f"positive, got {eta}; the paper uses 0.01, 0.3 or 1.0.")
        if gamma < 0:
            raise ConfigError(f"gradient-noise gamma (how fast the noise decays) must be >= 0, "
                              f"got {gamma}; the paper uses 0.55.")
        self.eta, self.gamma, self.seed = eta, gamma, seed
        self.generator: torch.Generator | None = None
        self._loaded: torch.Tensor | None = None

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("eta", float, default=0.01, help="noise variance at the first step")
        options.add("gamma", float, default=0.55,
                    help="decay: variance eta / (1 + step) ** gamma")
        options.add("seed", int, default=0, help="seed of the noise's own generator")

    def std(self, step: int) -> float:
        """The noise's standard deviation at optimizer step ``step``."""
        return (self.eta / (1 + step) ** self.gamma) ** 0.5

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        if stage != "fit":
            return
        sharded = [n for n, p in trainer.module.named_parameters() if hasattr(p, "full_tensor")]
        if sharded:
            raise ConfigError(f"gradient-noise adds noise to whole gradients, and this run shards "
                              f"parameters ({sharded[0]}, ...): use it with single-device, ddp, "
                              f"zero1 or zero2, or leave it out.")
        self.generator = torch.Generator(device=trainer.device)
        if self._loaded is not None:
            self.generator.set_state(self._loaded)
            self._loaded = None
        else:
            self.generator.manual_seed(self.seed)

    @hookimpl
    def on_before_optimizer_step(self, trainer, optimizer: torch.optim.Optimizer) -> None:
        std = self.std(trainer.global_step)
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    grad = param.grad
                    if grad is None:
                        continue
                    noise = torch.randn(grad.shape, generator=self.generator, device=grad.device,
                                        dtype=grad.dtype)
                    grad.add_(noise, alpha=std)

    @hookimpl
    def state_dict(self) -> dict[str, Any]:
        state = self.generator.get_state() if self.generator is not None else None
        return {"generator": state, "seed": self.seed}

    @hookimpl
    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("generator") is not None and state.get("seed") == self.seed:
            self._loaded = state["generator"]
