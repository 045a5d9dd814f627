"""Run folders that cannot collide: reserved atomically, written by one ``fit`` at a time.

- :func:`reserve` makes the next free ``version_N`` under a root by creating it (``mkdir`` is
  atomic: of two runs started at once, each gets its own number), so the root is known to be
  writable before anything trains; a root that can't be written is a usage error naming it.
- :class:`RunLock` is held by the process that writes a run's checkpoints while ``fit`` runs:
  ``flock`` on ``<run>/.ptrain.lock``, which the system releases when the process ends however
  it ends, so a dead run never keeps its folder. A second ``fit`` of the same run (two
  ``--ckpt-path last`` resumes at once) is refused, naming the process that holds it.

Only the process that decides for the job calls these (rank 0 or the launching process; see
:func:`decides_for_job`); the other ranks take rank 0's folder when the process group is up.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import IO

from ptrain.errors import ConfigError

_VERSION = re.compile(r"^version_(\d+)$")
LOCK = ".ptrain.lock"
_made_roots: set[Path] = set()  # roots this process created (release_unused may remove them)
#: what a run started from another run's checkpoint records about it
RESUMED_FROM = "resumed_from.json"


def versions(root: Path) -> list[tuple[int, Path]]:
    """The ``(N, path)`` of every ``version_N`` folder under ``root``."""
    if not root.is_dir():
        return []
    return [(int(m.group(1)), p) for p in root.iterdir() if (m := _VERSION.match(p.name))]


def is_run_folder(path: Path) -> bool:
    """Whether ``path`` is named as a run folder (``version_N``)."""
    return _VERSION.match(path.name) is not None


def next_free(root: Path) -> Path:
    """The ``version_N`` after the highest under ``root`` (not created)."""
    return root / f"version_{max((n for n, _ in versions(root)), default=-1) + 1}"


def decides_for_job() -> bool:
    """Whether this process chooses the run folder: a rank other than 0 that a launcher started
    (``RANK`` set) takes rank 0's choice instead."""
    return os.environ.get("RANK", "0") == "0"


def reserve(root: Path) -> Path:
    """Create and return the next free ``version_N`` under ``root`` (made if missing; see
    :func:`release_unused`)."""
    try:
        if not root.exists():
            root.mkdir(parents=True)
            _made_roots.add(root)
    except FileExistsError:  # another run made it a moment ago
        pass
    except OSError as exc:
        raise _unwritable(root, exc) from None
    candidate = next_free(root)
    number = int(candidate.name.split("_")[1])
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:  # another run took it a moment ago
            number += 1
            candidate = root / f"version_{number}"
        except OSError as exc:
            raise _unwritable(root, exc) from None


def _unwritable(folder: Path, exc: OSError) -> ConfigError:
    reason = f"{exc.strerror or exc} ({errno.errorcode.get(exc.errno or 0, '?')})"
    return ConfigError(f"the run folder can't be created under {str(folder)!r}: {reason}. "
                       f"Nothing was trained. Choose a folder you can write to with "
                       f"--default-root-dir (default_root_dir=...).")


class RunLock:
    """The exclusive right to write a run folder's checkpoints (see the module docstring)."""

    def __init__(self, file: IO[str], path: Path):
        self._file, self.path = file, path

    @classmethod
    def acquire(cls, run: Path) -> RunLock:
        path = run / LOCK
        try:
            file = open(path, "a+", encoding="utf-8")
        except OSError as exc:
            raise _unwritable(run, exc) from None
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            file.seek(0)
            holder = _describe_holder(file.read())
            file.close()
            raise ConfigError(
                f"the run folder {str(run)!r} is being written by another ptrain process "
                f"({holder}); two runs writing one folder would overwrite each other's "
                f"checkpoints. Wait for it to end, or start a new run (without --ckpt-path, or "
                f"with another --default-root-dir).") from None
        file.seek(0)
        file.truncate()
        json.dump({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                   "command": " ".join(sys.argv)[:500]}, file)
        file.flush()
        return cls(file, path)

    def release(self) -> None:
        """Give the folder up (also done by the system when the process ends)."""
        if self._file.closed:
            return
        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()


def _describe_holder(text: str) -> str:
    try:
        holder = json.loads(text)
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"]))
        return (f"pid {holder['pid']} on {holder['host']}, started {started}: "
                f"{holder['command']}")
    except (ValueError, KeyError, TypeError):
        return "its process did not say who it is"


def release_unused(run: Path) -> None:
    """Remove ``run`` when nothing was written in it (a stage that failed at its start), and
    its root when :func:`reserve` made it and it is empty now: a usage error leaves no trace."""
    if not is_empty_run(run):
        return
    shutil.rmtree(run, ignore_errors=True)
    if run.parent in _made_roots:
        _made_roots.discard(run.parent)
        try:
            run.parent.rmdir()  # only if empty
        except OSError:
            pass


def is_empty_run(run: Path) -> bool:
    """Whether nothing was written in ``run`` but what ptrain wrote on reserving it (its lock,
    its origin): a run that failed at its start."""
    try:
        return all(entry.name in (LOCK, RESUMED_FROM) for entry in run.iterdir())
    except OSError:
        return False


#: what a checkpoint write killed before it finished leaves in a run's ``checkpoints/``: a
#: file's temporary file (``.last.ckpt.k2x8q1zv.tmp``), a sharded folder's temporary folder
#: (``.last.ckpt.tmp``), the top-k record's temporary file
_UNFINISHED = re.compile(r"^\..+\.ckpt(\.[a-z0-9_]{8})?\.tmp$"
                         r"|^\.best_k_models\.json\.[a-z0-9_]{8}\.tmp$")


def remove_unfinished_writes(run: Path) -> list[str]:
    """Remove what checkpoint writes that were killed left in ``run``'s ``checkpoints/`` (a
    partial file may be as large as a checkpoint, and its random name never comes again: each
    kill during a write would leave one for good); the names removed. For the process holding
    the run's :class:`RunLock`: no other process writes the run's checkpoints then. A sharded
    folder moved aside (``.NAME.old``) is kept: the next load or save puts it back."""
    folder = run / "checkpoints"
    removed = []
    try:
        entries = list(folder.iterdir())
    except OSError:  # no checkpoints yet
        return removed
    for entry in entries:
        if not _UNFINISHED.match(entry.name):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError:
            continue  # it stays, as it did before
        removed.append(entry.name)
    return removed


def record_origin(run: Path, checkpoint: Path) -> None:
    """Write, in a run started from another run's checkpoint, where it came from."""
    (run / RESUMED_FROM).write_text(json.dumps({"checkpoint": str(checkpoint.resolve())},
                                               indent=1) + "\n", encoding="utf-8")


__all__ = ["LOCK", "RESUMED_FROM", "RunLock", "decides_for_job", "is_empty_run", "is_run_folder",
           "next_free", "record_origin", "release_unused", "remove_unfinished_writes", "reserve",
           "versions"]
