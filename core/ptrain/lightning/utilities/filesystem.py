"""``is_shared_filesystem``: whether every process of a run sees the same files under a path."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

_CHECK_FILE = ".ptrain_shared_fs_check"


def is_shared_filesystem(strategy: Any = None, path: str | Path | None = None,
                         timeout: int = 3) -> bool:
    """Whether the folder at ``path`` (default: the working directory) is the same folder for
    every process of the run: ``True`` for a remote URL (``s3://...``) and for a single
    process; under several processes (``torch.distributed`` initialised, as in any hook of a
    multi-process strategy) rank 0 writes a file there and the others look for it for up to
    ``timeout`` seconds. A collective: every process must call it. ``strategy`` is Lightning's
    ``trainer.strategy``; anything else (the trainer, ``None``) will do, since the process group
    is read from ``torch.distributed``. A path that does not exist on every process is a
    ``FileNotFoundError``."""
    if path is not None and "://" in str(path) and not str(path).startswith("file://"):
        return True
    path = Path(Path.cwd() if path is None else str(path).removeprefix("file://")).resolve()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return True
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (str(path), path.exists()))
    if any(other != str(path) for other, _ in everyone):
        return False  # not even the same path name
    if not all(exists for _, exists in everyone):
        raise FileNotFoundError(f"is_shared_filesystem: {path} does not exist on every process, "
                                f"so whether it is shared can't be told; create it first.")
    folder = path.parent if path.is_file() else path
    check = folder / _CHECK_FILE
    check.unlink(missing_ok=True)
    dist.barrier()
    if dist.get_rank() == 0:
        check.touch()
        found = True
    else:
        deadline = time.monotonic() + timeout
        found = check.exists()
        while not found and time.monotonic() < deadline:
            time.sleep(0.01)
            found = check.exists()
    dist.barrier()
    if dist.get_rank() == 0:
        check.unlink(missing_ok=True)
    answers = [None] * dist.get_world_size()
    dist.all_gather_object(answers, found)
    return all(answers)
