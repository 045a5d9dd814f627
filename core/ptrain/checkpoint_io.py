"""Writing checkpoints atomically and reading them safely; random-number-generator states.

A ptrain checkpoint is a dict of tensors and plain Python values, so it loads with
``torch.load(weights_only=True)``: a file that needs arbitrary pickled objects is refused.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import pickle
import pickletools
import re
import random
import tempfile
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Any, Iterator

import torch

from ptrain import private_descriptors, replaced_files
from ptrain.direct_file import DirectFile
from ptrain.errors import (CheckpointError, CheckpointNotFoundError, CheckpointWriteError,
                           LogWriteError)

FORMAT = "ptrain-checkpoint"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: torch's words for a pickled global the weights-only loader refuses (a class, a function to
#: call): "Unsupported global: GLOBAL x.y", or "unsupported GLOBAL x.y whose module x is blocked"
_UNSUPPORTED_GLOBAL = re.compile(r"unsupported (?:global: )?GLOBAL (\S+)", re.IGNORECASE)
#: ... for an object whose class it won't build (a NumPy string dtype): "Can only build
#: Tensor, ... but got <class 'x.y'>"
_UNBUILT_CLASS = re.compile(r"Can only build .* but got <class '([^']+)'>")
#: ... and for a pickle stream that is no torch.save file (a plain pickle.dump)
_UNSUPPORTED_OPERAND = re.compile(r"Unsupported operand \d+")
FORMAT_VERSION = 1


def new_file_mode() -> int:
    """The permissions a new file gets under this process's umask (``0o666 & ~umask``):
    ``tempfile.mkstemp`` makes its files ``0o600``, so a file written through one is set to this
    before it is renamed into place, as any file the user's tools write. The umask is read from
    ``/proc/self/status`` where there is one (setting it to read it back is not thread-safe)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_save(checkpoint: dict[str, Any], path: str | Path) -> None:
    """Write to a temporary file in the same folder (a :class:`~ptrain.direct_file.DirectFile`:
    past the page cache where the system allows, fsynced), rename it over ``path`` and fsync the
    folder: a crash at any point leaves either the old file or the new one, never a mix. The
    old file's blocks are freed on a thread of its own (:mod:`ptrain.replaced_files`); a save
    first waits for the frees of earlier ones. A write the system refuses (no space,
    permission, quota, file-size limit) removes the partial file and raises
    :class:`CheckpointWriteError` (see :func:`write_failed`)."""
    path = Path(path)
    replaced_files.wait()  # the space of the files earlier saves replaced is free again
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = private_descriptors.opened(
            lambda: tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent),
            fd_of=lambda made: made[0])
    except OSError as exc:
        raise write_failed(path, exc) from None
    writer: _RecordingWriter | None = None
    try:
        with DirectFile(fd) as f:  # on the disk once closed; past the page cache where it can
            os.fchmod(fd, new_file_mode())
            writer = _RecordingWriter(f)
            torch.save(checkpoint, writer)
        replaced = replaced_files.hold(path)
        try:
            os.replace(tmp, path)
        finally:
            replaced_files.release(replaced)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        # torch reports a failed write as "unexpected pos"; the system's reason is the OSError
        refused = exc if isinstance(exc, OSError) else writer.error if writer else None
        if refused is not None:
            raise write_failed(path, refused) from None
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class _RecordingWriter:
    """A binary file for ``torch.save`` that keeps the ``OSError`` a write raised."""

    def __init__(self, file: Any):
        self.file, self.error = file, None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.file.flush()


#: what to do about a refused write where it was, by errno
_WRITE_FIXES = {
    errno.ENOSPC: "free space on that disk",
    errno.EDQUOT: "free space within your quota",
    errno.EFBIG: "raise the file-size limit (ulimit -f), which is below the file's size",
    errno.EACCES: "make the folder writable",
    errno.EPERM: "make the folder writable",
}
#: refusals about which nothing can be done where the write was
_ONLY_ELSEWHERE = {errno.EROFS: "the filesystem is read-only"}


def _intact_checkpoint(path: Path) -> Path | None:
    """The checkpoint of the run to resume from after a refused write to ``path``: the
    previous file there (a write replaces it only when complete), else the newest other
    checkpoint beside it."""
    if path.exists():
        return path
    others = [p for p in path.parent.glob("*.ckpt") if not p.name.startswith(".")]
    return max(others, key=lambda p: p.stat().st_mtime, default=None)


def write_failed(path: str | Path, error: OSError, what: str = "checkpoint",
                 checkpoint: str | Path | None = None) -> CheckpointWriteError:
    """The error for a checkpoint write to ``path`` that the system refused with ``error``; the
    caller has removed what it wrote. Its advice works when followed literally: it names the
    checkpoint to resume from, which ``--default-root-dir`` elsewhere does not change. For a
    file that is not itself a checkpoint (``what``: the top-k record), ``checkpoint`` is the
    one whose intact file (or, gone, the newest beside it) the advice names."""
    path = Path(path)
    previous = (f"the previous {path.name} there is intact" if path.exists() else
                "no earlier file was touched")
    resume = _intact_checkpoint(path if checkpoint is None else Path(checkpoint))
    failure = CheckpointWriteError(
        f"could not write {what} {str(path)!r}: {_reason(error)}. Nothing saved before was "
        f"replaced ({previous}) and the partial file was removed. To go on: "
        f"{_to_go_on(error, resume)}.")
    failure.refused = error  # for a writer whose file is part of a checkpoint named otherwise
    return failure


def log_write_failed(path: str | Path, error: OSError, what: str,
                     checkpoint: str | Path | None) -> LogWriteError:
    """The error for a write of a logger's file (``what``: "the TensorBoard log") to ``path``
    that the system refused with ``error``: the same advice as :func:`write_failed`'s, naming the
    run's checkpoint to resume from (``checkpoint``'s file, else the newest beside it)."""
    resume = None if checkpoint is None else _intact_checkpoint(Path(checkpoint))
    saved = (", and so do the run's checkpoints" if resume is not None else
             "; no checkpoint of this run was written yet")
    return LogWriteError(
        f"could not write {what} {os.fsdecode(path)!r}: {_reason(error)}. What it holds up to "
        f"now stays readable{saved}. To go on: {_to_go_on(error, resume)}.")


def _reason(error: OSError) -> str:
    """``error`` in words, with its errno's name: "No space left on device (ENOSPC)"."""
    name = errno.errorcode.get(error.errno or 0, "")
    return f"{error.strerror or error} ({name})" if name else str(error)


def _to_go_on(error: OSError, resume: Path | None) -> str:
    """What to do after a refused write: the fix where the write was, then resuming from
    ``resume`` (or training again without one), or going on on another disk."""
    elsewhere = ("train again from the start with --default-root-dir on another disk (no "
                 "checkpoint of this run was written before)" if resume is None else
                 f"resume in a new run folder on another disk with --default-root-dir NEW "
                 f"--ckpt-path '{resume}'")
    errno_ = error.errno or 0
    if errno_ in _ONLY_ELSEWHERE:
        return f"{_ONLY_ELSEWHERE[errno_]}; {elsewhere}"
    fix = _WRITE_FIXES.get(errno_, "check the disk and the folder's permissions")
    here = ("train again" if resume is None else f"resume with --ckpt-path '{resume}'")
    return f"{fix}, then {here}; or {elsewhere}"


_PLAIN_LEAVES = (torch.Tensor, torch.nn.Parameter, int, float, complex, str, bytes, bool,
                 type(None), torch.dtype, torch.device, torch.Size)


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is made only of types the weights-only loader always reads back."""
    if type(value) in (dict, list, tuple) and depth < 100:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in items)
    return type(value) in _PLAIN_LEAVES  # exactly: a subclass (an IntEnum) may not load


def _numpy_scalar_globals() -> list[Any]:
    """What the weights-only loader needs to rebuild NumPy's numeric and boolean scalars (a
    scheduler whose learning rates come from ``np.cos`` leaves ``np.float64`` values in its and
    its optimizer's state): NumPy's scalar constructor, which builds a scalar from its dtype
    and raw bytes, and the dtype classes; nothing that runs other code. Empty without NumPy."""
    try:
        import numpy as np
    except ImportError:
        return []
    try:
        from numpy._core.multiarray import scalar
    except ImportError:  # NumPy 1
        from numpy.core.multiarray import scalar
    return [scalar, np.dtype, *{type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDG"}]


def load_weights_only(source: Any, map_location: Any = "cpu") -> Any:
    """``torch.load(source, weights_only=True)``, NumPy's scalars allowed (see
    :func:`_numpy_scalar_globals`): how ptrain reads every checkpoint file. Torch's list of
    allowed globals is as it was afterwards: those the program allowed itself
    (``torch.serialization.add_safe_globals``) stay allowed, so only the ones not yet allowed
    are added for the read (torch's ``safe_globals`` removes on exit all it was given)."""
    allowed = set(torch.serialization.get_safe_globals())
    added = [g for g in _numpy_scalar_globals() if g not in allowed]
    with torch.serialization.safe_globals(added):
        return torch.load(source, map_location=map_location, weights_only=True)


def unloadable_reason(value: Any) -> str | None:
    """Why ``value`` could not be read back from a checkpoint by the weights-only loader (it
    holds a class, a function, an object of a class of its own...), or ``None`` when it can.
    Plain data (tensors, numbers, text, and dicts, lists and tuples of them) is known loadable
    from its types; anything else is serialised in memory once and read back: for a check at
    the first save, not at every one."""
    if _plain(value):
        return None
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
        buffer.seek(0)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            load_weights_only(buffer)
    except Exception as exc:  # noqa: BLE001 - whatever the pickler or the loader refuses
        text = _ANSI.sub("", str(exc))
        unsafe = _UNSUPPORTED_GLOBAL.search(text) or _UNBUILT_CLASS.search(text)
        if unsafe:
            return f"it holds {unsafe.group(1)}, which the weights-only loader refuses"
        # torch's reason follows its general advice, which names nothing
        reason = text.split("WeightsUnpickler error:", 1)[-1]
        lines = [line.strip() for line in reason.splitlines() if line.strip()]
        return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return None


#: the words --ckpt-path takes for a checkpoint it finds (besides a path)
CKPT_PATH_WORDS = ("last", "best", "last-intact", "auto")


def _not_a_file(path: Path) -> CheckpointError:
    """Why ``path`` (not a regular file) can't be read as a checkpoint, in the user's terms."""
    fix = "Give the path of a .ckpt file, or `last` to resume the latest run."
    if path.is_dir():
        found = sorted(str(p) for p in path.rglob("*.ckpt"))[:3]
        inside = (f"; checkpoints under it: {', '.join(found)}" if found else
                  "; no .ckpt file is under it")
        return CheckpointError(f"checkpoint {str(path)!r} is a folder, not a checkpoint "
                               f"file{inside}. {fix}")
    if path.is_symlink():
        return CheckpointNotFoundError(
            f"checkpoint {str(path)!r} is a symbolic link that leads to no file (it points to a "
            f"missing path, or loops: {os.readlink(path)!r}). {fix}")
    if path.exists():
        return CheckpointError(
            f"checkpoint {str(path)!r} is not a regular file (a named pipe, socket or device), "
            f"so it can't be a checkpoint and is not opened. {fix}")
    word = str(path)
    if os.sep not in word and "." not in word:  # lats, lastest: a slip of a word, not a path
        from ptrain.options import closest

        fix = closest(word, CKPT_PATH_WORDS).lstrip() + f" {fix}"
    return CheckpointNotFoundError(f"checkpoint {str(path)!r} does not exist. {fix.strip()}")


def safe_load(path: str | Path, trusted: bool = False) -> dict[str, Any]:
    """Read a ptrain checkpoint onto the CPU, or raise :class:`CheckpointError` saying why not.
    A checkpoint Lightning's Trainer wrote comes back in the layout of ptrain's weights-only
    checkpoints (:mod:`ptrain.lightning_files`). ``trusted``: the caller asked to read the whole
    file, whatever Python objects it holds (Lightning's ``weights_only=False``); otherwise
    torch's weights-only loader reads it."""
    from ptrain import lightning_files

    path = Path(path)
    if (path / ".metadata").is_file():  # torch.distributed.checkpoint's folder
        flags = _sharded_writer(sharded_meta(path))  # an incomplete one is named for its lack
        wrote = (f"written under {flags}, which this run's strategy does not read: run with "
                 f"those flags" if flags else
                 "written by a sharding strategy such as fsdp, zero2 or zero3, which this run's "
                 "strategy does not read: run with the strategy that wrote it")
        raise CheckpointError(
            f"checkpoint {str(path)!r} is a sharded checkpoint folder, {wrote}, or turn it "
            f"into a single file first: ptrain-consolidate {path} whole.ckpt")
    incomplete = incomplete_sharded_folder(path)
    if incomplete is not None:
        raise incomplete
    if not path.is_file():
        raise _not_a_file(path)
    verify_integrity(path)
    try:
        with warnings.catch_warnings():  # the refusal below says what the file is
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            checkpoint = (torch.load(path, map_location="cpu", weights_only=False) if trusted
                          else load_weights_only(path))
    except pickle.UnpicklingError as exc:
        text = _ANSI.sub("", str(exc))
        unsafe = _UNSUPPORTED_GLOBAL.search(text)
        if unsafe:
            raise CheckpointError(
                f"checkpoint {str(path)!r} was refused as unsafe: loading it would import and "
                f"call {unsafe.group(1)}, arbitrary pickled Python that could run any code; it "
                f"was not run. ptrain checkpoints hold only tensors and plain values, so this "
                f"file was not written by ptrain as it is (one Lightning wrote may hold such "
                f"hyperparameters: if you trust where it came from, "
                f"load_from_checkpoint(path, weights_only=False) reads it whole). To see what "
                f"it holds without running it: {_inspect_command(path)}"
            ) from None
        if _UNSUPPORTED_OPERAND.search(text) and _is_plain_pickle(path):
            raise CheckpointError(
                f"checkpoint {str(path)!r} was refused as unsafe: it is a plain pickle, not a "
                f"torch.save file, and unpickling it could run any code; it was not read. To see "
                f"what it holds without running it: {_inspect_command(path)}"
            ) from None
        raise _corrupt(path, exc) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as exc:
        raise _corrupt(path, exc) from None
    except (KeyError, IndexError):  # the weights-only unpickler, on bytes that are no pickle
        raise _corrupt(path, ValueError("its bytes are not a torch.save file")) from None
    if lightning_files.is_lightning_checkpoint(checkpoint):
        return lightning_files.as_ptrain_checkpoint(checkpoint, FORMAT, FORMAT_VERSION)
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        keys = _keys(checkpoint) if isinstance(checkpoint, dict) else type(checkpoint)
        raise CheckpointError(
            f"{str(path)!r} is not a ptrain checkpoint (it holds {keys}; {_WHAT_IT_HOLDS}). "
            f"Resume only from checkpoints written by ptrain; to start from other weights, load "
            f"them in your module's __init__."
        )
    version = checkpoint.get("format_version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise CheckpointError(
            f"checkpoint {str(path)!r} has format version {version!r}, which no ptrain writes "
            f"(a whole number); it was changed after the save or written by another program. "
            f"Give another checkpoint with --ckpt-path.")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {str(path)!r} has format version {checkpoint['format_version']}, newer "
            f"than this ptrain reads ({FORMAT_VERSION}); upgrade ptrain-core."
        )
    return checkpoint


#: what every ptrain checkpoint holds, for the messages about one that lacks it
_WHAT_IT_HOLDS = ("a ptrain checkpoint holds 'format': 'ptrain-checkpoint', 'model' (the "
                  "module's state dict) and, to resume fit, 'optimizers', 'lr_schedulers', "
                  "'loop' and 'rng'")
#: entry -> what it is, for the entries the core restores a stage from
_RESUME_ENTRIES = {"optimizers": "the optimizer states", "lr_schedulers": "the scheduler states",
                   "loop": "the loop counters", "rng": "the random generators' states"}


def _keys(checkpoint: dict[str, Any], most: int = 12) -> str:
    keys = sorted(map(str, checkpoint))
    return repr(keys[:most])[:-1] + (f", ... {len(keys) - most} more]" if len(keys) > most
                                     else "]")


def module_weights(checkpoint: dict[str, Any], path: str | Path, *,
                   resuming: bool = False) -> dict[str, Any]:
    """The module's state dict in ``checkpoint`` (read from ``path``), or a
    :class:`CheckpointError` naming the file, the entries it has and what a ptrain checkpoint
    holds. ``resuming`` (``fit`` from it): the entries a resume restores must be there too,
    unless it holds the weights only (the caller refuses that one with its own reason)."""
    missing = [] if isinstance(checkpoint.get("model"), dict) else ["model"]
    if resuming and not checkpoint.get("weights_only"):
        missing += [key for key in _RESUME_ENTRIES if key not in checkpoint]
    if not missing:
        return checkpoint["model"]
    what = ", ".join(f"{key!r} ({_RESUME_ENTRIES.get(key, 'the module weights')})"
                     for key in missing)
    return_to = ("fit can't resume from it" if "model" not in missing else
                 "there are no weights to load")
    raise CheckpointError(
        f"checkpoint {str(path)!r} lacks {what}, so {return_to}: it holds {_keys(checkpoint)}, "
        f"while {_WHAT_IT_HOLDS}. It was written by other code or edited since ptrain saved it. "
        f"Give a checkpoint that ptrain's Trainer wrote as it was (the checkpoint callback's "
        f"files, trainer.save_checkpoint), e.g. another one of the same run folder.")


def load_module_weights(module: torch.nn.Module, checkpoint: dict[str, Any], path: str | Path,
                        *, resuming: bool = False) -> None:
    """Load the checkpoint's module weights (see :func:`module_weights`) into ``module``,
    strictly. Weights that don't fit are a :class:`CheckpointError` that keeps torch's detail
    (which tensors, which shapes) and, where the checkpoint records how its model was built
    (the CLI's ``[model]`` config, else the class and saved hyperparameters; the run folder's
    ``hparams.toml``), says which configuration fits."""
    weights = module_weights(checkpoint, path, resuming=resuming)
    try:
        module.load_state_dict(weights)
    except RuntimeError as exc:
        lines = [line.strip().rstrip(".") for line in _ANSI.sub("", str(exc)).splitlines()
                 if line.strip()]
        detail = "; ".join(lines[1:9]) + ("; ..." if len(lines) > 9 else "")
        raise CheckpointError(
            f"checkpoint {str(path)!r} does not fit this model ({type(module).__name__}): "
            f"{detail or lines[0] if lines else type(exc).__name__}. "
            f"{_fitting_configuration(checkpoint, Path(path), module)}") from None


def _fitting_configuration(checkpoint: dict[str, Any], path: Path,
                           module: torch.nn.Module | None = None) -> str:
    """The sentences saying which model configuration wrote ``checkpoint``, as flags, and how
    its saved hyperparameters differ from ``module``'s. A run that gave no init arguments (the
    model's defaults) is named as such, with the defaults of then where they were saved: "give
    those init arguments" alone would name none."""
    model = (checkpoint.get("config") or {}).get("model") or {}
    class_path, init_args = model.get("class_path"), model.get("init_args")
    if not class_path and checkpoint.get("module_class"):
        class_path = checkpoint["module_class"]
        init_args = checkpoint.get("hyper_parameters")
    saved = checkpoint.get("hyper_parameters")
    saved = saved if isinstance(saved, dict) else None
    now = _hyperparameters_of(module)
    run = path.parent.parent
    hparams = run / "hparams.toml"
    where = f" (its run folder's {hparams} records them too)" if hparams.is_file() else ""
    differ = ""
    if saved is not None and now is not None and saved != now:
        keys = [key for key in {**saved, **now} if saved.get(key, _UNSET) != now.get(key, _UNSET)]
        differ = (f"The checkpoint's model was built with {_settings(saved, keys)}, this one "
                  f"with {_settings(now, keys)}. ")
    if not class_path:
        return (f"{differ}Build the model with the class and init arguments of the run that "
                f"wrote it{where}.")
    given = init_args if isinstance(init_args, dict) else {}
    written = (f"It was written by --model {class_path} {_flags(given)}" if given else
               f"It was written by --model {class_path} with the model's defaults")
    unsaved = {key: value for key, value in given.items() if key not in (saved or {})}
    if saved and saved == now and unsaved:  # e.g. save_hyperparameters(ignore=...)
        return (f"{written}{where}; this model saved the same hyperparameters, but the model "
                f"does not save {_flags(unsaved)}, which that run gave: give those init "
                f"arguments. If this model was built with them, the model's code has changed "
                f"since the checkpoint was written (other layers or shapes): build the model "
                f"with the code of then.")
    if saved and saved == now:  # built alike: the layers differ
        same = f" ({_flags(saved)})" if not given else ""
        return (f"{written}; this model has the same hyperparameters{same}, so the model's "
                f"code has changed since the checkpoint was written (other layers or shapes): "
                f"build the model with the code of then.")
    if given and not saved:  # nothing says how this model was built: either may be the cause
        return (f"{written}{where}, and it saved no hyperparameters to compare this model's "
                f"with: give exactly those init arguments (no other --model.KEY), or leave "
                f"--model out to build the model from the checkpoint's own record; if this "
                f"model was built so, the model's code or its defaults have changed since the "
                f"checkpoint was written, so build it with the code of then.")
    if given:
        return (f"{differ}{written}{where}: give those init arguments, or leave --model out to "
                f"build the model from the checkpoint's own record.")
    if saved:  # the CLI rebuilds from them without --model
        return (f"{differ}{written}, which were then {_flags(saved)}{where}: give those init "
                f"arguments, or leave --model out to build the model from the checkpoint's "
                f"saved hyperparameters" + ("." if differ else
                                            "; if this model has them, its code has changed "
                                            "since (other layers or shapes)."))
    return (f"{differ}{written} (no init arguments, and it saved no hyperparameters): leave out "
            f"any --model.KEY you gave; if you gave none, the model's code or its defaults have "
            f"changed since the checkpoint was written, so build it with the code of then.")


_UNSET = object()


def _hyperparameters_of(module: torch.nn.Module | None) -> dict[str, Any] | None:
    """``module``'s hyperparameters in the saved form (as a checkpoint holds them), if any."""
    from ptrain.hyperparameters import saved_hyperparameters

    hparams = getattr(module, "hparams", None)
    try:
        return saved_hyperparameters(hparams) if hparams is not None else None
    except Exception:  # noqa: BLE001 - a message's detail: none rather than a second error
        return None


def _flags(init_args: dict[str, Any]) -> str:
    return " ".join(f"--model.{key} {flag_value(value)}" for key, value in init_args.items())


def _settings(hparams: dict[str, Any], keys: list[str]) -> str:
    """``width=4, depth=2`` of ``keys`` in ``hparams`` (``no depth`` where it lacks one)."""
    return ", ".join(f"{key}={flag_value(hparams[key])}" if key in hparams else f"no {key}"
                     for key in keys)


def flag_value(value: Any) -> str:
    """``value`` as the command line's ``--model.KEY VALUE`` reads it back (a TOML value)."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if text and " " not in text else repr(text)


def verify_integrity(path: str | Path) -> None:
    """Check every entry of the torch.save archive at ``path`` against the CRC-32 checksum
    written beside it when it was saved (the zip format's own), or raise
    :class:`CheckpointError` naming the entry: a bit changed on disk since (a failing drive, a
    bad copy, an edit) would otherwise load as different weights without a word. Reads the whole
    file (about 0.6 s per GB). A file that is no zip archive is left to the loader to judge."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return
    if damaged is None:
        return
    what = ("its tensor data" if "/data/" in damaged else
            "its structure (the pickled dict)" if damaged.endswith("data.pkl") else damaged)
    raise CheckpointError(
        f"checkpoint {str(path)!r} failed its integrity check: the bytes of {what} (archive "
        f"entry {damaged!r}) no longer match the checksum written when it was saved, so it was "
        f"changed or damaged since (a failing disk, an interrupted copy, an edit). It was not "
        f"loaded. Use another checkpoint, e.g. an earlier one of the same run folder, or "
        f"--ckpt-path last-intact for the newest one that is intact.")


def file_crc32(path: str | Path) -> int:
    """The CRC-32 of the file at ``path``, read in 1 MiB pieces."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


#: The key, in a sharded checkpoint folder's ``meta.pt``, of the CRC-32 of each of its files.
FOLDER_CHECKSUMS = "file_checksums"


def folder_damage(folder: str | Path, checksums: dict[str, int] | None) -> str | None:
    """What is wrong with the files of ``folder`` against ``checksums`` (file name -> CRC-32,
    as a sharded checkpoint keeps them), or ``None`` when every file is there and unchanged."""
    for name, crc in sorted((checksums or {}).items()):
        file = Path(folder) / name
        if not file.is_file():
            return f"its file {name!r} is missing"
        if file_crc32(file) != crc:
            return (f"the bytes of its file {name!r} no longer match the checksum written when "
                    f"it was saved")
    return None


#: Inside a sharded checkpoint folder: torch.distributed.checkpoint's index of the shards, and
#: the file with everything of the checkpoint but the sharded tensors (ptrain_fsdp's layout).
SHARDED_INDEX, SHARDED_META = ".metadata", "meta.pt"
_NEXT_CHECKPOINT = ("Resume from another checkpoint: --ckpt-path last-intact takes the newest "
                    "intact one and passes over this folder, saying so; or give an earlier "
                    "checkpoint of the same run folder by its path.")


def incomplete_sharded_folder(path: str | Path) -> CheckpointError | None:
    """The error for a folder that holds a sharded checkpoint's files (shards, ``meta.pt``) but
    not torch.distributed.checkpoint's ``.metadata`` index, without which the shards can't be
    read; ``None`` for anything else."""
    path = Path(path)
    if not path.is_dir() or (path / SHARDED_INDEX).is_file():
        return None
    shards = sorted(p.name for p in path.glob("*.distcp"))
    if not shards and not (path / SHARDED_META).is_file():
        return None
    has = ", ".join(filter(None, [f"{len(shards)} .distcp shard file(s)" if shards else "",
                                  SHARDED_META if (path / SHARDED_META).is_file() else ""]))
    return CheckpointError(
        f"checkpoint {str(path)!r} is a sharded checkpoint folder without its {SHARDED_INDEX} "
        f"file, the index torch.distributed.checkpoint writes once every shard is saved (it "
        f"has {has}): its save was cut short or the folder was copied in part, and its shards "
        f"can't be read by any strategy. {_NEXT_CHECKPOINT}")


def _sharded_writer(meta: dict[str, Any]) -> str | None:
    """The flags of the strategy that wrote a sharded folder (``--strategy fsdp --devices 2``),
    from its ``meta.pt``; ``None`` where it does not say (a folder of an older ptrain)."""
    trainer = (meta.get("config") or {}).get("trainer") or {}
    strategy = trainer.get("strategy")
    if not isinstance(strategy, str):
        return None
    flags = [f"--strategy {strategy}"]
    for name in ("devices", "num_nodes"):
        if trainer.get(name) not in (None, "auto", 1):
            flags.append(f"--{name.replace('_', '-')} {trainer[name]}")
    return " ".join(flags)


def sharded_meta(path: str | Path, read: bool = True) -> dict[str, Any]:
    """The ``meta.pt`` of the sharded checkpoint folder ``path`` (read with :func:`safe_load`;
    an empty dict without ``read``), or a :class:`CheckpointError` saying the folder is
    incomplete without it."""
    path = Path(path)
    meta = path / SHARDED_META
    if not meta.is_file() and not meta.is_symlink():
        if not (path / SHARDED_INDEX).is_file() and not any(path.glob("*.distcp")):
            raise _not_a_file(path)  # no part of a sharded one: a run's checkpoints/ folder
        raise CheckpointError(
            f"checkpoint {str(path)!r} is a sharded checkpoint folder without its "
            f"{SHARDED_META}, the file written beside the shards with the loop counters, the "
            f"optimizer count and the shards' checksums: its save was cut short or the folder "
            f"was copied in part, so the run can't resume from it. {_NEXT_CHECKPOINT}")
    return safe_load(meta) if read else {}


def _is_plain_pickle(path: Path) -> bool:
    """Whether ``path`` is one whole pickle stream (read opcode by opcode, nothing run), rather
    than a torch.save archive or bytes that are no pickle at all."""
    if zipfile.is_zipfile(path):
        return False
    try:
        with open(path, "rb") as f:
            for _ in pickletools.genops(f):
                pass
    except Exception:
        return False
    return True


def _inspect_command(path: Path) -> str:
    """A shell command that lists what the pickle in ``path`` would import and call, without
    running any of it (``pickletools`` disassembles; it does not execute)."""
    if zipfile.is_zipfile(path):
        return (f"python -c \"import pickletools, sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); "
                f"pickletools.dis(z.read(next(n for n in z.namelist() "
                f"if n.endswith('data.pkl'))))\" {path} | grep -B2 -E 'GLOBAL|REDUCE'")
    return f"python -m pickletools {path} | grep -B2 -E 'GLOBAL|REDUCE'"


def _corrupt(path: Path, exc: BaseException) -> CheckpointError:
    text = _ANSI.sub("", str(exc)).strip()
    # torch's weights-only errors bury the actual failure after a generic preamble
    _, marker, detail = text.partition("WeightsUnpickler error:")
    lines = [line.strip() for line in (detail if marker else text).splitlines() if line.strip()]
    first_line = lines[0] if lines else type(exc).__name__
    return CheckpointError(
        f"checkpoint {str(path)!r} is truncated or corrupt and can't be read ({first_line}). "
        f"Use another checkpoint, e.g. an earlier one from the same run folder."
    )


def capture_rng_states() -> dict[str, Any]:
    """Every generator a training step may draw from, as weights-only-safe values."""
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    import numpy as np

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy" in states:
        import numpy as np

        kind, keys, pos, has_gauss, cached = states["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


@contextlib.contextmanager
def preserved_rng_states() -> Iterator[None]:
    """Run the block, then put every generator back as it was before it (also on an error)."""
    states = capture_rng_states()
    try:
        yield
    finally:
        restore_rng_states(states)
