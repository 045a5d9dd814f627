"""Checkpoints of a ``ptrain.lightning.Trainer`` run as a Lightning program reads them: the
default ``ModelCheckpoint`` Lightning gives a trainer, and Lightning's keys in every checkpoint
file (:class:`LightningCheckpointKeys`)."""

from __future__ import annotations

import collections.abc
from typing import Any

from ptrain.errors import ConfigError
from ptrain.hook_methods import MODULE_PLUGIN
from ptrain.hookspecs import hookimpl


class LightningCheckpointKeys:
    """The ptrain callback (in every ``ptrain.lightning.Trainer`` run) that gives each checkpoint
    the keys a Lightning program reads, beside ptrain's own, without storing anything twice:

    - ``state_dict`` is the weights (``model``), ``optimizer_states`` the optimizers' states
      (``optimizers``), and ``callbacks`` each callback's state under its ``state_key`` (the
      ``ModelCheckpoint``'s, and each Lightning-method callback's ``state_dict()``): the same
      objects, which ``torch.save`` writes once (a name costs a few bytes);
    - ``epoch`` and ``global_step`` (``trainer.current_epoch`` and ``trainer.global_step`` when
      written) and ``pytorch-lightning_version`` (the Lightning API the layer follows);
    - each key the module's or a callback's ``on_save_checkpoint`` added, where a program
      reading the file with ``torch.load`` finds it in Lightning's files (the same object as
      the one kept for ``on_load_checkpoint``); a key named like one of ptrain's keeps
      ptrain's value there.

    ``lr_schedulers``, ``hyper_parameters`` and ``datamodule_hyper_parameters`` are ptrain's
    keys already. Lightning's ``loops`` (its loops' internal progress) has no counterpart: ptrain
    keeps its own in ``loop``."""

    name = "lightning-checkpoint-keys"

    @hookimpl(wrapper=True)
    def save_checkpoint(self, trainer: Any, checkpoint: dict[str, Any]) -> Any:
        add_lightning_keys(trainer, checkpoint)
        return (yield)


def add_lightning_keys(trainer: Any, checkpoint: dict[str, Any]) -> None:
    """Add Lightning's names for what ``checkpoint`` holds (:class:`LightningCheckpointKeys`)."""
    from ptrain.lightning import __version__

    checkpoint["state_dict"] = checkpoint["model"]
    checkpoint["epoch"] = trainer.current_epoch
    checkpoint["global_step"] = trainer.global_step
    checkpoint["pytorch-lightning_version"] = __version__
    for key, value in (checkpoint.get("plugins", {}).get(MODULE_PLUGIN) or {}).items():
        checkpoint.setdefault(key, value)
    if checkpoint.get("weights_only"):  # Lightning's weights-only files have no more
        return
    checkpoint["optimizer_states"] = checkpoint["optimizers"]
    callbacks: dict[str, Any] = {}
    for name, state in checkpoint.get("plugins", {}).items():
        key = getattr(trainer.pm.get_plugin(name), "state_key", None)
        if isinstance(key, str):
            callbacks[key] = state
        elif _per_callback(state):  # the Lightning-method callbacks' adapter: key -> entry
            callbacks.update({k: entry["state"] for k, entry in state.items()
                              if "state" in entry})
            for entry in state.values():  # what their on_save_checkpoint added, as the module's
                for key, value in entry.get("checkpoint", {}).items():
                    checkpoint.setdefault(key, value)
    checkpoint["callbacks"] = callbacks


def _per_callback(state: Any) -> bool:
    """Whether a plugin's state is the Lightning-method adapter's: ``{state_key: {"state": ...,
    "checkpoint": ...}}`` (:func:`ptrain.hook_methods.callback_hook_plugin`)."""
    return isinstance(state, dict) and bool(state) and all(
        isinstance(entry, dict) and entry and set(entry) <= {"state", "checkpoint"}
        for entry in state.values())


def default_checkpoint(given: dict[str, Any]) -> list[Any]:
    """The checkpoint callback Lightning gives a trainer (``given``: its arguments): a
    ``ModelCheckpoint()`` unless ``callbacks`` has one, checkpointing is off
    (``enable_checkpointing=False``, ``barebones``), or that contradicts a given one."""
    from ptrain.builtins.checkpoint import ModelCheckpoint as Builtin
    from ptrain.lightning.callbacks import ModelCheckpoint

    callbacks = given.get("callbacks")
    if callbacks is None:
        callbacks = []
    elif not isinstance(callbacks, collections.abc.Sequence) or isinstance(callbacks, str):
        callbacks = [callbacks]
    mine = [c for c in callbacks
            if isinstance(c, Builtin) or (isinstance(c, str) and c == "checkpoint")]
    if given.get("enable_checkpointing") is False:
        if mine:
            raise ConfigError(
                f"Trainer(enable_checkpointing=False) contradicts the "
                f"{type(mine[0]).__name__} in callbacks: remove one of them (as Lightning "
                f"refuses too).")
        return []
    if mine or (given.get("barebones") and given.get("enable_checkpointing") is None):
        return []
    return [ModelCheckpoint()]


__all__ = ["LightningCheckpointKeys", "add_lightning_keys", "default_checkpoint"]
