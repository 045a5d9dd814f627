"""Errors explained to the user. The CLI prints their message and exits with code 2, without a
traceback; from Python they are ordinary exceptions. Any other exception is a bug."""

from __future__ import annotations


class PtrainError(Exception):
    """Base of the errors caused by input (flags, config, plugins, checkpoints, data), not bugs."""


class ConfigError(PtrainError, ValueError):
    """A flag, config key or value is wrong."""


class PluginError(PtrainError):
    """A plugin can't be found, loaded, or combined with the others."""


class CheckpointError(PtrainError):
    """A checkpoint is missing, truncated, corrupt, foreign or unsafe to load."""


class ModelError(PtrainError):
    """The user's module or data module can't be imported or used."""


class NonFiniteLossError(PtrainError, ArithmeticError):
    """The training loss became NaN or infinite; the run stopped without saving over good state."""


class WorkerError(RuntimeError):
    """A worker process of a multi-process run failed with an error that is not a
    :class:`PtrainError` (a bug, or the process was killed). Not a usage error: the CLI prints
    the message, which names the rank and holds the worker's traceback, and exits with 1."""
