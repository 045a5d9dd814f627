"""``ptrain export``: a checkpoint's module weights as one ``.safetensors`` file, for inference.

The file holds the module's state dict (parameters and buffers, as saved: dtype, shape and
values; no optimizer state, no loop state) and, in the safetensors header's metadata:

- ``"format": "pt"`` (what loaders of PyTorch safetensors files look for), and
- ``"ptrain"``: JSON with ``module_class`` (``"package.module:Class"``), ``hyper_parameters``
  (the module's ``save_hyperparameters()`` values), ``ptrain_version`` of the run that wrote the
  checkpoint, and ``tied``: for each name whose tensor shared its storage with an earlier name
  in the checkpoint (weight tying), that earlier name.

safetensors refuses tensors that share storage. Each name of the state dict is written as its own
tensor (a tied tensor is written once per name, the copies equal), so
``model.load_state_dict(safetensors.torch.load_file(path))`` works with ``strict=True`` on a
model built from ``module_class(**hyper_parameters)``, and the model's own tying holds again
after loading. ``tied`` says which names were one tensor.

Sources: a single-file ptrain checkpoint (single device, ``ddp``, or a sharded one
consolidated with ``ptrain-consolidate``), or a sharded checkpoint folder written with
``torch.distributed.checkpoint`` (``fsdp``, ``zero2``, ``zero3``), read here in one process
without a process group. The strategy plugin that wrote a checkpoint is not imported.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from ptrain.checkpoint_io import (FOLDER_CHECKSUMS, folder_damage, incomplete_sharded_folder,
                                  load_weights_only, module_weights, new_file_mode, safe_load)
from ptrain.errors import CheckpointError, ConfigError

#: Inside a sharded checkpoint folder: the DCP index, and the file holding everything of the
#: checkpoint but the sharded tensors (the layout of ptrain's sharded checkpoints; see
#: ptrain_fsdp.checkpoint, whose META is this name).
DCP_INDEX = ".metadata"
SHARDED_META = "meta.pt"
#: The key of ptrain's JSON in the safetensors header metadata.
METADATA_KEY = "ptrain"


def _consolidate_hint(folder: Path) -> str:
    return (f"Consolidate it into one file first with the command of the strategy plugin that "
            f"wrote it: `ptrain-consolidate {folder} {folder.with_suffix('.consolidated.ckpt')}`"
            f" (from ptrain-fsdp), then `ptrain export "
            f"{folder.with_suffix('.consolidated.ckpt')} --output FILE.safetensors`.")


def read_checkpoint_weights(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The module's state dict stored in the checkpoint at ``path`` (a file or a sharded folder),
    on the CPU, and the rest of the checkpoint (``module_class``, ``hyper_parameters``, ...).
    Raises :class:`CheckpointError` saying what is wrong with ``path``."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist. Give the path of a "
                              f"ptrain checkpoint: a .ckpt file, or a sharded checkpoint folder "
                              f"(e.g. runs/version_0/checkpoints/last.ckpt).")
    if path.is_dir():
        return _read_sharded(path)
    checkpoint = safe_load(path)
    module_weights(checkpoint, path)  # names what the file lacks
    model = checkpoint.pop("model")
    return model, checkpoint


def _read_sharded(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    if not (folder / DCP_INDEX).is_file():
        raise incomplete_sharded_folder(folder) or CheckpointError(
            f"{str(folder)!r} is a folder but not a sharded ptrain checkpoint (it has no "
            f"{DCP_INDEX} file of torch.distributed.checkpoint). Give a .ckpt file, or the "
            f"checkpoint folder a sharding strategy wrote (runs/version_N/checkpoints/last.ckpt).")
    if not (folder / SHARDED_META).is_file():
        raise CheckpointError(
            f"sharded checkpoint {str(folder)!r} has no {SHARDED_META}, the file written beside "
            f"the shards with their checksums: its save was cut short or the folder was copied "
            f"in part, and its shards can't be checked. Nothing was exported. Export another "
            f"checkpoint, e.g. an earlier one of the same run folder.")
    meta = safe_load(folder / SHARDED_META)
    damage = folder_damage(folder, meta.pop(FOLDER_CHECKSUMS, None))
    if damage is not None:  # the check fit and ptrain-consolidate make before reading
        raise CheckpointError(
            f"sharded checkpoint {str(folder)!r} failed its integrity check: {damage}, so it "
            f"was changed or damaged since (a failing disk, an interrupted copy, an edit). "
            f"Nothing was exported. Export another checkpoint, e.g. an earlier one of the same "
            f"run folder.")
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        model = _load_dcp_model(folder)
    except CheckpointError:
        raise
    # whatever torch.distributed.checkpoint raises on this folder; its CheckpointException is a
    # BaseException that holds each rank's traceback, whose last line says what failed
    except (Exception, CheckpointException) as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = (lines[-1] if isinstance(exc, CheckpointException) else lines[0]) if lines \
            else type(exc).__name__
        raise CheckpointError(
            f"the sharded checkpoint {str(folder)!r} could not be read in this process without "
            f"a process group ({reason}). "
            f"{_consolidate_hint(folder)}") from None
    return model, meta


def _load_dcp_model(folder: Path) -> dict[str, Any]:
    """The ``model`` entry of a DCP checkpoint, whole, as plain CPU tensors."""
    from torch.distributed.checkpoint import state_dict_loader

    load_keys = getattr(state_dict_loader, "_load_state_dict_from_keys", None)
    if load_keys is not None:  # reads only the model's tensors, not the optimizer state
        with warnings.catch_warnings():  # "assuming ... a single process": what is meant here
            warnings.filterwarnings("ignore", message=".*torch.distributed is unavailable or "
                                                      "uninitialized")
            loaded = load_keys({"model"}, checkpoint_id=str(folder))
    else:  # older torch: the whole checkpoint through a temporary torch.save file
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            whole = Path(tmp) / "whole.pt"
            dcp_to_torch_save(folder, whole)
            loaded = load_weights_only(whole)
    model = loaded.get("model") if isinstance(loaded, dict) else None
    if not isinstance(model, dict) or not model:
        raise CheckpointError(f"the sharded checkpoint {str(folder)!r} holds no 'model' state "
                              f"dict; it was not written by a ptrain strategy. "
                              f"{_consolidate_hint(folder)}")
    return model


def untie(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, str], list[str]]:
    """``state``'s tensors made safe to write with safetensors: contiguous, on the CPU, none
    sharing storage with another (a tensor whose storage an earlier one uses is cloned).
    Returns the tensors, ``{name: earlier name}`` for the tensors that were tied (same storage,
    offset, shape and strides as an earlier one), and the names of non-tensor entries, left
    out."""
    tensors: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    skipped: list[str] = []
    seen_storage: set[tuple[str, int]] = set()
    seen_view: dict[tuple, str] = {}
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            skipped.append(name)
            continue
        value = value.detach()
        if hasattr(value, "full_tensor"):  # a DTensor in a single-file checkpoint
            value = value.full_tensor()
        value = value.cpu()
        if value.numel() == 0:  # no storage to share
            tensors[name] = value.contiguous()
            continue
        storage = (value.device.type, value.untyped_storage().data_ptr())
        view = (storage, value.storage_offset(), tuple(value.shape), value.stride(), value.dtype)
        if view in seen_view:
            tied[name] = seen_view[view]
        if storage in seen_storage or not value.is_contiguous():
            value = value.clone(memory_format=torch.contiguous_format)
        else:
            seen_storage.add(storage)
        seen_view.setdefault(view, name)
        tensors[name] = value
    return tensors, tied, skipped


def check_output(output: Path, checkpoint: Path | None, force: bool) -> None:
    """Refuse (:class:`ConfigError`) an ``output`` that is a folder, the ``checkpoint`` being
    read, an existing file without ``force``, or in a folder that does not exist."""
    if output.exists() and output.is_dir():
        raise ConfigError(f"the output {str(output)!r} is a folder; give a file path such as "
                          f"{str(output / 'model.safetensors')!r}.")
    if output.exists() and not stat.S_ISREG(output.stat().st_mode):
        raise ConfigError(f"the output {str(output)!r} is not a regular file (a device, a pipe "
                          f"or a socket), which the export would replace, --force or not; "
                          f"nothing was written. Give the path of a file.")
    if checkpoint is not None and output.exists() and output.resolve() == checkpoint.resolve():
        raise ConfigError(f"the output {str(output)!r} is the checkpoint being exported; give "
                          f"another path, such as {str(output.with_suffix('.safetensors'))!r}.")
    if output.exists() and not force:
        raise ConfigError(f"the output {str(output)!r} exists already; nothing was written. Pass "
                          f"--force (force=True from Python) to overwrite it, or give another "
                          f"path.")
    if not output.parent.is_dir():
        raise ConfigError(f"the folder of the output, {str(output.parent)!r}, does not exist; "
                          f"nothing was written. Create it (mkdir -p {output.parent}) or give "
                          f"a path in an existing folder.")


def export_safetensors(checkpoint_path: str | Path, output: str | Path, *,
                       force: bool = False) -> dict[str, Any]:
    """Write the module weights of the checkpoint at ``checkpoint_path`` (a file or a sharded
    folder) to ``output`` in safetensors format, with ptrain's metadata (see the module
    docstring). Refuses to overwrite an existing ``output`` unless ``force``; writes atomically
    (a temporary file renamed into place). Returns the metadata written (``module_class``,
    ``hyper_parameters``, ``ptrain_version``, ``tied``) plus ``tensors``, the number written.

    Raises :class:`CheckpointError` for a missing, foreign or unreadable checkpoint and
    :class:`ConfigError` for an unusable ``output``."""
    checkpoint_path, output = Path(checkpoint_path), Path(output)
    check_output(output, checkpoint_path, force)
    state, rest = read_checkpoint_weights(checkpoint_path)
    return write_weights(state, output, rest)


def write_weights(state: dict[str, Any], output: str | Path, info: dict[str, Any]) -> dict[str, Any]:
    """Write the module state dict ``state`` to ``output`` in safetensors format, atomically
    (a temporary file renamed into place), with the metadata of the module docstring taken from
    ``info`` (``module_class``, ``hyper_parameters``, ``ptrain_version``; ``tied`` is worked
    out here). A non-tensor entry is left out with a warning. Returns the metadata written plus
    ``tensors``, the number written."""
    output = Path(output)
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise ConfigError("exporting needs the safetensors package, a dependency of ptrain-core "
                          "that is missing here: pip install safetensors") from None
    tensors, tied, skipped = untie(state)
    if skipped:
        warnings.warn(f"ptrain export: {', '.join(skipped)} in the module's state dict "
                      f"{'is not a tensor' if len(skipped) == 1 else 'are not tensors'} and "
                      f"cannot be stored in safetensors; left out of {output}.", stacklevel=3)
    info = {"module_class": info.get("module_class"),
            "hyper_parameters": info.get("hyper_parameters") or {},
            "ptrain_version": info.get("ptrain_version"),
            "tied": tied}
    metadata = {"format": "pt", METADATA_KEY: json.dumps(info, sort_keys=True)}

    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.chmod(tmp, new_file_mode())  # mkstemp's 0600 would outlive the rename
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return {**info, "tensors": len(tensors)}


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The ``ptrain`` metadata of a file written by :func:`export_safetensors` (``{}`` for a
    safetensors file without it)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
    return json.loads(metadata[METADATA_KEY]) if METADATA_KEY in metadata else {}


def run_export(checkpoint: str, output: str, force: bool) -> str:
    """``ptrain export``: export and return the line to print."""
    info = export_safetensors(checkpoint, output, force=force)
    size = Path(output).stat().st_size / 1e6
    tied = f", {len(info['tied'])} tied" if info["tied"] else ""
    return (f"wrote {output}: {info['tensors']} tensors{tied}, {size:.2f} MB, module "
            f"{info['module_class']}")


__all__ = ["export_safetensors", "read_checkpoint_weights", "read_metadata", "untie",
           "write_weights"]
