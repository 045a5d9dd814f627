"""The rank watch: a rank that stops running ends the whole job within a time the user sets.

A rank killed outright breaks its peers' next gloo collective at once (on another machine, the
watch then names it when its heartbeat has stopped: :func:`lost_peer_error`); one that is stopped
(SIGSTOP, a frozen machine, a lost network) or dead under NCCL leaves them waiting in a
collective until the process group's timeout (30 minutes by default). The watch finds it sooner.

Each rank runs a thread that writes a heartbeat into the job's TCPStore (the store the process
group met at, through a client of its own whose operations time out) every ``interval``
seconds: a counter, its process and host, when, and what it is doing (stage, epoch, step, the
function its main thread is in). Rank 0 reads every rank's heartbeat; the other ranks read rank
0's. A rank whose counter has not moved for ``stall_timeout`` seconds, or whose process is gone
without saying it ended, or (for rank 0, when it holds the store) whose store stops answering,
ends the job. The watch that saw it:

1. keeps one paragraph naming the rank, its process and host, and what it was last doing,
   which the job's error says once (a rank the script launcher started, whose error rank 0
   would print, prints it at once: the rank it saw stop is rank 0);
2. kills that process with SIGKILL when it runs on this machine (a stopped process would hold
   its memory and devices for ever; its closed sockets also break every pending gloo
   collective, so each rank ends through its normal error path);
3. hands the message to the strategy's ``report_error``, which raises it as the job's error
   (:func:`stall_error`);
4. ends its own process ``grace`` seconds later if its main thread has not reached the error
   handling by then (an NCCL collective does not end when a peer dies), after printing the
   paragraph and killing the ranks it started.

A rank's heartbeat says ``done`` once its part of the job ended while it still takes part in
the last collectives (destroying the process group), when a silence still counts but its end
does not; ``exited`` as its last word, and ``failed`` when it fails, with the first line of its
error (the whole error reaches its own machine's launcher through the launchers' records): the
others do not watch it then, until it beats again (a later stage of the script). A rank whose
collective breaks because a rank on another machine failed names that rank and its error (its
record can't reach this machine).

torch's own monitoring does not cover this: NCCL's heartbeat monitor watches its own process's
NCCL watchdog, and gloo's ``monitored_barrier`` must be entered by every rank on its main thread,
tells only rank 0 which ranks are missing, and not what they were doing. A rank that is alive
but stuck (a deadlock with its heartbeat still going) is still ended by the collective timeout.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from ptrain import rank_errors
from ptrain.errors import WorkerError
from ptrain.frames import is_library_frame

#: Where a heartbeat's fields are separated; the last field (what the rank does) may hold any text.
_SEP = "\n"


class RankStalled(WorkerError):
    """A rank of the job stopped responding (or died without a word) and the job was ended by
    the rank watch; the message names the rank and what it was doing. ``gone_rank`` is that
    rank when the watch found its process gone (not merely silent): whoever holds its exit
    status can say more (see :func:`ptrain.script_launch.first_error`)."""

    gone_rank: int | None = None


#: What a rank's first heartbeat, written as its watch starts, says it is doing: no step yet.
_STARTING = "starting"


class _Heartbeat:
    """What one rank last said, when it said it (``sent``: its wall clock), and when (this
    process's monotonic clock) it last changed."""

    def __init__(self, now: float):
        self.count, self.state, self.pid, self.host, self.doing = -1, "running", 0, "", _STARTING
        self.changed, self.sent = now, 0.0

    def where(self) -> str:
        """Its process and host, as the messages name them."""
        return f"pid {self.pid} on {self.host}" if self.pid else "not heard from yet"

    def position(self) -> str | None:
        """What it said it was doing, and how long before now it said so; ``None`` when it has
        told nothing yet (only its first beat, written as its watch started)."""
        if self.count < 0 or self.doing == _STARTING:
            return None
        return (f"{self.doing} (its last heartbeat, sent {max(0.0, time.time() - self.sent):.1f}"
                f" s before this)")

    def last_said(self) -> str:
        """``position()`` as a clause of a message ("; it was last ..."), or nothing."""
        position = self.position()
        return f"; it was last {position}" if position else ""

    def update(self, raw: bytes, now: float) -> None:
        count, state, pid, host, sent, doing = raw.decode("utf-8", "replace").split(_SEP, 5)
        if int(count) != self.count:
            self.changed = now
        self.count, self.state, self.pid, self.host, self.sent, self.doing = \
            int(count), state, int(pid), host, float(sent), doing


class RankWatch:
    """The watch of one process; see the module docstring. ``describe()`` (called on the watch
    thread) says what this rank is doing; ``hint`` is the option that sets ``stall_timeout``,
    named in the message; ``key_prefix`` is the prefix of this try's keys in the store
    (:mod:`ptrain.restart_store`)."""

    def __init__(self, *, rank: int, world_size: int, stall_timeout: float, host: str, port: int,
                 describe: Callable[[], str], hint: str, grace: float = 10.0,
                 key_prefix: str = ""):
        self.rank, self.world_size = rank, world_size
        self.stall_timeout, self.grace, self.hint = stall_timeout, grace, hint
        self.interval = max(0.05, min(stall_timeout / 4, 5.0))
        self.describe = describe
        self.message: str | None = None
        self._verdict_lock = threading.Lock()  # the judge thread and the main thread may decide
        self.gone_rank: int | None = None  # the rank whose process the watch found gone
        self._host, self._port, self._key_prefix = host, port, key_prefix
        self._count = 0
        self._state = "running"
        self._failure: str | None = None  # the first line of this rank's error, once it failed
        self._stop = threading.Event()
        self._handled = threading.Event()  # the main thread reached the error handling
        self._threads: list[threading.Thread] = []
        self._in_store_since: float | None = None  # when the beat thread's store call began
        self._read_at = time.monotonic()  # when it last read the watched heartbeats
        self._store: Any = None
        self._hostname = socket.gethostname()
        watched = range(1, world_size) if rank == 0 else [0]
        self._peers = {peer: _Heartbeat(time.monotonic()) for peer in watched}

    # -- this rank ------------------------------------------------------------------------------

    def start(self) -> None:
        """Write the first heartbeat (on the calling thread), then beat on one thread and judge
        the others' heartbeats on another (a store operation can block for ever when the
        store's holder is stopped, whatever the client's timeout: the judge times it)."""
        import torch.distributed as dist

        # the judge times the store's answers; a call on its own waits up to the default
        client = dist.TCPStore(self._host, self._port, is_master=False,
                               timeout=timedelta(seconds=max(300.0, self.stall_timeout)))
        self._store = dist.PrefixStore(f"{self._key_prefix}ptrain-rank-watch", client)
        self._beat()
        for target, name in ((self._run_beats, "beat"), (self._run_judge, "judge")):
            thread = threading.Thread(target=target, name=f"ptrain-rank-watch-{name}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, state: str, error: BaseException | None = None) -> None:
        """End the watch, leaving ``state`` (``exited``, or ``failed`` with the first line of
        ``error``) as this rank's last word (written by the beat thread, waited for at most
        ``interval`` seconds)."""
        self._handled.set()  # the main thread got here: no forced exit (see _end_job)
        if self._stop.is_set():
            return
        if error is not None:
            self._failure = _first_line(error)
        self._state = state
        self._stop.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=self.interval)

    def finish(self) -> None:
        """Tell the other ranks that this rank's part ended (its next heartbeat says ``done``)
        while it keeps watching: its last collective steps (destroying the process group) still
        need rank 0, and a rank 0 that stops then is still found."""
        self._state = "done"

    def _beat(self) -> None:
        self._count += 1
        if self._state != "running":
            doing = self._failure or self._state
        else:  # the first beat comes from start(), on the main thread: nothing to tell yet
            doing = self.describe() if self._count > 1 else _STARTING
        self._store.set(str(self.rank), _SEP.join(
            (str(self._count), self._state, str(os.getpid()), self._hostname, repr(time.time()),
             doing)))

    def _run_beats(self) -> None:
        """Beat and read the watched heartbeats every ``interval``; the last beat says how this
        rank's part ended. A failing or slow store call is retried at the next round; the judge
        times how long the store has not answered."""
        while not self._stop.wait(self.interval):
            if self._in_store_since is None:
                self._in_store_since = time.monotonic()
            try:
                self._beat()
                for peer, beat in self._peers.items():
                    if self._store.check([str(peer)]):
                        beat.update(self._store.get(str(peer)), time.monotonic())
            except Exception:
                continue
            self._in_store_since = None
            self._read_at = time.monotonic()
        if self.message is None:
            try:
                self._beat()
            except Exception:  # the store's holder has gone: nobody is left to tell
                pass

    def _run_judge(self) -> None:
        """Every ``interval``, end the job if a watched rank has been silent too long. Silence
        is measured between this process's own reads of the store, and a round that finds this
        process itself was held up (not scheduled, its GIL held) judges nothing: a pause of the
        watcher is not a stall of the watched."""
        judged_at = time.monotonic()
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            held_up = now - judged_at > 2 * self.interval + 0.5
            judged_at = now
            if held_up:
                continue
            blocked = self._in_store_since
            if self.rank != 0 and blocked is not None and now - blocked > self.stall_timeout:
                self._end_job(0, f"the job's store ({self._host}:{self._port}, held by rank 0 "
                                 f"or its launcher) did not answer for {now - blocked:.1f} s")
                return
            for peer, beat in self._peers.items():
                if beat.state in ("exited", "failed"):  # gone, or reporting its own error
                    continue
                if self._gone_here(peer, beat):
                    self.gone_rank = peer
                    self._end_job(peer, "its process is gone without saying it ended (killed?)")
                    return
                silent = self._read_at - beat.changed
                if silent > self.stall_timeout:
                    self._end_job(peer, f"no heartbeat for {silent:.1f} s")
                    return

    def _read_peers(self) -> None:
        """Read the watched ranks' heartbeats now (those the store answers for)."""
        for peer, beat in self._peers.items():
            try:
                if self._store.check([str(peer)]):
                    beat.update(self._store.get(str(peer)), time.monotonic())
            except Exception:  # the store can't tell: what was read before
                continue

    def _gone_here(self, peer: int, beat: _Heartbeat) -> bool:
        """Whether ``peer``, running by its last word, ran on this machine and its process is
        gone without saying that its part ended."""
        return beat.state == "running" and beat.host == self._hostname and bool(beat.pid) \
            and not _alive(beat.pid) and not self._said_it_ended(peer, beat)

    def _said_it_ended(self, peer: int, beat: _Heartbeat) -> bool:
        """Whether ``peer``'s beat in the store, read now, says its part ended. The cached
        ``beat`` can be a round old: a rank that finished, wrote its last beat and exited
        within one interval is still "running" there, and must not be taken for killed."""
        try:
            beat.update(self._store.get(str(peer)), time.monotonic())
        except Exception:  # the store can't tell: judge on what was read before
            return False
        return beat.state != "running"

    # -- ending the job ----------------------------------------------------------------------------

    def silent_peers(self, longer_than: float) -> list[str]:
        """A clause for each watched rank, still running, whose heartbeat has not moved for
        more than ``longer_than`` seconds (as of this watch's last read): its process, how long,
        and what it last said it was doing."""
        said = []
        for peer, beat in self._peers.items():
            silent = self._read_at - beat.changed
            if beat.state == "running" and silent > longer_than:
                said.append(f"rank {peer} ({beat.where()}) had sent no heartbeat for "
                            f"{silent:.1f} s; it was last {beat.doing}")
        return said

    def last_doing(self, rank: int) -> str | None:
        """What ``rank`` last said it was doing, and how long before now it said so (a beat
        comes every ``interval`` seconds, so the rank may have gone on after it: its step is
        the last one it is known to have reached), read from the store now where it answers;
        ``None`` when it has told nothing since its watch started."""
        beat = self._peers.get(rank)
        if beat is None:
            return None
        try:
            beat.update(self._store.get(str(rank)), time.monotonic())
        except Exception:  # the store can't tell: what was read before
            pass
        return beat.position()

    def _decide(self, peer: int, message: str) -> bool:
        """Make ``message`` (about ``peer``) the job's error, unless another thread of this
        process decided first (``False``): say it where no main thread would, record it for the
        spawn launcher, kill ``peer``'s process when it runs here, and stop watching."""
        from ptrain import script_launch

        with self._verdict_lock:
            if self.message is not None:
                return False
            self.message = message
        beat = self._peers.get(peer) or _Heartbeat(time.monotonic())
        # A rank the script launcher started records its error for rank 0 without printing it,
        # and the rank it saw stop is rank 0 (the one that would print): it says it here. Any
        # other process reports the message through its main thread; it says it here only if
        # that thread stays blocked (see _end_job).
        if script_launch.is_started_copy():
            print(f"ptrain: rank {self.rank}: {self.message}", file=sys.stderr, flush=True)
        if _record_folder is not None:  # before the kill, which the launcher may see first
            rank_errors.write_record(_record_folder, RankStalled(self.message), self.rank)
        if beat.pid and beat.host == self._hostname:
            try:
                os.kill(beat.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._stop.set()
        return True

    def wait_for_verdict(self) -> None:
        """(The main thread, after a peer's connection closed under a collective.) Return once
        this watch has ended the job; or a rank on another machine has said that it failed
        (the job ends naming it and its error, which its own machine reports in full); or every
        watched rank has said that its part ended or failed (its own error is the job's then);
        or a rank still running by its last word has not beaten for three rounds (it beats
        every round): that one is gone, and the job ends naming it, without waiting out the
        stall timeout. At most the stall timeout and three rounds."""
        deadline = time.monotonic() + self.stall_timeout + 3 * self.interval
        self._read_peers()  # the beat thread reads them only every interval: pids, last words
        while self.message is None and time.monotonic() < deadline:
            for peer, beat in self._peers.items():
                if self._gone_here(peer, beat):  # no need to wait for its heartbeat to stop
                    self.gone_rank = peer
                    self._decide(peer, f"rank {peer} ({beat.where()}) is gone: its process "
                                       f"ended without saying it ended (killed?) and its "
                                       f"connection closed under a collective"
                                       f"{beat.last_said()}. The job was ended.")
                    return
                if beat.state == "failed" and beat.host != self._hostname:
                    error = f" with {beat.doing}" if beat.doing != "failed" else ""
                    self._decide(peer, f"rank {peer} ({beat.where()}) failed{error} (that "
                                       f"machine reports its error in full); its connection "
                                       f"closed under a collective. The job was ended.")
                    return
            if all(beat.state != "running" for beat in self._peers.values()):
                return
            for peer, beat in self._peers.items():
                silent = self._read_at - beat.changed
                if beat.state == "running" and silent > 3 * self.interval:
                    self._decide(peer, f"rank {peer} ({beat.where()}) is gone: its connection "
                                       f"closed under a collective and it has sent no "
                                       f"heartbeat for {silent:.1f} s{beat.last_said()}. "
                                       f"The job was ended.")
                    return
            time.sleep(min(self.interval / 4, 0.05))

    def _end_job(self, peer: int, why: str) -> None:
        beat = self._peers.get(peer) or _Heartbeat(time.monotonic())
        if not self._decide(peer, f"rank {peer} ({beat.where()}) stopped responding: {why}"
                                  f"{beat.last_said()}. The job was ended (a rank silent for "
                                  f"{self.hint} {self.stall_timeout:g} seconds ends it)."):
            return
        from ptrain import script_launch

        said = script_launch.is_started_copy()
        # the main thread now fails in its collective and reports the message (stop() tells);
        # if it is still blocked after the grace period (an NCCL collective), the process ends
        if self._handled.wait(self.grace):
            return
        if not said:
            print(f"ptrain: rank {self.rank}: {self.message}", file=sys.stderr, flush=True)
        script_launch.kill_copies()
        print(f"ptrain: rank {self.rank}: still blocked {self.grace:g} s after the job ended; "
              f"exiting.", file=sys.stderr, flush=True)
        os._exit(1)


def _first_line(error: BaseException) -> str:
    """``error``'s type and the first line of its message, at most 300 characters: what a
    heartbeat can carry of it."""
    lines = str(error).strip().splitlines()
    said = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return said if len(said) <= 300 else said[:297] + "..."


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` of this machine (``R``, ``S``, ``T`` stopped, ``Z``
    a zombie...), ``None`` when it does not exist, ``"?"`` where ``/proc`` can't tell."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine still runs (a zombie, dead but not yet reaped by
    its parent, does not)."""
    return process_state(pid) not in (None, "Z", "X")


def where_main_thread_is() -> str:
    """The function the main thread is in: the innermost frame outside torch and the standard
    library's plumbing, and the library call it is blocked in, if any (``"all_reduce (torch),
    called from reduce_metrics (distributed.py:361)"``)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    innermost = frame
    while frame is not None and is_library_frame(frame):
        frame = frame.f_back
    if frame is None:
        return "library code"
    own = f"{frame.f_code.co_name} ({Path(frame.f_code.co_filename).name}:{frame.f_lineno})"
    if innermost is frame or innermost is None:
        return own
    library = innermost.f_globals.get("__name__", "").split(".")[0] or "library"
    return f"{innermost.f_code.co_name} ({library}), called from {own}"


# -- this process's watch -----------------------------------------------------------------------

_watch: RankWatch | None = None
_record_folder: str | None = None


def record_stalls_in(folder: str) -> None:
    """A worker of the spawn launcher: when this process's watch ends the job, it leaves its
    message in ``folder`` (see :mod:`ptrain.rank_errors`) before it kills the silent rank, for
    the launcher may see that rank die and stop this one before its main thread reports."""
    global _record_folder
    _record_folder = folder


def start(**kwargs: Any) -> None:
    """Start this process's watch (see :class:`RankWatch` for the arguments), once per process
    group; a later call (the next stage of the script) only takes its ``describe``."""
    global _watch
    if _watch is not None:
        _watch.describe = kwargs["describe"]
        return
    _watch = RankWatch(**kwargs)
    _watch.start()


def stop(state: str = "exited", error: BaseException | None = None) -> None:
    """End this process's watch, telling the others that it is leaving (``exited``) or failed
    (``failed``, with ``error``'s first line)."""
    global _watch
    if _watch is not None:
        _watch.stop(state, error)
        _watch = None


def finishing() -> None:
    """This process's watch's :meth:`RankWatch.finish`, when it has one."""
    if _watch is not None:
        _watch.finish()


def stall_timeout() -> float | None:
    """This process's watch's stall timeout, ``None`` when it has none."""
    return _watch.stall_timeout if _watch is not None else None


def stall_error() -> RankStalled | None:
    """The error of the job when the watch ended it, else ``None``."""
    if _watch is None or not _watch.message:
        return None
    error = RankStalled(_watch.message)
    error.gone_rank = _watch.gone_rank
    return error


#: How torch says a collective ran past the process group's timeout: gloo's message, and
#: the NCCL watchdog's
_COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting \d+ ?ms for \w+ operation|collective "
                                 r"operation timeout|ran for \d+ milliseconds before timing out")


def timeout_error(exception: BaseException, timeout: float, hint: str) -> RankStalled | None:
    """For ``exception``, torch's error when a collective waited the process group's
    ``timeout`` (the option ``hint``, e.g. ``--ddp-timeout``) and gave up, the job's error:
    it names the ranks whose heartbeat stopped (a stopped or frozen rank) and what they were
    last doing, or says that every rank was still beating. ``None`` for any other error."""
    if not _COLLECTIVE_TIMEOUT.search(str(exception)):
        return None
    head = f"a collective waited {timeout:g} seconds ({hint}) for the other ranks and gave up"
    if _watch is None:
        return RankStalled(f"{head}; which rank did not come is not known (the rank watch was "
                           f"off: a stall timeout of 0). The job was ended.")
    # a beating rank's counter moves every interval and is read every interval, so it looks
    # silent for at most about one interval
    silent = _watch.silent_peers(longer_than=2 * _watch.interval)
    if silent:
        return RankStalled(f"{head}: {'; '.join(silent)}. The job was ended (it would have been "
                           f"sooner with {_watch.hint} below {timeout:g}).")
    return RankStalled(f"{head}, though every rank's heartbeat was still moving: one is alive "
                       f"but stuck (a deadlock), or skipped a collective the others entered (a "
                       f"barrier, a sync_dist log or an all_reduce under a condition that "
                       f"differs between ranks). The job was ended.")


#: How gloo says a peer's connection closed under a collective: its process died (killed, or
#: its machine went down), or it failed and exited
_PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe")


def lost_peer_error(exception: BaseException) -> RankStalled | None:
    """For ``exception``, gloo's error when a peer's connection closed under a collective, the
    job's error once the watch has found which rank is gone (see
    :meth:`RankWatch.wait_for_verdict`): a killed process on another machine can't be looked
    up, only heard to stop. ``None`` for any other error, without a watch, or when the peer
    reported its own failure."""
    if _watch is None or not _PEER_LOST.search(str(exception)):
        return None
    _watch.wait_for_verdict()
    return stall_error()


def last_doing(rank: int) -> str | None:
    """What ``rank`` last said it was doing, when this process's watch heard it (rank 0 hears
    every rank)."""
    return _watch.last_doing(rank) if _watch is not None else None


__all__ = ["RankStalled", "RankWatch", "finishing", "last_doing", "lost_peer_error",
           "process_state",
           "record_stalls_in", "stall_error", "stall_timeout", "start", "stop", "timeout_error",
           "where_main_thread_is"]
