"""Descriptors a process keeps to itself: a process forked from it closes its copies at once.

A forked child (a DataLoader worker) inherits every open descriptor, and a file is freed only
once its last descriptor is closed. A checkpoint file open for writing when a worker forks, or
a replaced checkpoint held open while its blocks are freed (:mod:`ptrain.replaced_files`), would
stay allocated for as long as the worker lives (a persistent worker: the whole stage), after a
later save replaced it. So such descriptors are opened with :func:`opened` and closed with
:func:`close`, and a fork closes them in the child. A lock is held across each open-and-record
and each close-and-forget, and across a fork, so that the child's record is exactly what it
inherited: a fork waits for at most one open or close.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, TypeVar

Opened = TypeVar("Opened")

_lock = threading.Lock()
#: the descriptors opened through opened() and not yet closed
_open: set[int] = set()


def _close_in_child() -> None:
    for fd in _open:
        try:
            os.close(fd)
        except OSError:
            pass
    _open.clear()
    _lock.release()  # taken by the parent's thread that forked, before the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_lock.acquire, after_in_parent=_lock.release,
                        after_in_child=_close_in_child)


def opened(open_: Callable[[], Opened], fd_of: Callable[[Opened], int] = lambda fd: fd
           ) -> Opened:
    """``open_()``'s result (``os.open``'s descriptor, or what ``fd_of`` finds it in:
    ``tempfile.mkstemp``'s pair), its descriptor closed in any process forked before
    :func:`close` closes it here. What ``open_`` raises is raised."""
    with _lock:
        result = open_()
        _open.add(fd_of(result))
    return result


def close(fd: int) -> None:
    """Close ``fd`` (one from :func:`opened`, or any other)."""
    with _lock:
        _open.discard(fd)
        os.close(fd)
