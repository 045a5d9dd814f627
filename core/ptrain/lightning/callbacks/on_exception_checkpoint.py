"""``lightning.pytorch.callbacks.on_exception_checkpoint``: ``OnExceptionCheckpoint``, a
checkpoint written when a stage ends with an error."""

from __future__ import annotations

import os
import warnings
from typing import Any

from ptrain.errors import ConfigError, PtrainError
from ptrain.lightning.callbacks.checkpoint import Checkpoint


class OnExceptionCheckpoint(Checkpoint):
    """Lightning's ``OnExceptionCheckpoint``: when a stage ends with an error (a
    ``KeyboardInterrupt`` included) the whole run is saved to ``dirpath/filename.ckpt``
    (resumable with ``ckpt_path=``); a stage that ends well removes that file. When ptrain
    refuses the save (the loss went non-finite: the state is not worth resuming), it says so
    in a warning instead."""

    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: Any, filename: str = "on_exception") -> None:
        if not filename:
            raise ConfigError("OnExceptionCheckpoint(filename='') names no file; give a name "
                              "(the default is 'on_exception').")
        self.dirpath = os.fspath(dirpath)
        self.filename = filename

    @property
    def ckpt_path(self) -> str:
        return os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        try:
            trainer.save_checkpoint(self.ckpt_path)
        except PtrainError as refused:
            warnings.warn(f"OnExceptionCheckpoint did not write {self.ckpt_path}: {refused}",
                          stacklevel=2)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if trainer.exception is None and trainer.is_global_zero \
                and os.path.exists(self.ckpt_path):
            os.remove(self.ckpt_path)


__all__ = ["OnExceptionCheckpoint"]
