"""The script launcher: the rest of a job's processes are the user's program started again.

When a script asks for ``N`` processes (``Trainer(strategy="ddp", devices=N).fit(...)``, or
``ptrain fit --strategy ddp --devices N``), :func:`start_copies` starts the same command line
``N - 1`` more times with the rendezvous environment set (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, as ``torchrun`` would set it) and makes the
calling process rank 0. Every process then runs the script to the same stage call and joins one
process group, which stays up for the rest of the script: a later ``validate``, ``test`` or
``predict`` runs in the same processes without starting any, and each rank builds its own
module (nothing is pickled).

This needs a program to start again: :func:`relaunch_command` finds it, or says there is none
(an interactive session, a notebook, ``python -c``, a stage called from a test runner); then
the strategy uses :func:`ptrain.distributed.launch_workers` instead.

How a failing job ends:

- an error in a stage on a started rank is written to the job's error folder
  (:func:`record_error`); the rank exits without printing it again, and rank 0 raises the error
  of the rank that failed first (:func:`first_error`), then stops the other ranks;
- a started rank whose launching process is gone (killed) stops itself within a second
  (:func:`watch_launcher`);
- at exit, rank 0 waits for the ranks it started (after a failure it stops them) and says on
  stderr if one ended badly.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ptrain import frames, rank_errors, rank_watch
from ptrain.errors import Interrupted, PtrainError

#: Set in every process of a job the script launcher started: the launching process's id.
LAUNCHER_PID = "PTRAIN_LAUNCHER_PID"
#: The folder where a failing rank leaves its error for rank 0.
ERROR_DIR = "PTRAIN_ERROR_DIR"
#: Modules whose frames lie between a stage call and the code that made it.
_BETWEEN = ("pluggy", "contextlib", "runpy", "functools")

_children: list[subprocess.Popen] = []
_failed = False  # a stage of this job failed: the started ranks are stopped, not waited for
_interrupted = False  # stopped by a signal (ptrain.Interrupted): every rank ends so, none failed


def relaunch_command() -> list[str] | None:
    """The command line that runs this program again from the start, or ``None`` where there is
    none to run: an interactive interpreter (REPL, notebook, ``python -i``), code given with
    ``-c`` or on stdin, or a stage called from code that is not the program's own (an installed
    package or the standard library stands between it and ``__main__``, as under a test
    runner)."""
    main = sys.modules.get("__main__")
    file = getattr(main, "__file__", None)
    if main is None or not file or hasattr(sys, "ps1") or sys.flags.interactive:
        return None
    if not _called_from_main():
        return None
    original = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    options = original[1:len(original) - len(sys.argv)]  # the interpreter's own, e.g. -X dev
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:  # python -m package
        if options[-1:] == ["-m"]:
            options = options[:-1]
        module = spec.name.removesuffix(".__main__")
        return [sys.executable, *options, "-m", module, *sys.argv[1:]]
    return [sys.executable, *options, os.path.abspath(file), *sys.argv[1:]]


def _called_from_main() -> bool:
    """Whether the stage call comes from the program's ``__main__`` through nothing but the
    user's own code (a helper module of the project, a decorator), ptrain's, and the few
    libraries in ``_BETWEEN``; not when an installed package or the standard library stands
    between, as a test runner does."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name == "__main__":
            return True
        if not (name.split(".")[0] in _BETWEEN or frames.is_users_frame(frame)
                or frames.is_ptrains_frame(frame)):
            return False
        frame = frame.f_back
    return False


def start_copies(command: list[str], nprocs: int,
                 endpoint: tuple[str, int] | None = None) -> None:
    """Start ``command`` as ranks ``1 .. nprocs - 1`` of a job on this machine and make this
    process rank 0: the rendezvous variables are set here and in each copy. They meet at
    ``endpoint`` (host, port: an address of this machine; port 0: a free one), by default at
    a free port of 127.0.0.1."""
    host, port = endpoint or ("127.0.0.1", 0)
    port = port or _free_port()
    error_dir = tempfile.mkdtemp(prefix="ptrain-errors-")
    shared = {"MASTER_ADDR": host, "MASTER_PORT": str(port), "WORLD_SIZE": str(nprocs),
              "LOCAL_WORLD_SIZE": str(nprocs), LAUNCHER_PID: str(os.getpid()),
              ERROR_DIR: error_dir}
    for rank in range(1, nprocs):
        env = {**os.environ, **shared, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        _children.append(subprocess.Popen(command, env=env))
    os.environ.update(shared, RANK="0", LOCAL_RANK="0")
    atexit.register(end_copies)
    previous = sys.excepthook

    def failed(kind, value, tb):  # the script ends with an error: stop the ranks, don't wait
        global _failed
        _failed = True
        previous(kind, value, tb)

    sys.excepthook = failed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_started_copy() -> bool:
    """Whether this process is a rank the script launcher started (not the launching one)."""
    return LAUNCHER_PID in os.environ and os.environ.get("RANK") != "0"


def is_launcher() -> bool:
    """Whether this process started the other ranks of its job with :func:`start_copies`."""
    return bool(_children)


# -- failures -----------------------------------------------------------------------------------


def record_error(exc: BaseException) -> None:
    """On a started rank: leave ``exc`` (and its traceback) for rank 0 to report, and mark it
    reported, so that this rank exits without printing it again (see :func:`install_quiet_exit`)."""
    folder = os.environ.get(ERROR_DIR)
    if not folder or not os.path.isdir(folder):
        return
    rank_errors.write_record(folder, exc, int(os.environ.get("RANK", "0")))
    exc.ptrain_reported_to_launcher = True


def first_error(own: BaseException) -> BaseException:
    """On rank 0 after its stage failed with ``own``: the error to raise. A started rank that
    failed before this one did (whose failure is likely what broke rank 0's collective) gives
    its own error (see :func:`ptrain.rank_errors.error_of`); a started rank that died without
    a record, while rank 0's own error is not a usage error, is named with its exit status, as
    is the rank whose process rank 0's watch found gone (``own`` a
    :class:`~ptrain.rank_watch.RankStalled`). The other ranks are then stopped."""
    global _failed, _interrupted
    if isinstance(own, Interrupted):  # every rank stopped at the same step: they end alike
        _interrupted = True
        return own
    _failed = True
    failed_at = time.time()
    dead = _dead_children(wait=0.0 if isinstance(own, (PtrainError, KeyboardInterrupt))
                          else 1.0)
    _stop_copies()
    # read after the wait: a rank that failed as rank 0 did (the same step's error on every
    # rank) may write its record and exit within it, and is then not a silent death
    folder = os.environ.get(ERROR_DIR)
    records = rank_errors.read_records(folder) if folder and os.path.isdir(folder) else []
    recorded = {record["rank"] for record in records}
    dead = [(rank, code) for rank, code in dead if rank not in recorded]
    if isinstance(own, KeyboardInterrupt):  # Ctrl-C reached every rank: an interruption
        return own
    if isinstance(own, rank_watch.RankStalled):  # rank 0's watch ended the job
        # when it found a rank's process gone, that rank's exit status says more than the
        # watch could ("killed by SIGKILL", not "gone")
        dead = [(rank, code) for rank, code in dead if rank == own.gone_rank]
        if not dead:
            return own
    elif earlier := [r for r in records if r["time"] < failed_at]:
        return rank_errors.error_of(earlier[0])
    elif isinstance(own, PtrainError):
        return own
    if dead:  # a rank dead without a record
        rank, code = dead[0]
        name = signal.Signals(-code).name if code < 0 else ""
        return rank_errors.silent_failure(rank, code, name, rank_watch.last_doing(rank))
    return own


def _dead_children(wait: float) -> list[tuple[int, int]]:
    """(rank, exit code) of the started ranks that ended with an error. A broken collective
    can reach rank 0 before the rank that died can be reaped (its sockets close first), so up
    to ``wait`` seconds are given for one to show."""
    deadline = time.monotonic() + wait
    while True:
        dead = [(rank, child.poll()) for rank, child in enumerate(_children, start=1)
                if child.poll() not in (None, 0)]
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(0.05)


def install_quiet_exit() -> None:
    """On a started rank: an uncaught error is handed to rank 0, which reports it once: an
    error a stage raised was handed over already (:func:`record_error`); one raised outside a
    stage (between two stage calls, or after the last) is handed over here, and rank 0 raises
    it in the stage it broke, or prints it at exit (:func:`end_copies`). This rank prints only
    what it could not hand over, and a ``KeyboardInterrupt`` (which reached every rank)."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not isinstance(value, KeyboardInterrupt) and \
                not getattr(value, "ptrain_reported_to_launcher", False):
            record_error(value)
        if getattr(value, "ptrain_reported_to_launcher", False):
            return
        previous(kind, value, tb)

    sys.excepthook = hook


def watch_launcher() -> None:
    """On a started rank: stop this process within a second of the launching process ending
    (killed, or exited without stopping it), so no rank is left waiting for a job that is gone."""
    launcher = int(os.environ[LAUNCHER_PID])

    def watch():
        while os.getppid() == launcher:
            time.sleep(0.5)
        print(f"ptrain: rank {os.environ.get('RANK')}: the launching process (rank 0, pid "
              f"{launcher}) ended; stopping.", file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="ptrain-launcher-watch", daemon=True).start()


#: The file in the job's error folder that says rank 0 is stopping the ranks it started: a
#: rank's second signal then ends it without a word (it is no user's second Ctrl-C).
STOPPING = "stopping"


def stopped_by_launcher() -> bool:
    """On a started rank: whether rank 0 is stopping this job's ranks (:func:`_stop_copies`)."""
    folder = os.environ.get(ERROR_DIR)
    return bool(folder) and os.path.exists(os.path.join(folder, STOPPING))


def _stop_copies(grace: float = 5.0) -> None:
    """SIGTERM the ranks still running, twice (the first only asks ``stop-signals`` to save at the
    next step; the job failed, there is none), then SIGKILL those left after ``grace`` seconds."""
    folder = os.environ.get(ERROR_DIR)
    if folder and os.path.isdir(folder):
        Path(folder, STOPPING).touch()
    for _ in range(2):
        running = [child for child in _children if child.poll() is None]
        if not running:
            break
        for child in running:
            child.terminate()
        time.sleep(0.1)  # for the first signal to be taken, or the second is one to the kernel
    deadline = time.monotonic() + grace
    for child in _children:
        try:
            child.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def kill_copies() -> None:
    """Kill the ranks this process started at once (SIGKILL), for a process about to end
    without running its exit handlers."""
    for child in _children:
        if child.poll() is None:
            child.kill()
            child.wait()
    _children.clear()
    _remove_error_folder()


def end_copies() -> None:
    """At exit of rank 0, before its process group goes: wait for the ranks it started to
    finish the script (after a failure, stop them), and say on stderr which ended badly. Once;
    later calls do nothing."""
    if not _children:
        return
    if _failed:
        _stop_copies()
    for rank, child in enumerate(_children, start=1):
        code = _wait_unless_stopped(rank, child)
        if code != 0 and not _failed and not _interrupted:
            folder = os.environ.get(ERROR_DIR)
            records = rank_errors.read_records(folder) if folder and os.path.isdir(folder) \
                else []
            why = next((f"; its error:\n{r['traceback']}" for r in records if r["rank"] == rank),
                       "; its output above says why.")
            print(f"ptrain: rank {rank} (pid {child.pid}) exited with code {code} after rank 0 "
                  f"finished{why}", file=sys.stderr, flush=True)
    _children.clear()
    _remove_error_folder()


def _wait_unless_stopped(rank: int, child: subprocess.Popen) -> int:
    """``child``'s exit code once it ends; a child stopped (SIGSTOP) for longer than the rank
    watch's stall timeout after it told the others it was leaving is ended (SIGKILL), so the job
    does not wait for ever on a rank that holds nobody else up."""
    limit = rank_watch.stall_timeout()
    stopped_since = None
    while True:
        try:
            return child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        if limit is None:
            continue
        if rank_watch.process_state(child.pid) != "T":
            stopped_since = None
            continue
        stopped_since = stopped_since or time.monotonic()
        if time.monotonic() - stopped_since > limit:
            print(f"ptrain: rank {rank} (pid {child.pid}) has been stopped for {limit:g} s "
                  f"while the job ends; ending it.", file=sys.stderr, flush=True)
            child.kill()
            return child.wait()


def _remove_error_folder() -> None:
    folder = os.environ.get(ERROR_DIR)
    if folder and os.environ.get(LAUNCHER_PID) == str(os.getpid()):  # the launcher's own
        for path in Path(folder).glob("*"):  # the records, STOPPING
            path.unlink(missing_ok=True)
        try:
            os.rmdir(folder)
        except OSError:
            pass


__all__ = ["end_copies", "first_error", "install_quiet_exit", "is_launcher", "is_started_copy",
           "kill_copies", "record_error", "relaunch_command", "start_copies", "watch_launcher"]
