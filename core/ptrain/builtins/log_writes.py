"""What the file loggers (``tensorboard``, ``csv``) do when the system refuses a write of their
file (no space, a quota, a file-size limit, a permission, a read-only filesystem): their
``on_write_error`` option, with the checkpoint callback's choices and default.

``stop`` (the default) ends the run with :class:`ptrain.LogWriteError` (CLI exit 2): training
on would fill no log, and on a full disk no checkpoint either. ``warn`` says so once and trains
on; the logger writes nothing more in that stage. Either way what the file held before stays
readable, and the message names the run's checkpoint to resume from.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ptrain.builtins.checkpoint import WRITE_ERROR_CHOICES
from ptrain.checkpoint_io import log_write_failed
from ptrain.errors import ConfigError


def write_error_choice(plugin: str, value: str) -> str:
    """``value`` of ``plugin``'s ``on_write_error``, checked."""
    if value not in WRITE_ERROR_CHOICES:
        raise ConfigError(f"{plugin} on_write_error {value!r} is not valid; valid choices: stop "
                          f"(end the run with the error), warn (say so once and train on "
                          f"without this log).")
    return value


def add_write_error_option(options, what: str) -> None:
    """Declare ``on_write_error`` for a logger writing ``what``."""
    options.add("on_write_error", str, default="stop", choices=WRITE_ERROR_CHOICES,
                help=f"when {what} can't be written (disk full, permission, quota): stop the "
                     f"run with the error, or warn once and train on without it")


def refused(plugin: str, on_write_error: str, path: str | Path, error: OSError, what: str,
            checkpoint: str | Path | None, stage_over: bool = False) -> None:
    """Handle a write of ``what`` to ``path`` that the system refused with ``error``, on the
    training thread: raise :class:`ptrain.LogWriteError` (``stop``) or say it on stderr
    (``warn``, and at the end of a stage, ``stage_over``, when there is no run left to stop).
    The caller writes nothing more to the file in this stage, so this is said once."""
    failure = log_write_failed(path, error, what, checkpoint)
    if on_write_error == "stop" and not stage_over:
        failure.args = (f"{failure} To warn once and train on without it instead, pass "
                        f"--{plugin}-on-write-error warn.",)
        raise failure
    then = ("" if stage_over else
            f" Nothing more is written to it in this stage; training goes on "
            f"(--{plugin}-on-write-error warn).")
    print(f"ptrain: warning: {failure}{then}", file=sys.stderr, flush=True)
