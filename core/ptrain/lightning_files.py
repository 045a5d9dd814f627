"""Checkpoints that Lightning's Trainer wrote, read as ptrain reads its own to load weights.

A Lightning user who switches to ``ptrain.lightning`` keeps the models they trained: such a
file loads into a module (``load_from_checkpoint``) and into ``validate``/``test``/``predict``
(``ckpt_path``), with the hyperparameters it saved and, for the module's
``on_load_checkpoint``, every entry Lightning wrote. ``fit`` does not resume from one: Lightning
keeps the loop's progress, the callbacks' state and the random state in its own layout, so a
resume could not be exact (the trainer says so, naming what to do instead).
"""

from __future__ import annotations

from typing import Any

from ptrain.hook_methods import MODULE_PLUGIN
from ptrain.hyperparameters import DATAMODULE_KEYS, MODULE_KEYS


def is_lightning_checkpoint(checkpoint: Any) -> bool:
    """Whether ``checkpoint`` (a loaded file) is one Lightning's Trainer wrote."""
    return (isinstance(checkpoint, dict) and "pytorch-lightning_version" in checkpoint
            and isinstance(checkpoint.get("state_dict"), dict) and "format" not in checkpoint)


def as_ptrain_checkpoint(checkpoint: dict[str, Any], fmt: str, version: int) -> dict[str, Any]:
    """A Lightning checkpoint (see :func:`is_lightning_checkpoint`) in the layout of ptrain's
    weights-only checkpoints (format ``fmt``, ``version``): its ``state_dict`` as the module's
    weights, its hyperparameters, its step and epoch, and every entry but the weights for the
    module's ``on_load_checkpoint``, which Lightning hands the whole file; ``lightning_version``
    names the Lightning that wrote it."""
    return {
        "format": fmt, "format_version": version, "weights_only": True,
        "lightning_version": checkpoint["pytorch-lightning_version"],
        "model": checkpoint["state_dict"], "optimizers": [],
        "loop": {"global_step": checkpoint.get("global_step", 0),
                 "epoch": checkpoint.get("epoch", 0)},
        # ptrain's checkpoints name the hyperparameters' entries as Lightning's do
        **{key: checkpoint[key] for key in (*MODULE_KEYS, *DATAMODULE_KEYS) if key in checkpoint},
        "plugins": {MODULE_PLUGIN: {k: v for k, v in checkpoint.items() if k != "state_dict"}},
    }


__all__ = ["as_ptrain_checkpoint", "is_lightning_checkpoint"]
