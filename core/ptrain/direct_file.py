"""A file to write a checkpoint into, front to back, past the page cache.

A buffered write copies every byte into the kernel's page cache, and the ``fsync`` that makes a
checkpoint durable then has the kernel write the cache back: both cost CPU time the training
steps share. On a virtual machine's disk (this project's 2-core test machine) 800 MB cost 1.8 s
of CPU that way, and 0.06 s written with ``O_DIRECT``, which hands the disk the program's own
memory (``dd``: 2.2 s against 0.3 s). :class:`DirectFile` writes the bulk of a file that way
from aligned buffers of its own, and falls back to ordinary writes where the system can't.
A direct write returns only once the disk has the chunk, so the chunks after the first go to
the disk on a thread of the file's own while the caller fills the next ones: ``torch.save``'s
CRC-32 of a tensor and the copy into a buffer overlap the disk's writing instead of taking
turns with it (806 MB by ``torch.save``: 0.83-0.93 s written in turns, 0.53-0.59 s so, on
a 2-core Intel Xeon virtual machine).
"""

from __future__ import annotations

import errno
import mmap
import os
import queue
import sys
import threading
import weakref
import zlib
from typing import Any

from ptrain import private_descriptors

#: bytes per direct write: a multiple of every logical block size in use (512 B to 64 KiB)
CHUNK = 8 << 20
#: chunks a file may have on their way to the disk at once (:class:`_DiskWriter`; 64 MiB of
#: buffers, each touched only once used): enough to keep the disk busy while ``torch.save``
#: sums a 64 MB tensor. 806 MB saved in 0.79-0.95 s with 1, 0.59-0.73 s with 4, 0.53-0.59 s
#: with 8 and 0.60-0.62 s with 16, on a 2-core Intel Xeon virtual machine
QUEUED = 8
#: The open flag, where the system has one (Linux); ``0`` elsewhere (macOS, Windows).
O_DIRECT = getattr(os, "O_DIRECT", 0)
#: Filesystems on local disks, by the magic number Linux's ``statfs`` gives: ext2/3/4, xfs,
#: btrfs, f2fs. Elsewhere (NFS, Lustre, FUSE, overlay, tmpfs) a direct write may go to the
#: server on its own or gain nothing, so files there are written normally.
LOCAL_DISK_FILESYSTEMS = {0xEF53: "ext4", 0x58465342: "xfs", 0x9123683E: "btrfs",
                          0xF2F52010: "f2fs"}


class DirectFile:
    """A binary file for ``torch.save`` and torch.distributed.checkpoint to write a file once,
    front to back, through the descriptor ``fd`` (opened for writing, at offset 0, with
    :func:`ptrain.private_descriptors.opened`, so that a process forked meanwhile does not keep
    the file; the file takes it over and closes it).

    Contract:

    - the bytes are on the disk (``fsync``) when :meth:`close` returns, and not before: a file
      that was not closed is incomplete, so write it under a temporary name and rename it into
      place after :meth:`close`, as :func:`ptrain.checkpoint_io.atomic_save` does;
    - where ``fd``'s file is on a local disk's filesystem (:data:`LOCAL_DISK_FILESYSTEMS`)
      and the system allows ``O_DIRECT`` on it, whole chunks go from aligned buffers of this
      file's straight to the disk (the first on the caller's thread, the later ones, up to
      :data:`QUEUED` at once, on a thread of the file's own) and the last partial chunk is
      written normally; elsewhere (network filesystems, tmpfs, macOS, Windows), or where the
      first direct write is refused as misaligned, every byte is written normally. The file's
      bytes are the same either way;
    - with ``checksum`` true, :attr:`crc32` is the CRC-32 of every byte written so far, so the
      file need not be read back to be summed (it costs about 0.25 s of CPU per GB);
    - a write the system refuses (no space, quota, file-size limit) raises its ``OSError``
      from :meth:`write` (that of a chunk written earlier on the file's thread, at the latest
      from the write after) or :meth:`close`; :meth:`abandon`, or leaving a ``with`` block by
      an error, writes nothing more.
    """

    def __init__(self, fd: int, checksum: bool = False):
        self._fd, self._checksum = fd, checksum
        self._position = 0
        self.crc32 = 0
        self._closed = False
        self._buffer: mmap.mmap | None = None
        self._filled = 0
        self._chunks_written = 0
        self._interrupted = False  # a chunk was handed on and no buffer came back for the next
        #: the thread the chunks after the first go to the disk on: made at the second one
        self._disk: list[_DiskWriter | None] = [None]  # a list: the finalizer's too
        # a file dropped unclosed (a caller's bug) does not keep its descriptor or thread
        self._finalizer = weakref.finalize(self, _drop, fd, self._disk)
        if O_DIRECT and on_local_disk(fd):
            try:
                buffer = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT needs
            except OSError:  # no memory to spare for it: written normally
                return
            if _set_direct(fd, True):
                self._buffer = buffer

    @property
    def direct(self) -> bool:
        """Whether the bulk of the file goes past the page cache."""
        return self._buffer is not None

    def write(self, data: Any) -> int:
        disk = self._disk[0]
        if disk is not None and disk.error is not None:
            raise disk.error
        view = memoryview(data).cast("B")
        size = len(view)
        if self._checksum:
            self.crc32 = zlib.crc32(view, self.crc32)
        self._position += size
        while view and self._buffer is not None:
            taken = min(len(view), CHUNK - self._filled)
            self._buffer[self._filled:self._filled + taken] = view[:taken]
            self._filled += taken
            view = view[taken:]
            if self._filled == CHUNK:
                self._write_chunk()
        _write_all(self._fd, view)  # all of it where nothing goes directly
        return size

    def _write_chunk(self) -> None:
        """Write the buffer's :data:`CHUNK` bytes directly: the first chunk here (where a
        refusal as misaligned turns every later write normal), the later ones on the file's
        thread, while the next buffer fills."""
        if self._chunks_written == 0:
            self._write_buffer(direct=True)
        else:
            if self._disk[0] is None:
                self._disk[0] = _DiskWriter.start(self._fd)
            disk = self._disk[0]
            if disk is None:  # no thread to be had: written here
                self._write_buffer(direct=True)
            else:
                assert self._buffer is not None
                buffer, self._buffer = self._buffer, None  # the disk's now: never written twice
                disk.give(buffer)
                self._interrupted = True  # until take() returns (a KeyboardInterrupt in it)
                self._buffer = disk.take()
                self._interrupted = False
        self._chunks_written += 1
        if self._buffer is not None:
            self._filled = 0

    def _write_buffer(self, direct: bool) -> None:
        """Write what the buffer holds: directly, or (``direct`` false, or a direct write
        refused as misaligned) normally, after which the buffer is gone and every later byte
        is written normally too."""
        assert self._buffer is not None
        written = 0
        with memoryview(self._buffer) as chunk:
            try:
                while direct and written < self._filled:
                    written += os.write(self._fd, chunk[written:self._filled])
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # EINVAL: misaligned for this disk's blocks
                    raise
                direct = False
            if not direct:
                _set_direct(self._fd, False)
                _write_all(self._fd, chunk[written:self._filled])
        if not direct:
            self._free_buffer()

    def _free_buffer(self) -> None:
        # dropped, not closed: a refused write's traceback may still hold views of it
        self._buffer, self._filled = None, 0

    def tell(self) -> int:
        return self._position

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        """Nothing to do: the bytes reach the disk at :meth:`close` (see the contract)."""

    def fileno(self) -> int:
        return self._fd

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Write the rest, ``fsync``, close the descriptor. A second call does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._interrupted:
                raise RuntimeError("DirectFile: a write was interrupted while its chunk went to "
                                   "the disk; the file is incomplete")
            disk = self._disk[0]
            if disk is not None:  # every chunk given to the disk's thread, on the disk
                disk.finish()  # where this is interrupted, the finalizer stops the thread
                self._disk[0] = None
                if disk.error is not None:
                    raise disk.error
            if self._buffer is not None:  # the last partial chunk
                self._write_buffer(direct=False)
            os.fsync(self._fd)
        finally:
            self._free_buffer()
            self._finalizer()  # stops the thread (where an error left it) and closes the fd

    def abandon(self) -> None:
        """Close the descriptor without writing the rest: the file is incomplete."""
        if not self._closed:
            self._closed = True
            self._free_buffer()
            self._finalizer()  # chunks still queued for the disk are not written

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, exc_type: Any, *exc_info: Any) -> None:
        if exc_type is None:
            self.close()
        else:  # the write failed: the file is thrown away, so nothing more is written
            self.abandon()


class _DiskWriter:
    """Full chunks of a :class:`DirectFile` written directly, in the order given, on a thread
    of their own: the caller fills the next buffer meanwhile. At most :data:`QUEUED` buffers
    exist; :meth:`take` waits for one the disk is done with. The first error stops the
    writing (the chunks after it are dropped) and stays in :attr:`error`."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._todo: queue.SimpleQueue[mmap.mmap | None] = queue.SimpleQueue()
        self._free: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()
        self._made = 1  # the file's first buffer, given back here once written
        self._stop = False  # abandoned: what is still queued is dropped
        self._close_on_exit: int | None = None  # see stop()
        # set as the thread ends: Thread.join() interrupted (a KeyboardInterrupt) can leave
        # is_alive() false while the thread still writes, an Event's wait() can't
        self._ended = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ptrain-direct-write",
                                        daemon=True)

    @classmethod
    def start(cls, fd: int) -> _DiskWriter | None:
        """A writer for ``fd`` with its thread running; ``None`` where no thread can start."""
        writer = cls(fd)
        try:
            writer._thread.start()
        except RuntimeError:
            return None
        return writer

    def give(self, buffer: mmap.mmap) -> None:
        """Write the :data:`CHUNK` bytes of ``buffer`` after those given before."""
        self._todo.put(buffer)

    def take(self) -> mmap.mmap:
        """A buffer to fill: one the disk is done with, or a new one while fewer than
        :data:`QUEUED` exist (or no memory is left for one)."""
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        if self._made < QUEUED:
            try:
                buffer = mmap.mmap(-1, CHUNK)
            except OSError:  # no memory for it: wait for one in use
                pass
            else:
                self._made += 1
                return buffer
        return self._free.get()

    def _run(self) -> None:
        try:
            while (buffer := self._todo.get()) is not None:
                if self.error is None and not self._stop:
                    try:
                        with memoryview(buffer) as chunk:
                            written = 0
                            while written < CHUNK:
                                written += os.write(self._fd, chunk[written:CHUNK])
                    except BaseException as exc:  # noqa: BLE001 - raised by the file's caller
                        # without this frame (which holds the writer and its buffers)
                        self.error = exc.with_traceback(None)
                self._free.put(buffer)
        finally:
            while not self._free.empty():  # the buffers go now, whoever still holds the writer
                self._free.get_nowait()
            if self._close_on_exit is not None:
                private_descriptors.close(self._close_on_exit)
            self._ended.set()

    def finish(self) -> None:
        """Wait until every chunk given is written and the thread has ended. A second call
        does nothing."""
        if not self._ended.is_set():
            self._todo.put(None)  # one more after an interrupted call: never read
            self._ended.wait()

    def stop(self, fd: int) -> bool:
        """Drop what is still queued, end the thread and close ``fd`` once it has: here
        (``True``), or, called on the thread itself (a garbage collection there that finalizes
        its file), by the thread as it ends (``False``). The descriptor is never closed while
        a chunk may still be written through it (a wait here that is interrupted leaves it
        open)."""
        self._stop = True
        if threading.current_thread() is self._thread:
            self._close_on_exit = fd
            self._todo.put(None)
            return False
        self.finish()
        private_descriptors.close(fd)
        return True


def _drop(fd: int, disk: list[_DiskWriter | None]) -> None:
    """A :class:`DirectFile`'s end, whether closed or dropped: its thread stopped, nothing
    queued written, its descriptor closed."""
    writer = disk[0]
    if writer is None:
        private_descriptors.close(fd)
        return
    writer.stop(fd)
    disk[0] = None


def on_local_disk(fd: int) -> bool:
    """Whether ``fd``'s file is on one of :data:`LOCAL_DISK_FILESYSTEMS`; always ``False``
    off Linux, whose ``statfs`` numbers those are (macOS's ``struct statfs`` is another, and
    larger, layout; Windows has no ``fstatfs``)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    # struct statfs, whose first field is f_type: 120 bytes on 64-bit Linux, room to spare
    fields = (ctypes.c_long * 64)()
    try:
        if ctypes.CDLL(None, use_errno=True).fstatfs(fd, fields) != 0:
            return False
    except (OSError, AttributeError, TypeError):  # no C library to ask, or no fstatfs in it
        return False
    return (fields[0] & 0xFFFFFFFF) in LOCAL_DISK_FILESYSTEMS


def _set_direct(fd: int, on: bool) -> bool:
    """Turn ``O_DIRECT`` on or off for ``fd``; ``False`` where the system refuses it."""
    import fcntl  # not on Windows, where O_DIRECT is 0 and this is never called

    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | O_DIRECT if on else flags & ~O_DIRECT)
    except OSError:
        return False
    return True


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view):]
