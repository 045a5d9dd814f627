"""The ``toggling`` callback: train one model with several optimizers, one part at a time.

For a module that optimizes manually (``automatic_optimization = False``) whose optimizers own
different parts of one model (a GAN's generator and discriminator, an actor and a critic)::

    from ptrain_toggling import toggle_model

    def training_step(self, batch, batch_idx):
        opt_g, opt_d = self.optimizers()
        with toggle_model(opt_d):
            self.manual_backward(discriminator_loss)
            opt_d.step()
            opt_d.zero_grad()
        with toggle_model(opt_g):
            ...

Inside ``toggle_model(optimizer)`` every parameter that only other optimizers own has
``requires_grad=False``, so the backward passes inside compute no gradient for it: less work, and
no stray gradient piles up in the part that is not being trained. On exit, also on an exception,
every parameter gets back the ``requires_grad`` it had on entry (so toggles nest, and a parameter
the user froze stays frozen). Parameters in no optimizer, and those this optimizer shares with
another, are left alone.

``sync_grad=False`` makes the backward passes inside skip the gradient all-reduce
(``trainer.sync_gradients`` is ``False`` there): accumulate over several batches, then take the
last backward in a toggle with ``sync_grad=True`` to pay for one all-reduce. (Under DDP, a
synchronised backward of another part in between all-reduces its buckets, which hold the
accumulating part's gradients too: correct, since averaging is linear, but no saving.) With one
process it changes nothing.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from ptrain import ConfigError, ModelError, hookimpl
from ptrain.module import ManualOptimizer

if TYPE_CHECKING:
    import torch

__all__ = ["Toggling", "toggle_model"]


class Toggling:
    """``-p toggling``: knows, for each optimizer of the run, the parameters to switch off while
    it is toggled. Computed once at ``setup``; ``toggle_model`` reads it."""

    def __init__(self) -> None:
        self._frozen_while: dict[int, list[torch.nn.Parameter]] = {}  # id(optimizer) -> params

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        if stage != "fit":
            return
        module = trainer.module
        if module.automatic_optimization:
            raise ConfigError(
                f"the toggling plugin is for modules that optimize manually, and "
                f"{type(module).__name__} uses automatic optimization; set "
                f"`automatic_optimization = False` on it and step its optimizers in "
                f"training_step, or remove -p toggling."
            )
        owners: dict[int, set[int]] = {}
        params: dict[int, torch.nn.Parameter] = {}
        for index, optimizer in enumerate(trainer.optimizers):
            for group in optimizer.param_groups:
                for param in group["params"]:
                    owners.setdefault(id(param), set()).add(index)
                    params[id(param)] = param
        self._frozen_while = {
            id(optimizer): [params[key] for key, owned_by in owners.items()
                            if index not in owned_by]
            for index, optimizer in enumerate(trainer.optimizers)
        }

    @hookimpl
    def teardown(self) -> None:
        self._frozen_while = {}

    def frozen_while(self, optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
        """The parameters that only other optimizers own."""
        try:
            return self._frozen_while[id(optimizer)]
        except KeyError:
            raise ModelError(
                "toggle_model() was given an optimizer that is not one of this run's; pass one "
                "of those self.optimizers() returns, inside training_step."
            ) from None


@contextmanager
def toggle_model(optimizer: ManualOptimizer, sync_grad: bool = True) -> Iterator[None]:
    """Train only ``optimizer``'s part of the model inside the block (see the module's doc).

    ``optimizer`` is one of those ``self.optimizers()`` returns. ``sync_grad=False``: the
    gradients of the backward passes inside stay local to each process. Needs the ``toggling``
    plugin in the run (``-p toggling``).
    """
    if not isinstance(optimizer, ManualOptimizer):
        raise ModelError(
            f"toggle_model() takes an optimizer from self.optimizers(), got "
            f"{type(optimizer).__name__}; call it in training_step as "
            f"`with toggle_model(self.optimizers()[i]):`."
        )
    trainer = optimizer.trainer
    plugin = next((p for p in trainer.plugins.values() if isinstance(p, Toggling)), None)
    if plugin is None:
        raise ConfigError(
            "toggle_model() needs the toggling plugin in the run: add -p toggling (config file: "
            "callbacks = [\"toggling\"] under [trainer]; Python: Trainer(callbacks=[\"toggling\"]))."
        )
    frozen = plugin.frozen_while(optimizer.optimizer)
    was_trainable = [param.requires_grad for param in frozen]
    was_synced = trainer.sync_gradients
    try:
        for param in frozen:
            param.requires_grad_(False)
        trainer.sync_gradients = sync_grad
        yield
    finally:
        trainer.sync_gradients = was_synced
        for param, trainable in zip(frozen, was_trainable):
            param.requires_grad_(trainable)
