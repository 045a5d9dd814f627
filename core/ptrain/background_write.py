"""Checkpoint files written on a background thread while training goes on.

An asynchronous save (``Trainer.save_checkpoint(..., asynchronous=True)``) copies the checkpoint
to host memory and hands the copy to a :class:`BackgroundWrite`, whose one thread writes it with
the same atomic write as a synchronous save. For a save made between two training steps, the
tensors that only an optimizer step changes (the parameters an optimizer holds, and its state)
are copied on that thread, first, once the saving hook is over
(:class:`DeferredCopies`, :meth:`BackgroundWrite.release_copies`), while the next batch computes
its gradients: the training thread waits
for those copies before that batch's optimizer step, or after its backward pass where it takes
none (:meth:`BackgroundWrite.wait_for_copies`), and a
copy whose tensor changed before it was made fails the save
(:class:`ptrain.ChangedBeforeCopiedError`). Everything else (buffers, frozen parameters, what a
plugin made) is copied on the training thread: that is the stall left. The files of one
checkpoint point (a top-k file and ``last.ckpt``, saved inside one
:meth:`Trainer.checkpoint_point`) are one write, written in order from copies that share their
tensors; at most one write is in flight per process: any other save, at the same step too,
first waits for it (:meth:`Trainer.finish_checkpoint_write`) and copies what it writes.

What depends on a file being complete (deleting the file it replaces, the top-k record, a link to
it) is registered with :meth:`BackgroundWrite.then` and runs on the training thread once the
write has finished, with the error of its save (``None`` when that save's files were written): as
a synchronous save would have it, a top-k file written before a refused ``last.ckpt`` stays
written. A file that failed stops the files after it in the same write, whose saves fail with
its error.

Under several processes the write is one write of the job: the ranks learn together that it has
ended (:meth:`WriteAgreement.all_ended`, at each step boundary) and run what waited on it with the
same errors (:meth:`WriteAgreement.agreed_outcome`), so that every rank makes the same decisions
(stop, or undo a refused save) at the same step. A file that the ranks' writer threads write
together (a sharded folder) is a :class:`CollectiveWrite`: it runs on a rank whose save failed
already too, to fail there with the others rather than leave them in a collective.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections import OrderedDict
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ptrain.errors import ChangedBeforeCopiedError, CheckpointWriteError

#: a function run on the training thread when the write is finished: given its error or None
Continuation = Callable[[BaseException | None], None]


def host_copy(obj: Any, memo: dict[tuple, tuple[torch.Tensor, torch.Tensor]],
              buffers: HostBuffers, deferred: DeferredCopies | None = None, *,
              whole: torch.Tensor | None = None) -> Any:
    """``obj`` (a checkpoint: dicts, lists and tuples of tensors and plain values) with every
    tensor copied to host memory (into ``buffers``), detached, and every container new, so that
    training may change the originals. A tensor whose memory ``memo`` has seen (the same
    storage, offset, shape, strides and dtype: the weights of two state dicts of one step) is
    not copied twice; the memo keeps each original alive, so no other tensor can take its
    address. A state dict's ``_metadata`` (module versions, which ``load_state_dict`` reads) is
    kept. A tensor in the memory of one of ``deferred``'s tensors gets its buffer now and its
    copy later (:class:`DeferredCopies`). ``whole``: the tensor ``obj`` is part of (a DTensor
    whose shard it is), whose version counter moves when ``obj`` is changed through it."""
    whole = obj if whole is None else whole
    if _is_dtensor(obj):  # this rank's shard is copied; the layout stays the same
        return type(obj).from_local(host_copy(obj.to_local(), memo, buffers, deferred,
                                              whole=whole),
                                    obj.device_mesh, obj.placements, run_check=False,
                                    shape=obj.shape, stride=obj.stride())
    if isinstance(obj, torch.Tensor) and is_traceable_wrapper_subclass(obj):
        # a tensor made of tensors (torchao's float8 weights): those are copied, and the copy
        # is the same kind of tensor made of the copies
        key = copy_key(obj)
        if key not in memo:
            names, context = obj.__tensor_flatten__()
            inner = {name: host_copy(getattr(obj, name), memo, buffers, deferred, whole=whole)
                     for name in names}
            memo[key] = (obj, type(obj).__tensor_unflatten__(inner, context, obj.size(),
                                                             obj.stride()))
        return memo[key][1]
    if isinstance(obj, torch.Tensor):
        key = copy_key(obj)
        if key not in memo:
            later = deferred is not None and deferred.defers(obj)
            memo[key] = (obj, deferred.buffer_for(obj, buffers, whole) if later
                         else buffers.copy(obj))
        return memo[key][1]
    if isinstance(obj, dict):
        copy = type(obj)() if isinstance(obj, OrderedDict) else {}
        copy.update((k, host_copy(v, memo, buffers, deferred)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            copy._metadata = obj._metadata
        return copy
    if type(obj) in (list, tuple):
        return type(obj)(host_copy(v, memo, buffers, deferred) for v in obj)
    return obj


class DeferredCopies:
    """The copies of one asynchronous save that wait for the writer's thread: those of the
    tensors that only an optimizer step changes (given, by name, to the constructor: the
    parameters the optimizers hold and their state), made while the next step computes its
    gradients rather than on the training thread.

    :meth:`buffer_for` (training thread) hands out the buffer a copy will fill and records the
    tensor with its version counter, which every in-place change through it increments (a
    DTensor's own, for its shard). :meth:`make` (writer's thread) makes the copies and raises
    :class:`ptrain.ChangedBeforeCopiedError` if a counter moved before a copy was made, or
    while it was being made where the change ended first (a best effort: a change begun
    during the copy and still running after it goes unseen). Then
    :meth:`order_after` (training thread, before it changes the tensors) and :meth:`wait`
    (writer's thread, before the files) wait for them.

    On a CUDA device the copies are issued on a stream of their own, after the work the
    training thread had issued when they were released (:meth:`mark_ready`: the saving hook
    is over), and the training thread's stream waits for
    them on the device (no host sync): the device copies while it computes the next step's
    gradients. There the counters say whether a tensor changed before its copy was issued (not
    made). Tensors elsewhere (MPS, XLA, HPU) are copied on the training thread. A change made
    through ``.data`` moves no counter: the trainer defers the copies of a save made between
    two training steps only, and waits for them before anything but the next batch's forward
    and backward passes runs (its optimizer step; the end of that batch when it takes none,
    mid-way through an accumulation window; the end of the epoch)."""

    def __init__(self, tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        #: storage (device, address) -> the name of the tensor there, for the error
        self._names = {_storage(plain): name for name, tensor in tensors
                       for plain in _plain_tensors(tensor)
                       # an empty tensor has no memory (address 0) and nothing to copy
                       if plain.device.type in ("cpu", "cuda") and _storage(plain)[1]}
        #: (tensor, its buffer, the tensor whose version counter is watched, that counter)
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]] = []
        #: per CUDA device: (the training stream's work so far, the copies' completion)
        self._events: dict[torch.device, tuple[Any, Any]] = {}

    def defers(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` lies in the memory of a tensor only an optimizer step changes."""
        return _storage(tensor) in self._names

    def buffer_for(self, tensor: torch.Tensor, buffers: HostBuffers,
                   whole: torch.Tensor | None = None) -> torch.Tensor:
        """The buffer ``tensor``'s copy will be made in, by :meth:`make`. ``whole``: the
        tensor ``tensor`` is part of (a DTensor, for its shard), whose version counter moves
        when it is changed; ``tensor`` itself by default."""
        buffer = buffers.buffer_for(tensor)
        if tensor.device.type == "cuda" and tensor.device not in self._events:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(tensor.device))
            # blocking: the writer's thread sleeps in wait() rather than spinning on a core
            self._events[tensor.device] = (ready, torch.cuda.Event(blocking=True))
        whole = tensor if whole is None else whole
        self._pending.append((tensor, buffer, whole, whole._version))
        return buffer

    def __bool__(self) -> bool:
        return bool(self._pending)

    def mark_ready(self) -> None:
        """On the training thread, once the saving hook is over: on a CUDA device the copies
        will start after the work issued until now (what the hook's later implementations
        did to the tensors through ``.data`` included), not only after what was issued when
        the save began."""
        for device, (ready, _) in self._events.items():
            ready.record(torch.cuda.current_stream(device))

    def make(self, step: int) -> None:
        """Make the copies (the checkpoint of global step ``step``), in order; on a CUDA
        device, issue them."""
        pending, self._pending = self._pending, []
        streams = {}
        for device, (ready, _) in self._events.items():
            streams[device] = torch.cuda.Stream(device)
            streams[device].wait_event(ready)
        try:
            for tensor, buffer, whole, version in pending:
                stream = streams.get(tensor.device)
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    buffer.copy_(tensor.detach(), non_blocking=stream is not None)
                if whole._version != version:  # changed before (or while) it was copied
                    raise ChangedBeforeCopiedError(
                        f"the checkpoint of step {step} was not written: "
                        f"{self._names[_storage(tensor)]} was changed in place after the save "
                        f"and before the copy of it was made. An asynchronous save made between "
                        f"two steps copies what the optimizers hold while the next step computes "
                        f"its gradients, so nothing before the next optimizer step may change "
                        f"them in place (training_step, a forward that renorms its weights such "
                        f"as nn.Embedding(max_norm=...), a forward hook, a callback's "
                        f"on_train_batch_start). Change them in on_before_optimizer_step or "
                        f"later, or save synchronously (async_save off).")
        finally:  # what the training thread orders itself after: every copy issued
            for device, stream in streams.items():
                self._events[device][1].record(stream)

    def order_after(self) -> None:
        """On the training thread, once :meth:`make` has returned: its later work on a CUDA
        device runs after the copies (the device waits; the host does not)."""
        for device, (_, done) in self._events.items():
            torch.cuda.current_stream(device).wait_event(done)

    def wait(self) -> None:
        """On the writer's thread, after :meth:`make`: wait until the copies are in host
        memory."""
        for _, done in self._events.values():
            done.synchronize()


def _plain_tensors(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """``tensor``, or the tensors a tensor made of tensors (a wrapper subclass) is made of."""
    if not is_traceable_wrapper_subclass(tensor):
        yield tensor
        return
    for name in tensor.__tensor_flatten__()[0]:
        inner = getattr(tensor, name)
        if isinstance(inner, torch.Tensor):  # a DTensor's device mesh is flattened too
            yield from _plain_tensors(inner)


def _storage(tensor: torch.Tensor) -> tuple[torch.device, int]:
    return tensor.device, tensor.untyped_storage().data_ptr()


def copy_key(tensor: torch.Tensor) -> tuple:
    """What :func:`host_copy`'s memo knows a tensor by: its memory (device, storage address,
    offset), shape, strides and dtype; a tensor made of tensors (a wrapper subclass, which has
    no memory of its own) by its type and its tensors' keys."""
    if is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        return (type(tensor), *(copy_key(getattr(tensor, name)) for name in names))
    return (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
            tuple(tensor.shape), tensor.stride(), tensor.dtype)


class HostBuffers:
    """The host memory background writes copy into, kept from one write to the next.

    A fresh allocation of a checkpoint's size costs a page fault per page at the copy (806 MB
    copied in 0.33 s on this project's 2-core machine, against 0.06 s into memory already
    touched), and a copy from a CUDA device is fastest into pinned memory, which is slow to
    allocate. So the copies of a finished write (:meth:`reuse`) become the next write's
    buffers, matched by device, shape, strides and dtype; at most one write is in flight, so a
    copy is never overwritten while it is being written. Between two writes the process holds
    one copy of the checkpoint's tensors, which each write needs anyway: the peak is the same.
    :meth:`release` gives the memory back (at the end of a stage), pinned memory included:
    torch's pinned-memory allocator keeps freed blocks for reuse, and rounds each up to a power
    of two (so a pinned copy may take up to twice its size while it is held).

    The first write's buffers can be made ahead of it: inside :meth:`planning`, :meth:`copy`
    only records what it would copy, and on leaving, buffers for it are allocated and touched
    on a thread of their own while training goes on; :meth:`copy` waits for that thread."""

    def __init__(self) -> None:
        self._free: dict[tuple, list[torch.Tensor]] = {}
        self._planned: list[torch.Tensor] | None = None  # inside planning(): what copy() saw
        self._preparing: threading.Thread | None = None
        self._prepared: list[tuple[tuple, torch.Tensor]] = []  # by the preparing thread
        self._pinned = False  # whether a buffer was pinned since the last release()

    @staticmethod
    def _kind(tensor: torch.Tensor) -> tuple:
        return tensor.device.type, tuple(tensor.shape), tensor.stride(), tensor.dtype

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host copy of ``tensor``, in a buffer of the last write's (or of the preparation's)
        where one fits; inside :meth:`planning`, ``tensor`` itself, recorded."""
        if self._planned is not None:
            self._planned.append(tensor)
            return tensor
        return self.buffer_for(tensor).copy_(tensor.detach())

    def buffer_for(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host buffer of ``tensor``'s shape, strides and dtype (not yet written into): one
        of the last write's (or of the preparation's) where one fits, else a new one."""
        self._wait()
        free = self._free.get(self._kind(tensor))
        if free:
            buffer = free.pop()
        else:
            pinned = tensor.device.type == "cuda"
            # made in a validation (inference mode), an inference tensor could not be copied
            # into by a later save made outside it
            with torch.inference_mode(False):
                buffer = torch.empty_like(tensor, device="cpu", pin_memory=pinned)
            self._pinned |= pinned
        return buffer

    @contextlib.contextmanager
    def planning(self) -> Iterator[None]:
        """Inside, :meth:`copy` copies nothing and records what it is given; on leaving
        without an error, a buffer for each contiguous tensor recorded is allocated (pinned
        for a CUDA tensor) and its memory touched, on a thread of its own. Its buffers join
        the free ones when the next :meth:`copy`, :meth:`reuse` or :meth:`release` waits for
        it. An allocation that fails there leaves the copy to allocate, and say so, itself."""
        self._wait()
        self._planned = []
        try:
            yield
            kinds = [(self._kind(t), t.device.type == "cuda") for t in self._planned
                     if t.is_contiguous()]  # what empty_like makes for it: the same strides
        finally:
            self._planned = None
        self._pinned |= any(pinned for _, pinned in kinds)
        self._preparing = threading.Thread(target=self._allocate, args=(kinds,),
                                           name="ptrain-checkpoint-buffers", daemon=True)
        self._preparing.start()

    def _allocate(self, kinds: list[tuple[tuple, bool]]) -> None:
        try:
            for kind, pinned in kinds:
                _, shape, stride, dtype = kind
                buffer = torch.empty_strided(shape, stride, dtype=dtype, pin_memory=pinned)
                if not pinned:  # pinned memory is resident once allocated
                    buffer.zero_()  # the page faults, here rather than in the copy
                self._prepared.append((kind, buffer))
        except (RuntimeError, MemoryError):  # out of memory: the copy allocates, or says it
            self._prepared.clear()

    def _wait(self) -> None:
        """Wait for the preparing thread, if any, and take its buffers as free ones."""
        if self._preparing is None:
            return
        self._preparing.join()
        self._preparing = None
        for kind, buffer in self._prepared:
            self._free.setdefault(kind, []).append(buffer)
        self._prepared = []

    def reuse(self, copies: dict[tuple, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Take the copies of a finished write (its ``memo``) as the next write's buffers;
        buffers of earlier writes (or of the preparation) no copy used are let go."""
        self._wait()
        self._free = {}
        for original, copy in copies.values():
            if not is_traceable_wrapper_subclass(copy):  # its tensors are copies of their own
                self._free.setdefault(self._kind(original), []).append(copy)

    def release(self) -> None:
        self._wait()
        self._free = {}
        if self._pinned:  # the allocator keeps freed pinned blocks: hand them back
            self._pinned = False
            torch.accelerator.empty_host_cache()


def _is_dtensor(obj: Any) -> bool:
    # torch.distributed.tensor is not imported for it: without that module no DTensor exists
    tensors = sys.modules.get("torch.distributed.tensor")
    return tensors is not None and isinstance(obj, tensors.DTensor)


class BackgroundWrite:
    """The files of one checkpoint point, written in order on one background thread.

    They come in parts, one per save (:meth:`begin_part`: a top-k file, then ``last.ckpt``),
    each part the files one process writes for it (none, on a rank that writes nothing). A part
    fails with the first error of its files; a failed part stops the files after it, and the
    later parts fail with its error. What waits on the write (:meth:`then`) waits on the part
    begun last, as it would have waited on that save had it been synchronous."""

    def __init__(self, step: int, buffers: HostBuffers, point: object | None = None) -> None:
        self.step = step  # the global step the files hold
        #: the checkpoint point whose saves share this write (Trainer.checkpoint_point), or
        #: None: one save's alone
        self.point = point
        #: whether a part's copies of the whole state (parameters and optimizer state) are
        #: checked finite before its files (finite_state.copy_check): the step is then known
        #: finite once the write has no error
        self.checks_state = False
        self.memo: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # see host_copy
        self.buffers = buffers  # host_copy copies into them; finish() hands the copies back
        self._queue: list[tuple[int, Callable[[], None]]] = []
        self._copies: list[tuple[int, DeferredCopies]] = []  # taken before any file
        self._copied: list[DeferredCopies] = []  # made (issued, on a CUDA device)
        self._unwritten = 0  # files and copies queued or being made
        self._uncopied = 0  # copies queued or being made
        self._copies_held = True  # until release_copies: the writer makes none, nor any file
        self._closed = False
        self._errors: list[BaseException | None] = []  # each part's own
        self._continuations: list[tuple[int, Continuation]] = []
        #: set by :meth:`finish`: the error of the first failed part that no continuation
        #: waited on (its save's caller has not heard of it), or None
        self.unheard_error: BaseException | None = None
        self._lock = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="ptrain-checkpoint-write",
                                        daemon=True)
        self._thread.start()

    def begin_part(self) -> bool:
        """Start the part of the next save: the files and copies added and continuations
        registered from now on are its. Whether it is the first part."""
        with self._lock:
            self._errors.append(None)
            return len(self._errors) == 1

    def add(self, write_file: Callable[[], None]) -> None:
        """Queue one file's write (a function of no arguments that writes it atomically)."""
        with self._lock:
            self._queue.append((len(self._errors) - 1, write_file))
            self._unwritten += 1
            self._lock.notify_all()

    def add_copies(self, copies: DeferredCopies) -> None:
        """Queue the deferred copies of the part begun last: they are made before any file
        still queued (and so before this part's files)."""
        with self._lock:
            self._copies.append((len(self._errors) - 1, copies))
            self._unwritten += 1
            self._uncopied += 1
            self._lock.notify_all()

    def release_copies(self) -> None:
        """On the training thread: let the writer make the deferred copies queued, and from
        then on any added. Held until now, they are made of the state as it is once the saving
        hook (every implementation of it) is over."""
        with self._lock:
            self._release()

    def _release(self) -> None:  # holding the lock
        if self._copies_held:
            for _, copies in self._copies:
                copies.mark_ready()
            self._copies_held = False
            self._lock.notify_all()

    def wait_for_copies(self) -> None:
        """Wait until every deferred copy queued has been made (or its part has failed): the
        tensors copied may change from then on. Releases them first."""
        with self._lock:
            self._release()
            while self._uncopied:
                self._lock.wait()
            copied, self._copied = self._copied, []
        for copies in copied:
            copies.order_after()

    def then(self, continuation: Continuation) -> None:
        """Run ``continuation`` on the training thread once the write is finished, with the
        error of the part begun last (``None``: its files, and those before, were written).
        Those of written parts run first, in order; then those of failed parts, in reverse
        order, so that each can put back what its save changed after the one before."""
        self._continuations.append((len(self._errors) - 1, continuation))

    def discard_continuations(self) -> None:
        """Drop what waited on the write (a failed stage runs none of it)."""
        self._continuations.clear()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closed and (self._copies_held and self._copies or
                                            not self._queue and not self._copies):
                    self._lock.wait()
                copies: DeferredCopies | None = None
                if self._copies:
                    part, copies = self._copies.pop(0)
                    work: Callable[[], None] = functools.partial(copies.make, self.step)
                elif self._queue:
                    part, work = self._queue.pop(0)
                else:
                    return
                failed = next((error for error in self._errors[:part + 1]
                               if error is not None), None)
            try:
                if failed is None:
                    work()
                elif isinstance(work, CollectiveWrite):  # the other ranks' threads wait for it
                    work.write(failed)
                # else: a failed file (or copy) stops the files after it
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                self._fail(part, exc)
            finally:
                if copies is not None:  # made or issued: the training thread may go on
                    with self._lock:
                        self._copied.append(copies)
                        self._uncopied -= 1
                        self._lock.notify_all()
            try:
                if copies is not None and failed is None:
                    copies.wait()  # in host memory, before the files read them
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                self._fail(part, exc)
            finally:
                with self._lock:
                    self._unwritten -= 1

    def _fail(self, part: int, error: BaseException) -> None:
        with self._lock:
            self._errors[part] = self._errors[part] or error

    def done(self) -> bool:
        """Whether every queued file has been written or has failed, or the first part has
        failed, which fails the rest (never blocks; :meth:`finish` may still wait a moment for
        the thread to skip them)."""
        with self._lock:
            first_failed = bool(self._errors) and self._errors[0] is not None
            return self._unwritten == 0 or (first_failed and self._uncopied == 0)

    def finish(self, agree: Callable[[list[BaseException | None], set[int]],
                                     tuple[list[BaseException | None], set[int]]] | None = None
               ) -> BaseException | None:
        """Wait for the queued files, then run the continuations in order (on this thread),
        each with its part's error; with ``agree``, the parts' errors and which parts a
        continuation waited on are first replaced by what it makes of them (the job's, under
        several processes: :meth:`WriteAgreement.agreed_outcome`). Return the write's error
        (its first part's that failed), or ``None``; :attr:`unheard_error` is the one no
        continuation was given."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join()
        memo, self.memo = self.memo, {}
        self.buffers.reuse(memo)  # the files are written: the next write's copies go there
        continuations, self._continuations = self._continuations, []
        heard = {part for part, _ in continuations}
        errors, heard = (self._errors, heard) if agree is None else agree(self._errors, heard)
        effective, first = [], None  # a part after a failed one fails with its error
        for error in errors:
            first = first or error
            effective.append(first)
        self.unheard_error = next((error for part, error in enumerate(effective)
                                   if error is not None and part not in heard), None)
        error_of = [effective[part] if part >= 0 else None for part, _ in continuations]
        written = [(c, e) for (_, c), e in zip(continuations, error_of) if e is None]
        failed = [(c, e) for (_, c), e in zip(continuations, error_of) if e is not None]
        # what waited on failed parts undoes what their saves did, the last save's first
        for continuation, error in written + failed[::-1]:
            continuation(error)
        return first


class WriteAgreement:
    """The ranks' views of the write in flight, combined over a gloo group of its own (CPU
    values: no host sync with the device). Every rank calls each method at the same point, on
    the training thread; the group is made on the first call, so the first call too must be
    one every rank makes."""

    def __init__(self) -> None:
        self._group: Any = None

    def _ranks(self) -> Any:
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def all_ended(self, ended: bool) -> bool:
        """Whether the write has ended on every rank (a 1-element all-reduce)."""
        flag = torch.tensor([int(ended)])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._ranks())
        return bool(flag.item())

    def agreed_outcome(self, errors: list[BaseException | None], heard: set[int]
                       ) -> tuple[list[BaseException | None], set[int]]:
        """Per part (every rank has as many: one per save), the error of the first rank whose
        files of it failed, the same on every rank (``None``: every rank wrote its files): its
        own error on that rank, the rank's message on the others, as a
        :class:`CheckpointWriteError` where it was a refused write and a
        :class:`ChangedBeforeCopiedError` where it was one. With them, the parts some rank's
        continuation waited on (``heard`` on this rank): an error no rank heard is raised on
        every rank, one that some rank heard on none."""
        group = self._ranks()
        seen: list[tuple[list[tuple[str, str] | None], list[int]] | None] = \
            [None] * dist.get_world_size(group)
        mine = [None if error is None else (_agreed_kind(error), str(error)) for error in errors]
        dist.all_gather_object(seen, (mine, sorted(heard)), group=group)
        heard_by_any = {part for _, parts in seen for part in parts}
        agreed: list[BaseException | None] = []
        for part, error in enumerate(errors):
            failed = [(rank, views[part]) for rank, (views, _) in enumerate(seen)
                      if views[part]]
            if not failed:
                agreed.append(None)
                continue
            rank, (kind, message) = failed[0]
            agreed.append(error if rank == dist.get_rank() else _as_agreed(rank, kind, message))
        return agreed, heard_by_any


class CollectiveWrite:
    """A file of a checkpoint that every rank's writer thread writes together (collectives over
    a group of their own), as ``save_checkpoint_in_background`` may return it in place of a
    plain function. A plain function is skipped on a rank whose save failed already (a copy of
    a tensor changed before it was made, an earlier file of the write), which would leave the
    other ranks waiting in its first collective; ``write(failed)`` is called there too, with
    that error (``None`` where nothing failed), and must raise on every rank when it is not
    ``None`` on some: :func:`agree_to_write` first does that."""

    def __init__(self, write: Callable[[BaseException | None], None]) -> None:
        self.write = write

    def __call__(self) -> None:
        self.write(None)


def agree_to_write(failed: BaseException | None, group: Any = None) -> None:
    """On every rank of ``group`` (all ranks; ``None``: the default group) at once: return when
    ``failed`` is ``None`` on every rank, else raise the first failing rank's error on every
    rank (its own there, one of the same kind naming that rank on the others)."""
    views: list[tuple[str, str] | None] = [None] * dist.get_world_size(group)
    mine = None if failed is None else (_agreed_kind(failed), str(failed))
    dist.all_gather_object(views, mine, group=group)
    rank, view = next(((r, v) for r, v in enumerate(views) if v is not None), (None, None))
    if view is None:
        return
    if rank == dist.get_rank():
        assert failed is not None
        raise failed
    raise _as_agreed(rank, *view)


#: the errors of a rank's write that the other ranks raise as the same kind (by name)
_AGREED_KINDS = {kind.__name__: kind for kind in (CheckpointWriteError, ChangedBeforeCopiedError)}


def _as_agreed(rank: int, kind: str, message: str) -> BaseException:
    """On another rank, the error rank ``rank`` failed with (its kind's name and message)."""
    if kind in _AGREED_KINDS:
        return _AGREED_KINDS[kind](f"rank {rank}: {message}")
    return RuntimeError(f"rank {rank}'s part of the checkpoint write failed: {message}")


def _agreed_kind(error: BaseException) -> str:
    return next((name for name, kind in _AGREED_KINDS.items() if isinstance(error, kind)), "")
