"""ptrain: a PyTorch trainer whose loop is a small pluggy hook specification.

``import ptrain`` is cheap: torch is imported only when a name that needs it is first used, so
``ptrain --help`` and ``ptrain plugins`` stay fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ptrain._version import __version__
from ptrain.hookspecs import hookimpl, hookspec

_LAZY = {
    "Trainer": "ptrain.trainer",
    "seed_everything": "ptrain.seeding",
    "TrainModule": "ptrain.module",
    "DataModule": "ptrain.module",
    "StepModule": "ptrain.step_module",
    "PrecisionPolicy": "ptrain.precision_policy",
    "DEFAULT_CALLBACKS": "ptrain.config",
    "PtrainError": "ptrain.errors",
    "ConfigError": "ptrain.errors",
    "PluginError": "ptrain.errors",
    "CheckpointError": "ptrain.errors",
    "CheckpointWriteError": "ptrain.errors",
    "LogWriteError": "ptrain.errors",
    "ChangedBeforeCopiedError": "ptrain.errors",
    "NoCheckpointYetError": "ptrain.errors",
    "ModelError": "ptrain.errors",
    "NonFiniteLossError": "ptrain.errors",
    "NonFiniteStateError": "ptrain.errors",
    "WorkerError": "ptrain.errors",
    "Interrupted": "ptrain.errors",
}

__all__ = ["__version__", "hookimpl", "hookspec", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ptrain' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
