"""Lightning's checkpoint IO objects: ``TorchCheckpointIO`` is what ptrain does anyway, a
program's own ``CheckpointIO`` writes and reads the run's checkpoints; see
:mod:`ptrain.lightning.plugins`."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from ptrain import checkpoint_io
from ptrain.errors import ConfigError
from ptrain.hookspecs import hookimpl
from ptrain.lightning._common import refuse

__all__ = ["AsyncCheckpointIO", "CheckpointIO", "TorchCheckpointIO", "XLACheckpointIO"]


class CheckpointIO:
    """How checkpoints are written and read: ``save_checkpoint(checkpoint, path,
    storage_options=None)``, ``load_checkpoint(path, map_location=None)``,
    ``remove_checkpoint(path)``, ``teardown()``. Given to the Trainer (in ``plugins``, or a
    strategy's ``checkpoint_io``), a subclass writes and reads the run's checkpoints on global
    rank 0 through ptrain's ``save_checkpoint``/``load_checkpoint`` hooks; the checkpoint it
    gets is ptrain's dict (``"model"``, ``"optimizers"``, ``"loop"``, ... see
    docs/checkpoints.md), not Lightning's."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any = None) -> None:
        raise NotImplementedError

    def load_checkpoint(self, path: Any, map_location: Any = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def remove_checkpoint(self, path: Any) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        """Clean up at the end of a stage."""

    def ptrain_plugin(self) -> Any:
        """This object as a ptrain plugin (``None``: ptrain's own writing does the same)."""
        return _CheckpointIOPlugin(self)


class TorchCheckpointIO(CheckpointIO):
    """``torch.save``/``torch.load`` of the checkpoint dict: what ptrain does without a
    checkpoint plugin (ptrain writes through a temporary file, so a crash never leaves a half
    file, and reads with ``weights_only=True``). ``load_checkpoint`` takes Lightning's
    ``weights_only`` and reads with torch's weights-only loader whatever it says, as every
    ptrain read does; a subclass may widen what that loader accepts around the call
    (``torch.serialization.safe_globals``), as darts' does."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any = None) -> None:
        if storage_options is not None:
            raise refuse("TorchCheckpointIO.save_checkpoint", "storage_options",
                         storage_options, "torch.save takes no storage options; leave it out")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        checkpoint_io.atomic_save(checkpoint, str(path))

    def load_checkpoint(self, path: Any, map_location: Any = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        return checkpoint_io.load_weights_only(path, map_location=map_location or "cpu")

    def remove_checkpoint(self, path: Any) -> None:
        Path(path).unlink(missing_ok=True)

    def ptrain_plugin(self) -> Any:
        return None if type(self) is TorchCheckpointIO else super().ptrain_plugin()


class AsyncCheckpointIO(CheckpointIO):
    """Lightning's background-thread checkpoint writer. Refused when made: ptrain writes in the
    background through its checkpoint callback (``async_save``), which also defers ranking,
    pruning and the ``last`` link until each file is complete; a checkpoint IO plugin can't."""

    def __init__(self, checkpoint_io: Any = None) -> None:
        raise ConfigError(
            "AsyncCheckpointIO() is not supported by ptrain: a checkpoint IO plugin writes "
            "files, while ptrain's checkpoint callback ranks, prunes and points 'last' at each "
            "file, which must wait until the file is complete. ptrain's background writes are "
            "that callback's option: leave AsyncCheckpointIO out and pass "
            "--checkpoint-async-save (a ptrain.builtins.checkpoint.ModelCheckpoint with "
            "async_save=True in callbacks=[...]). See \"Coming from Lightning\" in ptrain's "
            "documentation.")


class XLACheckpointIO(CheckpointIO):
    """Checkpoints written with ``torch_xla``'s ``xm.save``: what ptrain's ``tpu`` accelerator
    does (``ptrain-xla``); with another accelerator the Trainer refuses it."""

    requires_accelerator = "tpu"

    def ptrain_plugin(self) -> Any:
        return None


class _CheckpointIOPlugin:
    """A program's :class:`CheckpointIO` as a ptrain plugin: global rank 0 writes through it,
    every rank reads through it."""

    name = "checkpoint-io"

    def __init__(self, io: CheckpointIO):
        self.io = io

    @hookimpl(tryfirst=True)
    def save_checkpoint(self, trainer: Any, checkpoint: dict[str, Any], path: str) -> bool:
        if trainer.is_global_zero:
            self.io.save_checkpoint(checkpoint, path)
        return True

    @hookimpl(tryfirst=True)
    def load_checkpoint(self, path: str) -> dict[str, Any]:
        return self.io.load_checkpoint(path)

    @hookimpl(tryfirst=True)
    def verify_checkpoint(self, path: str) -> bool:
        self.io.load_checkpoint(path)
        return True

    @hookimpl
    def teardown(self) -> None:
        self.io.teardown()

    def unloadable_reason(self, value: Any) -> str | None:
        """Why ``value``, saved alone, would not read back through the program's
        ``load_checkpoint`` (``None``: it does): the program reads the run's checkpoints, so
        what it accepts, not ptrain's loader, decides what a checkpoint may hold."""
        if checkpoint_io.unloadable_reason(value) is None:
            return None
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "part.ckpt"
            torch.save(value, path)
            try:
                self.io.load_checkpoint(path)
            except Exception as exc:  # noqa: BLE001 - whatever the program's reader refuses
                lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
                return (f"{type(self.io).__qualname__}.load_checkpoint refuses it "
                        f"({type(exc).__name__}: {lines[0] if lines else ''})")
        return None
