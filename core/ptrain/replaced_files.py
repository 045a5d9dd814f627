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

Only on local disks' filesystems on Linux (:func:`ptrain.direct_file.on_local_disk`): a
network filesystem may keep a removed open file under a name of its own (NFS's ``.nfs*``),
and Windows can't replace an open file. A process forked while files are held (a DataLoader
worker) closes its copies of the descriptors at once (:mod:`ptrain.private_descriptors`), or
the files would stay allocated for as long as it lives; a fork waits for a descriptor being
opened or closed meanwhile (at most one file's freeing, a fraction of a second, and only when
the two meet).
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
from pathlib import Path

from ptrain import private_descriptors
from ptrain.direct_file import on_local_disk

#: files smaller than this are freed quickly enough where they are
LARGE = 1 << 20
#: at most this many descriptors held per replaced checkpoint (a process's limit is often 1024)
MOST_HELD = 256
#: how a held file is opened: a link is not followed (what it points to stays), nothing waits
#: (a FIFO put there after the look), no terminal becomes the process's
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_NOCTTY", 0))

#: guards _releasing; held across a fork, so that a child's copy is not locked for good
_lock = threading.Lock()
_releasing: list[threading.Thread] = []


def _forget_in_child() -> None:
    _releasing.clear()  # the parent's threads: none of them runs here
    _lock.release()  # taken by the parent's thread that forked, before the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_lock.acquire, after_in_parent=_lock.release,
                        after_in_child=_forget_in_child)


def _large_files(path: Path) -> list[Path]:
    """The regular files of at least :data:`LARGE` bytes at ``path`` (the file, or a
    folder's files, links not followed) on the same filesystem, where that is a local disk's;
    none otherwise."""
    try:
        fd = private_descriptors.opened(lambda: os.open(path, _OPEN_FLAGS))
    except OSError:  # missing, a link, not to be opened
        return []
    try:
        if not on_local_disk(fd):
            return []
        top = os.fstat(fd)
    finally:
        private_descriptors.close(fd)
    if stat.S_ISREG(top.st_mode):
        return [path] if top.st_size >= LARGE else []
    if not stat.S_ISDIR(top.st_mode):
        return []
    found = []
    for root, _, names in os.walk(path, onerror=lambda _: None):
        for name in names:
            file = Path(root, name)
            try:
                info = os.lstat(file)
            except OSError:
                continue
            if (stat.S_ISREG(info.st_mode) and info.st_size >= LARGE
                    and info.st_dev == top.st_dev):
                found.append(file)
    return found


def hold(path: str | Path) -> list[int]:
    """Descriptors open on the large files at ``path`` (a file, or a folder's files), for
    :func:`release` once the save has replaced or removed them; none where ``path`` is
    missing, a link, or not on a local disk."""
    held: list[int] = []
    for file in _large_files(Path(path))[:MOST_HELD]:
        try:
            held.append(private_descriptors.opened(lambda: os.open(file, _OPEN_FLAGS)))
        except OSError:
            continue
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
            private_descriptors.close(fd)

    thread = threading.Thread(target=close_all, name="ptrain-checkpoint-free", daemon=True)
    with _lock:  # the thread starts closing once this is left
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: freed here, as without this module
            thread = None
        else:
            _releasing.append(thread)
    if thread is None:
        close_all()


def wait() -> None:
    """Wait until every file :func:`release` was given is freed (before a save needs the space
    back, and when a stage ends)."""
    with _lock:
        threads = list(_releasing)
    for thread in threads:
        thread.join()
    with _lock:
        _releasing[:] = [t for t in _releasing if t.is_alive()]
