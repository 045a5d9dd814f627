"""``lightning.pytorch.callbacks.pruning``: ``ModelPruning``, refused when made."""

from __future__ import annotations

from typing import Any

from ptrain.errors import ConfigError
from ptrain.hook_methods import Callback


class ModelPruning(Callback):
    """Lightning's ``ModelPruning``: refused when made. Lightning rewrites the checkpoint's
    ``state_dict`` to hold the pruned weights; a ptrain callback's ``on_save_checkpoint`` gets a
    dict of its own, so checkpoints would hold ``torch.nn.utils.prune``'s ``weight_orig`` and
    ``weight_mask`` instead and load into nothing but a model pruned the same way."""

    def __init__(self, pruning_fn: Any = None, *args: Any, **kwargs: Any) -> None:
        raise ConfigError(
            "ModelPruning is not supported by ptrain: Lightning writes the pruned weights into "
            "the checkpoint's state_dict, which a ptrain callback cannot change (its "
            "on_save_checkpoint receives a dict of its own), so the checkpoints would hold "
            "torch.nn.utils.prune's weight_orig and weight_mask and load into nothing but a "
            "model pruned the same way. Prune in the module (torch.nn.utils.prune in "
            "on_train_epoch_end) and make it permanent with prune.remove before the last "
            "checkpoint, or prune after fit.")


__all__ = ["ModelPruning"]
