"""The ``activation-checkpointing`` callback: chosen modules recompute their activations in
backward instead of keeping them from forward (non-reentrant ``torch.utils.checkpoint``).

It is the one way to checkpoint activations in ptrain, under every strategy: its ``wrap_model``
is a wrapper that changes the model in place *before* ``yield``, i.e. before the strategy
(DDP, FSDP2, ZeRO) wraps or shards it, which is the order FSDP2 needs. Which modules, and the
errors for names that match nothing, come from :mod:`ptrain.module_classes`, shared with
``--fsdp-wrap-classes``.
"""

from __future__ import annotations

import logging

from torch import nn

from ptrain import ConfigError, hookimpl
from ptrain.module_classes import AUTO, checkpoint_activations
from ptrain.options import to_str_list

log = logging.getLogger(__name__)

#: How the option is named in messages (the flag; the config key is ``classes``).
OPTION = "--activation-checkpointing-classes"


class ActivationCheckpointing:
    """``-p activation-checkpointing [--activation-checkpointing-classes Block,...]``.

    ``classes``: module class names (short, or qualified as ``package.module.Class``) whose
    instances are checkpointed; ``auto`` (the default): the classes repeated in the model's
    ``nn.ModuleList``s. After ``wrap_model``, :attr:`checkpointed` lists the qualified names of
    the modules checkpointed on this process (e.g. ``module.blocks.0``).
    """

    def __init__(self, classes: list[str] | tuple[str, ...] = (AUTO,)):
        self.classes = list(classes)
        if not self.classes:
            raise ConfigError(f"{OPTION} is empty: name the module classes to checkpoint, or "
                              f"use {AUTO} for the blocks repeated in the model.")
        self.checkpointed: list[str] = []

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("classes", to_str_list, default=[AUTO],
                    help="module classes (names, or qualified names) whose activations are "
                         "recomputed in backward instead of stored; auto: the classes repeated "
                         "in the model's nn.ModuleLists")

    @staticmethod
    @hookimpl
    def tune_candidates(trainer):
        """Checkpointing alone only recomputes; what it buys is memory, for a bigger batch. So
        ``ptrain tune`` measures it together with the batch-size finder's largest batch (the
        same setting as the finder's own candidate: a combination takes one of the two),
        judged on its loss as a batch size is."""
        if "activation-checkpointing" in trainer.plugins:
            return []
        from ptrain.tuning import Candidate

        unavailable, growth = None, 16
        if "batch-size-finder" not in trainer.catalog.names("callback"):
            unavailable = "needs the batch-size finder: pip install ptrain-finders"
        else:
            from ptrain_finders.batch_size_finder import TUNED_GROWTH as growth
        return [Candidate(f"activation checkpointing + largest batch (up to {growth}x)",
                          "batch-size", callbacks=("activation-checkpointing",
                                                   "batch-size-finder"),
                          plugin_options={"batch-size-finder": {"max_growth": growth}},
                          numerics="changed", unavailable=unavailable)]

    @hookimpl(wrapper=True)
    def wrap_model(self, trainer, model: nn.Module):
        names = {id(m): n for n, m in model.named_modules()}
        done = checkpoint_activations(model, self.classes, option=OPTION)
        self.checkpointed = [names[id(m)] for m in done]
        if trainer.is_global_zero:
            kinds = sorted({type(m).__name__ for m in done})
            log.info("activation checkpointing: %d modules (%s)", len(done), ", ".join(kinds))
        return (yield)
