"""Sharded checkpoints: a folder each rank writes its shards into, with
``torch.distributed.checkpoint`` (DCP), and turning one into a single file.

A sharded checkpoint at ``PATH`` (e.g. ``checkpoints/last.ckpt``) is a folder:

- the DCP files (``__<rank>_<n>.distcp`` and ``.metadata``) hold ``model`` (the module's
  sharded state dict) and ``optimizers`` (each optimizer's state keyed by parameter names, as
  ``torch.distributed.checkpoint.state_dict`` gives it), so it loads on any number of ranks;
- ``meta.pt``, written by rank 0, holds everything else of a ptrain checkpoint (loop counters,
  random states, plugin states, the config) and the CRC-32 of every other file, checked before
  anything is loaded (meta.pt's own entries carry theirs, as every torch.save file's do).

It is written into ``.PATH.tmp`` and swapped into place once complete (in one step on Linux),
so a crash or a kill at any moment, or a full disk, leaves the previous checkpoint intact.
``ptrain-consolidate SRC DST`` (or :func:`consolidate`) turns it into an ordinary single-file ptrain checkpoint, which resumes with
any single-process or ``ddp`` run and loads with ``torch.load``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter
from torch.distributed.tensor import DTensor
from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                     set_optimizer_state_dict)

from ptrain import CheckpointError, CheckpointWriteError, private_descriptors, replaced_files
from ptrain.background_write import CollectiveWrite, agree_to_write
from ptrain.checkpoint_io import (FOLDER_CHECKSUMS, atomic_save, folder_damage,
                                  incomplete_sharded_folder, load_weights_only, sharded_meta,
                                  write_failed)
from ptrain.direct_file import DirectFile

#: the folder's file of everything but the shards, and its key for the CRC-32 of every other file
META, CHECKSUMS = "meta.pt", FOLDER_CHECKSUMS


def is_sharded(path: str | Path) -> bool:
    return (Path(path) / ".metadata").is_file()


def save(trainer, checkpoint: dict[str, Any], path: str | Path) -> None:
    """Write ``checkpoint`` (as the core assembled it) sharded to ``path``; every rank calls it.

    A write the system refuses on any rank (no space, permission, quota) raises
    :class:`ptrain.CheckpointWriteError` on every rank, the partial folder removed and the
    previous checkpoint at ``path`` untouched."""
    _write(Path(path), *_parts(trainer, checkpoint))


def save_in_background(trainer, checkpoint: dict[str, Any], path: str | Path,
                       group: dist.ProcessGroup) -> Callable[[], None]:
    """As :func:`save`, in two parts: here the shards are copied to host memory
    (``trainer.copy_for_background``); the function returned writes them, to run on the
    background writer's thread, its collectives over ``group`` (every rank, a group the
    training thread does not use). A refusal raises from that function as :func:`save`'s
    does; so does a rank's failed copy, on every rank (a :class:`CollectiveWrite`)."""
    shards, meta = trainer.copy_for_background(_parts(trainer, checkpoint))
    return CollectiveWrite(lambda failed: _write(Path(path), shards, meta, group, failed))


def _parts(trainer, checkpoint: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The shards (the module's and optimizers' state dicts) and ``meta.pt``'s content."""
    meta = dict(checkpoint)
    optimizers = [] if checkpoint.get("weights_only") else trainer.optimizers
    with optimizer_state_ready(optimizers):
        shards = {"model": meta.pop("model"),
                  "optimizers": [get_optimizer_state_dict(trainer.module, opt)
                                 for opt in optimizers]}
    meta.pop("optimizers")
    meta["num_optimizers"] = len(optimizers)
    return shards, meta


def _write(path: Path, shards: dict[str, Any], meta: dict[str, Any],
           group: dist.ProcessGroup | None = None, failed: BaseException | None = None
           ) -> None:
    """Write the shards and ``meta.pt`` into ``.PATH.tmp``, then swap it into place (see
    :func:`_swap_into_place`); every rank, its collectives over ``group`` (``None``: the
    default group). ``failed``: this rank's part of the save failed already (a background
    write's copy): nothing is written, and every rank raises it."""
    tmp = _tmp(path)
    rank0 = dist.get_rank() == 0
    refused = failed
    if rank0 and failed is None:
        replaced_files.wait()  # the space of the checkpoints earlier saves replaced is free
        _recover(path)
        shutil.rmtree(tmp, ignore_errors=True)  # left by a write that was killed
        try:
            tmp.mkdir(parents=True)
        except OSError as exc:
            refused = write_failed(path, exc)
    try:
        agree_to_write(refused, group)  # also: the folder is there
    except BaseException:
        if rank0:  # made here for a write another rank's failed copy stops
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    files = _CheckpointFiles()
    writer = FileSystemWriter(tmp, sync_files=False)  # each file fsyncs as it closes
    writer.fs = files
    try:
        dcp.save(shards, storage_writer=writer, process_group=group)
        # each rank sums the files it wrote; rank 0 keeps them all in meta.pt (itself checked)
        sums: list[dict[str, int] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(sums, files.checksums, group=group)
        meta[CHECKSUMS] = {name: crc for part in sums for name, crc in (part or {}).items()}
        if rank0:
            atomic_save(meta, tmp / META)
    except CheckpointWriteError as exc:  # meta.pt's, on rank 0 (the others learn of it after)
        shutil.rmtree(tmp, ignore_errors=True)
        refused = getattr(exc, "refused", None)
        if refused is None:
            raise
        # said of the checkpoint (the folder), not of the temporary folder's file: its advice
        # names the checkpoint that is intact there
        raise write_failed(path, refused) from None
    except CheckpointException:  # DCP's: raised on every rank
        if rank0:
            shutil.rmtree(tmp, ignore_errors=True)
        # DCP passes a rank's error on as text: each rank tells the others the OSError it kept
        refusals: list[tuple[int, str] | None] = [None] * dist.get_world_size()
        mine = files.refused
        dist.all_gather_object(refusals, None if mine is None else (mine.errno, mine.strerror),
                               group=group)
        refusal = next((r for r in refusals if r is not None), None)
        if refusal is None:
            raise
        raise write_failed(path, OSError(*refusal)) from None
    if rank0:
        _swap_into_place(tmp, path)


class _CheckpointFiles(FileSystem):
    """DCP's local files, each written as a :class:`~ptrain.direct_file.DirectFile` (past the
    page cache where the system allows, on the disk once closed), keeping each file's CRC-32 as
    it was written (:attr:`checksums`, by file name) and the ``OSError`` of a write the system
    refused (:attr:`refused`: ``torch.save`` reports one as "unexpected pos", with the system's
    reason only in its context)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: OSError | None = None
        self.checksums: dict[str, int] = {}

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        stream = _RefusalKeepingStream(self._kept(lambda: DirectFile(private_descriptors.opened(
            lambda: os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)),
            checksum=True)), self)
        try:
            yield stream
        except BaseException:
            stream.file.abandon()
            raise
        stream.close()  # the last bytes, and the fsync: DCP's own fsync is turned off
        self.checksums[Path(path).name] = stream.file.crc32

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)
        if Path(path).name in self.checksums:  # DCP's index, written as ".metadata.tmp"
            self.checksums[Path(new_path).name] = self.checksums.pop(Path(path).name)

    def _kept(self, call: Callable[[], Any]) -> Any:
        """``call()``, keeping the ``OSError`` it raises."""
        try:
            return call()
        except OSError as exc:
            self.refused = exc
            raise


class _RefusalKeepingStream:
    """A :class:`~ptrain.direct_file.DirectFile` whose refused writes ``files`` keeps."""

    def __init__(self, file: DirectFile, files: _CheckpointFiles) -> None:
        self.file, self._files = file, files

    def write(self, data: Any) -> int:
        return self._files._kept(lambda: self.file.write(data))

    def close(self) -> None:
        self._files._kept(self.file.close)

    def __getattr__(self, name: str) -> Any:  # tell, fileno, ...: the file's own
        return getattr(self.file, name)


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def _swap_into_place(tmp: Path, path: Path) -> None:
    """Put the complete folder ``tmp`` at ``path``. Where the system can exchange two paths in
    one step (Linux ``renameat2``), ``path`` holds the old or the new checkpoint at every moment;
    elsewhere the old one is moved aside to ``.PATH.old`` first, which :func:`_recover` puts back
    if the process died between the two renames."""
    if path.exists() and _exchange(tmp, path):
        replaced_files.remove(tmp)  # now the old checkpoint
        return
    old = path.with_name(f".{path.name}.old")
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    replaced_files.remove(old)


def _recover(path: Path) -> None:
    """A checkpoint moved aside by :func:`_swap_into_place` whose replacement never arrived goes
    back to ``path``."""
    old = path.with_name(f".{path.name}.old")
    if old.exists() and not path.exists():
        os.replace(old, path)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the paths ``a`` and ``b`` atomically; ``False`` where the system can't."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def load(trainer, path: str | Path) -> dict[str, Any]:
    """Read a sharded checkpoint into the trainer's (sharded) module and optimizers and return the
    checkpoint dict the core restores from; every rank calls it."""
    path = Path(path)
    aside = path.with_name(f".{path.name}.old")
    if not path.exists() and is_sharded(aside):  # see _swap_into_place
        path = aside
    if not is_sharded(path):
        raise incomplete_sharded_folder(path) or CheckpointError(
            f"{str(path)!r} is not a sharded checkpoint folder (no .metadata in it); "
            f"{trainer.options['strategy']} resumes from the folders it writes. Resume a "
            f"single-file checkpoint with --strategy ddp or single-device.")
    meta = sharded_meta(path)
    _verify_files(path, meta.pop(CHECKSUMS, None))
    if meta.get("num_optimizers", 0) != len(trainer.optimizers) and trainer.optimizers \
            and not meta.get("weights_only"):  # the core refuses to resume from weights only
        raise CheckpointError(f"checkpoint {str(path)!r} holds {meta.get('num_optimizers')} "
                              f"optimizer states; the model configures {len(trainer.optimizers)}.")
    optimizers = [] if meta.get("weights_only") else trainer.optimizers
    with optimizer_state_ready(optimizers):
        shards: dict[str, Any] = {"model": trainer.module.state_dict()}
        if optimizers:  # an evaluation has none; dcp.load requires every key it is given
            shards["optimizers"] = [get_optimizer_state_dict(trainer.module, opt)
                                    for opt in optimizers]
        dcp.load(shards, checkpoint_id=path)
        for optimizer, state in zip(optimizers, shards.get("optimizers", [])):
            set_optimizer_state_dict(trainer.module, optimizer, state)
    meta["model"] = shards["model"]
    meta["optimizers"] = [opt.state_dict() for opt in optimizers]
    return meta


def verify(path: str | Path) -> bool | None:
    """Whether the sharded folder at ``path`` is intact: ``True``, or a :class:`CheckpointError`
    naming the damage; ``None`` when ``path`` is not a sharded folder. Reads every file; one
    process, no collective."""
    path = Path(path)
    if not is_sharded(path):
        return None
    meta = sharded_meta(path)
    damage = folder_damage(path, meta.get(CHECKSUMS))
    if damage is not None:
        raise _integrity_error(path, damage)
    return True


def _integrity_error(path: Path, damage: str) -> CheckpointError:
    return CheckpointError(
        f"sharded checkpoint {str(path)!r} failed its integrity check: {damage}, so it was "
        f"changed or damaged since (a failing disk, an interrupted copy, an edit). It was not "
        f"loaded. Use another checkpoint, e.g. an earlier one of the same run folder, or "
        f"--ckpt-path last-intact for the newest one that is intact.")


def _verify_files(path: Path, checksums: dict[str, int] | None) -> None:
    """Rank 0 checks the files (:func:`ptrain.checkpoint_io.folder_damage`); every rank raises
    the same error."""
    damage = [folder_damage(path, checksums) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(damage, src=0)
    if damage[0] is not None:
        raise _integrity_error(path, damage[0])


@contextlib.contextmanager
def optimizer_state_ready(optimizers: list[torch.optim.Optimizer]) -> Iterator[None]:
    """Inside: every optimizer's state exists, and every trainable parameter has a gradient of
    zeros that holds no memory (a view of one zero).

    ``get_optimizer_state_dict`` and ``set_optimizer_state_dict`` need the state to exist; when
    it does not (before the first step, or an optimizer without state such as plain SGD) torch
    creates it with a step on zero gradients it allocates, one gradient shard per parameter: a
    transient the size of all gradients on every save and every resume. Here that step runs on
    the memory-free zeros, and torch, finding gradients present, leaves the state as it is. The
    gradients set here are removed on leaving."""
    params = [p for optimizer in optimizers for group in optimizer.param_groups
              for p in group["params"] if p.requires_grad and p.grad is None]
    for param in params:
        param.grad = _memoryless_zeros_like(param)
    try:
        for optimizer in optimizers:
            if not optimizer.state:
                _step_without_change(optimizer)
        yield
    finally:
        for param in params:
            param.grad = None


def _memoryless_zeros_like(param: torch.Tensor) -> torch.Tensor:
    local = param.to_local() if isinstance(param, DTensor) else param
    zeros = torch.zeros((), dtype=local.dtype, device=local.device).expand(local.shape)
    if isinstance(param, DTensor):
        return DTensor.from_local(zeros, param.device_mesh, param.placements, run_check=False,
                                  shape=param.shape, stride=param.stride())
    return zeros


def _step_without_change(optimizer: torch.optim.Optimizer) -> None:
    """One step with learning rate 0 (on zero gradients): it creates the optimizer's state
    without changing a parameter."""
    rates = [group.get("lr") for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        if "lr" in group:
            group["lr"] = torch.tensor(0.0) if isinstance(group["lr"], torch.Tensor) else 0.0
    try:
        optimizer.step()
    finally:
        for group, rate in zip(optimizer.param_groups, rates):
            if rate is not None:
                group["lr"] = rate


def _indexed_optimizer_state(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter names -> keyed by position, as
    ``Optimizer.state_dict()`` has it (positions run through the groups in order)."""
    index: dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        ids = []
        for name in group["params"]:
            index.setdefault(name, len(index))
            ids.append(index[name])
        groups.append({**group, "params": ids})
    # an optimizer without per-parameter state (SGD without momentum) has no "state" key here
    return {"state": {index[name]: value for name, value in state.get("state", {}).items()},
            "param_groups": groups}


def consolidate(src: str | Path, dst: str | Path) -> None:
    """Turn the sharded checkpoint folder ``src`` into the single-file checkpoint ``dst``, in this
    process (no process group needed; it must fit in host memory)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    src = Path(src)
    if not is_sharded(src):
        raise incomplete_sharded_folder(src) or CheckpointError(
            f"{str(src)!r} is not a sharded checkpoint folder (no .metadata).")
    checkpoint = sharded_meta(src)
    damage = folder_damage(src, checkpoint.pop(CHECKSUMS, None))
    if damage is not None:
        raise _integrity_error(src, damage)
    with tempfile.TemporaryDirectory() as tmp:
        whole = Path(tmp) / "whole.pt"
        dcp_to_torch_save(src, whole)
        shards = load_weights_only(whole)
    checkpoint["model"] = shards["model"]
    checkpoint["optimizers"] = [_indexed_optimizer_state(s) for s in shards.get("optimizers", [])]
    checkpoint.pop("num_optimizers", None)
    atomic_save(checkpoint, dst)
