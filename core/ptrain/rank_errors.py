"""How a failing rank's error reaches the process that reports it for the whole job.

The rank writes a record into the job's error folder (:func:`write_record`: the exception,
pickled when it can travel, its traceback, whose code raised it, the rank and the time); the
reporting process reads them (:func:`read_records`) and raises the error of the first
(:func:`error_of`). Both launchers of :mod:`ptrain.distributed` use it: the spawn launcher's
workers and the script launcher's started ranks.
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
from pathlib import Path
from typing import Any

from ptrain.errors import PtrainError, WorkerError


def write_record(folder: str | Path, exc: BaseException, rank: int) -> None:
    """Leave ``exc`` of ``rank`` in ``folder`` (written whole, then renamed into place)."""
    try:
        payload = pickle.dumps(exc)
    except Exception:  # an exception that can't travel is reported by its traceback
        payload = None
    record = {"rank": rank, "time": time.time(), "exception": payload,
              "traceback": "".join(traceback.format_exception(exc)).rstrip(),
              "origin": _origin(exc)}
    path = Path(folder) / f"rank{rank}.pkl"
    with open(path.with_suffix(".tmp"), "wb") as f:
        pickle.dump(record, f)
    os.replace(path.with_suffix(".tmp"), path)


def _origin(exc: BaseException) -> str | None:
    """Whose code raised ``exc`` (the user's, a plugin's hook), as a sentence; read here, while
    the traceback holds the rank's frames, since the reporting process gets only its text."""
    try:
        from ptrain.frames import PLUGIN_BLAME, error_origin

        origin = error_origin(exc)
    except Exception:  # naming the culprit must never keep the error from being reported
        return None
    if origin is None:
        return None
    said, by_plugin = origin
    return f"{said[0].upper()}{said[1:]}.{PLUGIN_BLAME if by_plugin else ''}"


def read_records(folder: str | Path) -> list[dict[str, Any]]:
    """The records in ``folder``, oldest first."""
    records = []
    for path in Path(folder).glob("rank*.pkl"):
        with open(path, "rb") as f:
            records.append(pickle.load(f))
    return sorted(records, key=lambda r: r["time"])


def error_of(record: dict[str, Any]) -> BaseException:
    """The error to raise for ``record``: a :class:`PtrainError` as itself (a usage error reads
    the same from any rank), and a :class:`WorkerError` too (it already says which rank and
    why: the rank watch's), anything else as a :class:`WorkerError` naming the rank and holding
    its traceback."""
    exc = pickle.loads(record["exception"]) if record["exception"] is not None else None
    if isinstance(exc, (PtrainError, WorkerError)):
        return exc
    origin = record.get("origin")
    said = f" {origin}" if origin else ""
    return WorkerError(f"rank {record['rank']} failed; the other ranks were stopped.{said} Its "
                       f"error:\n{record['traceback']}")


def silent_failure(rank: int, exitcode: int, signal_name: str,
                   doing: str | None = None) -> WorkerError:
    """The error for a rank that ended without a record: killed, or exited on its own;
    ``doing`` is what it last said it was doing (the rank watch's heartbeat), when known."""
    if exitcode < 0:
        how = f"was killed by {signal_name} (out of memory? killed from outside?)"
    else:  # sys.exit, os._exit or a crash in native code: the rank's own output may say which
        how = (f"exited with code {exitcode} without reporting an error (its own output may "
               f"say why)")
    last = f" It was last {doing}." if doing else ""
    return WorkerError(f"rank {rank} {how}; the other ranks were stopped.{last}")


__all__ = ["error_of", "read_records", "silent_failure", "write_record"]
