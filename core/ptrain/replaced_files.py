"""Freeing the disk blocks of a replaced checkpoint off the thread that saves.

A save ends by replacing the previous checkpoint: a rename over a file, or a folder swapped
into place and the old one removed. Either way the file system frees the old files' blocks
there and then, which takes it a while: on this project's 2-core machine (ext4) 0.11 s for a
file of 800 MB and 0.35 s for a folder of 2.4 GB, every save, in the step of a synchronous
one. A file that is still open when its name goes is not freed until its last descriptor is
closed, so :func:`hold` opens the files about to be replaced, the save replaces or removes
them as before (now quickly), and :func:`release` closes the descriptors on a thread of its
own, where the freeing happens (:func:`remove` does the three for a checkpoint no longer
kept). No name is left behind: a process that dies holding them has its descriptors closed,
and the blocks freed, by the system.

Only on local disks' filesystems (:data:`ptrain.direct_file.LOCAL_DISK_FILESYSTEMS`): a
network filesystem may keep a removed open file under a name of its own (NFS's ``.nfs*``),
and Windows can't replace an open file.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from ptrain.direct_file import on_local_disk

#: files smaller than this are freed quickly enough where they are
LARGE = 1 << 20
#: at most this many descriptors held per replaced checkpoint (a process's limit is often 1024)
MOST_HELD = 256

_releasing: list[threading.Thread] = []
_lock = threading.Lock()
#: the descriptors held now: a process forked meanwhile (a DataLoader worker) closes its copies
#: at once, or the files would stay allocated for as long as it lives
_held: set[int] = set()


def _close_in_child() -> None:
    for fd in list(_held):  # no lock: another thread may have held it at the fork
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


def hold(path: str | Path) -> list[int]:
    """Descriptors open on the large files at ``path`` (a file, or a folder's files), for
    :func:`release` once the save has replaced or removed them; none where ``path`` is
    missing or not on a local disk."""
    path = Path(path)
    if path.is_symlink():  # what it links to stays
        return []
    try:
        files = ([path] if path.is_file() else
                 [Path(root, name) for root, _, names in os.walk(path) for name in names])
    except OSError:
        return []
    held: list[int] = []
    for file in files:
        if len(held) == MOST_HELD:
            break
        try:
            fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO: no wait
        except OSError:
            continue
        if os.fstat(fd).st_size >= LARGE and on_local_disk(fd):
            held.append(fd)
            _held.add(fd)
        else:
            os.close(fd)
    return held


def remove(path: str | Path) -> None:
    """Remove the file, link or folder at ``path`` (a checkpoint no longer kept), its large
    files' blocks freed on a thread of their own; nothing where nothing is."""
    path = Path(path)
    held = hold(path)
    try:
        if path.is_dir() and not path.is_symlink():  # a sharded checkpoint is a folder
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    finally:
        release(held)


def release(held: list[int]) -> None:
    """Close ``held`` (from :func:`hold`) on a thread of its own: the last close of a replaced
    file frees its blocks there. :func:`wait` waits for every release begun."""
    if not held:
        return

    def close_all() -> None:
        for fd in held:
            _held.discard(fd)
            os.close(fd)

    thread = threading.Thread(target=close_all, name="ptrain-checkpoint-free", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # no thread to be had: freed here, as without this module
        close_all()
        return
    with _lock:
        _releasing[:] = [t for t in _releasing if t.is_alive()]
        _releasing.append(thread)


def wait() -> None:
    """Wait until every file :func:`release` was given is freed (before a save needs the space
    back, and when a stage ends)."""
    with _lock:
        threads, _releasing[:] = list(_releasing), []
    for thread in threads:
        thread.join()
