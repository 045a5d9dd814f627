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


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint path that names no file; also a ``FileNotFoundError`` (what Lightning
    raises there), so either ``except`` catches it."""


class NoCheckpointYetError(CheckpointError):
    """``ckpt_path="last"`` found no checkpoint: the run has written none yet (what
    ``ckpt_path="auto"`` starts from scratch on)."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (no space, no permission, a quota, a file-size limit);
    nothing saved before was replaced, and the partial file was removed."""


class LogWriteError(PtrainError):
    """A logger could not write its file (no space, no permission, a quota, a file-size limit);
    what the file held before stays readable, and so do the run's checkpoints."""


class ChangedBeforeCopiedError(CheckpointError):
    """An asynchronous save found a tensor it copies while training goes on (a parameter an
    optimizer holds, or its state) changed in place before its copy was made: the checkpoint,
    which would mix two steps, was not written (see ``ptrain.background_write.DeferredCopies``).
    The trainer's later saves copy everything before training goes on; the checkpoint callback
    says so and takes the checkpoint again at the next step."""


class ModelError(PtrainError):
    """The user's module or data module can't be imported or used."""


class NonFiniteLossError(PtrainError, ArithmeticError):
    """The training loss became NaN or infinite; the run stopped without saving over good state."""


class NonFiniteStateError(NonFiniteLossError):
    """The parameters or optimizer state became NaN or infinite while the loss stayed finite;
    the run stopped without saving over good state. A :class:`NonFiniteLossError` too, so
    either ``except`` catches it."""


class WorkerError(RuntimeError):
    """A worker process of a multi-process run failed with an error that is not a
    :class:`PtrainError` (a bug, or the process was killed). Not a usage error: the CLI prints
    the message, which names the rank and holds the worker's traceback, and exits with 1."""


class Interrupted(SystemExit):
    """``fit`` was stopped by a signal after writing a resumable checkpoint (the ``stop-signals``
    callback, which has said where the checkpoint is). Not a failure of the run and not a usage
    error, but the program was asked to stop: a :class:`SystemExit`, so an ``except Exception``
    around ``fit`` lets it through, as it lets ``KeyboardInterrupt`` through. Uncaught, it ends
    the program quietly with ``exit_code`` (its ``code``), 128 + the signal's number (143 for
    SIGTERM, 130 for SIGINT), as the CLI does. Catch it by name to carry on after it."""

    def __init__(self, signal_name: str, signal_number: int, global_step: int,
                 checkpoint: str | None):
        self.signal_name, self.signal_number = signal_name, signal_number
        self.global_step, self.checkpoint = global_step, checkpoint
        self.exit_code = 128 + signal_number
        saved = (f"a resumable checkpoint is at {checkpoint}; resume with ckpt_path=\"last\" "
                 f"(ptrain fit ... --ckpt-path last)" if checkpoint else
                 "nothing was saved (fast_dev_run)")
        super().__init__(f"stopped by {signal_name} after step {global_step}: {saved}.")
        self.code = self.exit_code  # what the interpreter exits with (SystemExit's)

    def __reduce__(self):  # travels between processes with its fields
        return (type(self), (self.signal_name, self.signal_number, self.global_step,
                             self.checkpoint))
