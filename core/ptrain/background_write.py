"""Checkpoint files written on a background thread while training goes on.

An asynchronous save (``Trainer.save_checkpoint(..., asynchronous=True)``) copies the checkpoint
to host memory on the training thread (the stall: the next step changes the tensors) and hands
the copy to a :class:`BackgroundWrite`, whose one thread writes it with the same atomic write as a
synchronous save. The files of one checkpoint point (a top-k file and ``last.ckpt`` at one step)
are one write, written in order from copies that share their tensors; at most one write is in
flight per process: a save at a later step first waits for it (:meth:`Trainer.finish_checkpoint_write`).

What depends on a file being complete (deleting the file it replaces, the top-k record, a link to
it) is registered with :meth:`BackgroundWrite.then` and runs on the training thread once the
write has finished, with the write's error (``None`` when every file was written). A file that
failed stops the files after it in the same write.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable

import torch

#: a function run on the training thread when the write is finished: given its error or None
Continuation = Callable[[BaseException | None], None]


def host_copy(obj: Any, memo: dict[tuple, tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """``obj`` (a checkpoint: dicts, lists and tuples of tensors and plain values) with every
    tensor copied to host memory, detached, and every container new, so that training may change
    the originals. A tensor whose memory ``memo`` has seen (the same storage, offset, shape,
    strides and dtype: the weights of two state dicts of one step) is not copied twice; the memo
    keeps each original alive, so no other tensor can take its address. A state dict's
    ``_metadata`` (module versions, which ``load_state_dict`` reads) is kept."""
    if isinstance(obj, torch.Tensor):
        key = (obj.device, obj.untyped_storage().data_ptr(), obj.storage_offset(),
               tuple(obj.shape), obj.stride(), obj.dtype)
        if key not in memo:
            memo[key] = (obj, obj.detach().to("cpu", copy=True))
        return memo[key][1]
    if isinstance(obj, dict):
        copy = type(obj)() if isinstance(obj, OrderedDict) else {}
        copy.update((k, host_copy(v, memo)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            copy._metadata = obj._metadata
        return copy
    if type(obj) in (list, tuple):
        return type(obj)(host_copy(v, memo) for v in obj)
    return obj


class BackgroundWrite:
    """The files of one checkpoint point, written in order on one background thread."""

    def __init__(self, step: int) -> None:
        self.step = step  # the global step the files hold
        self.memo: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # see host_copy
        self._queue: list[Callable[[], None]] = []
        self._unwritten = 0  # queued or being written
        self._closed = False
        self._error: BaseException | None = None
        self._continuations: list[Continuation] = []
        self._lock = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="ptrain-checkpoint-write",
                                        daemon=True)
        self._thread.start()

    def add(self, write_file: Callable[[], None]) -> None:
        """Queue one file's write (a function of no arguments that writes it atomically)."""
        with self._lock:
            self._queue.append(write_file)
            self._unwritten += 1
            self._lock.notify()

    def then(self, continuation: Continuation) -> None:
        """Run ``continuation`` on the training thread once the write is finished."""
        self._continuations.append(continuation)

    def discard_continuations(self) -> None:
        """Drop what waited on the write (a failed stage runs none of it)."""
        self._continuations.clear()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait()
                if not self._queue:
                    return
                write_file = self._queue.pop(0)
            try:
                if self._error is None:  # a failed file stops the ones after it
                    write_file()
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                self._error = exc
            finally:
                with self._lock:
                    self._unwritten -= 1

    def done(self) -> bool:
        """Whether every queued file has been written or has failed (never blocks)."""
        with self._lock:
            return self._unwritten == 0

    def finish(self) -> BaseException | None:
        """Wait for the queued files, then run the continuations in order (on this thread)
        with the write's error; return that error."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join()
        continuations, self._continuations = self._continuations, []
        for continuation in continuations:
            continuation(self._error)
        return self._error
