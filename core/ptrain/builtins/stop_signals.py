"""The ``stop-signals`` callback: a run told to stop (SIGTERM from a scheduler, SLURM's signal
before the time limit, a spot instance's notice, Ctrl-C) saves where it is and can be resumed.

On one of ``signals`` (default SIGTERM, SIGINT, SIGUSR1) during ``fit``, every rank finishes its
current optimizer step; the ranks agree on the step to stop after, every rank takes part in
writing a resumable ``last.ckpt`` (as the periodic checkpoints are, so a resumed run ends as one
never interrupted), rank 0 says where it is, and ``fit`` raises :class:`ptrain.Interrupted`, a
``SystemExit`` that ends the program with ``128 + signal number`` (143 for SIGTERM, 130 for
SIGINT, 138 for SIGUSR1) unless caught by name, as the CLI exits. A second signal
stops at once: SIGINT as ``KeyboardInterrupt``, another with the signal's default action. Where
the main thread can't take it within a second (blocked in a collective a peer never joins: Python
runs a handler only between bytecodes), a thread ends the process instead, with one line on
stderr and exit code ``128 + signal number``; it learns of the signals from the C-level handler
through a wakeup file descriptor (:func:`signal.set_wakeup_fd`), so it costs nothing per step. A
signal that arrives after the last step boundary is passed on when ``fit`` ends (its handler
before ``fit``, e.g. the default: the process ends), the run being complete.

How the ranks agree without a host sync on the device: at every optimizer-step boundary each
rank waits for the 1-element all-reduce (max) it posted at the previous boundary, on a gloo group
of its own over a CPU tensor, and posts the next one with whether it was signalled. Every rank
reads the same value at the same boundary, so all stop together, one step after the first rank
was signalled (the signal may reach one rank only: ``kill -TERM`` of rank 0).

Under SLURM (``SLURM_JOB_ID`` set), ``requeue`` runs ``requeue_command`` (default
``scontrol requeue {job_id}``) on rank 0 after the checkpoint is written, as Lightning's SLURM
plugin does, so the job comes back and resumes with ``--ckpt-path last``.

A background checkpoint write still in flight is finished first. Where it failed and its error
would stop the run (a user's own ``save_checkpoint(..., asynchronous=True)`` that nothing
waited on, or a periodic checkpoint under the ``stop`` write-error policy), ``last.ckpt`` is
still written, and then that error is raised instead of ``Interrupted`` (no requeue: the run
failed). If the stop's own save fails too, its error is raised, chained to the earlier one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any

import torch

from ptrain.errors import Interrupted
from ptrain.hookspecs import hookimpl
from ptrain.options import to_bool, to_str_list

DEFAULT_SIGNALS = ["SIGTERM", "SIGINT", "SIGUSR1"]
#: How long a second signal waits for the main thread's handler before a thread ends the process.
BLOCKED_GRACE = 1.0


def _signal_names(value: Any) -> list[str]:
    names = to_str_list(value)
    for name in names:
        full = name if name.upper().startswith("SIG") else f"SIG{name}"
        if not isinstance(getattr(signal, full.upper(), None), signal.Signals):
            raise ValueError(f"{name!r} is not a signal this system has (e.g. SIGTERM, SIGINT, "
                             f"SIGUSR1, SIGUSR2)")
    return [(n if n.upper().startswith("SIG") else f"SIG{n}").upper() for n in names]


class StopSignals:
    """``-p stop-signals`` (on by default): save and stop on a signal; see the module docstring."""

    def __init__(self, signals: list[str] | None = None, requeue: bool = False,
                 requeue_command: str = "scontrol requeue {job_id}"):
        self.signals = [signal.Signals[name] for name in _signal_names(
            DEFAULT_SIGNALS if signals is None else signals)]
        self.requeue, self.requeue_command = requeue, requeue_command
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._group = None
        self._posted: tuple[Any, torch.Tensor] | None = None
        self._wakeup: tuple[int, int] | None = None  # (our pipe's write end, the previous fd)
        self._watcher: threading.Thread | None = None  # reads the pipe while a fit runs
        self._second_taken = threading.Event()  # the main thread's handler took a second signal

    def __getstate__(self) -> dict[str, Any]:
        """A copy (``copy.deepcopy`` of a trainer, pickling) keeps the settings and what was
        received, not this process's handlers, pipe, process group and thread event: it starts
        as a callback that has not set up yet."""
        state = dict(self.__dict__)
        state.update(_previous={}, _group=None, _posted=None, _wakeup=None, _watcher=None,
                     _second_taken=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _second_taken=threading.Event())

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("signals", _signal_names, default=list(DEFAULT_SIGNALS),
                    help="the signals that make fit save a resumable checkpoint and stop "
                         "(a second one stops at once)")
        options.add("requeue", to_bool, default=False,
                    help="under SLURM, requeue the job after saving (it resumes with "
                         "--ckpt-path last)")
        options.add("requeue_command", str, default="scontrol requeue {job_id}",
                    help="the command that requeues the job; {job_id} is SLURM_JOB_ID")

    # -- set-up ----------------------------------------------------------------------------------

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        if stage != "fit":
            return
        self.received = None
        if self.requeue and "SLURM_JOB_ID" not in os.environ and trainer.is_global_zero:
            print("ptrain: stop-signals: requeue is on, but this is not a SLURM job "
                  "(no SLURM_JOB_ID): a signal will save and stop without requeueing.",
                  file=sys.stderr, flush=True)
        self._restore()  # a fit that ended without its teardown left its handlers
        if threading.current_thread() is not threading.main_thread():
            if trainer.is_global_zero:
                print("ptrain: stop-signals: fit runs outside the main thread, where Python "
                      "can't handle signals; a signal will stop this run without saving.",
                      file=sys.stderr, flush=True)
        else:
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self._on_signal)
            self._watch_while_blocked()
        if trainer.world_size > 1 and self._group is None:  # once per job: later stages reuse it
            import torch.distributed as dist

            self._group = dist.new_group(backend="gloo")  # CPU flags, whatever the main backend
        self._posted = None

    def _watch_while_blocked(self) -> None:
        """Start the thread that ends the process on a second signal the main thread can't
        take (see the module docstring). The C-level handler writes each signal's number to the
        wakeup fd whatever the main thread does; a wakeup fd set before (asyncio's) still gets
        every byte."""
        self._second_taken.clear()
        if not hasattr(os, "register_at_fork"):  # Windows: its wakeup fd must be a socket
            return
        global _pipe
        read, write = _pipe = os.pipe()
        os.set_blocking(write, False)  # set_wakeup_fd needs it: a signal handler never blocks
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._wakeup = (write, previous)
        ours = {int(s) for s in self.signals}

        def watch() -> None:
            count = 0
            with open(read, "rb", buffering=0) as pipe:
                while data := pipe.read(64):  # empty once _restore closed the write end
                    if previous != -1:
                        try:
                            os.write(previous, data)
                        except OSError:
                            pass
                    for signum in (b for b in data if b in ours):
                        count += 1
                        if count >= 2 and not self._second_taken.wait(BLOCKED_GRACE):
                            _exit_now(signum)

        self._watcher = threading.Thread(target=watch, name="ptrain-stop-signals", daemon=True)
        self._watcher.start()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)  # acted on at the next step boundary
            return
        self._second_taken.set()
        self._restore()  # the second signal: stop at once
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)

    @hookimpl(trylast=True)  # after the other plugins' teardown (loggers flush there)
    def teardown(self, trainer, stage: str) -> None:
        if stage != "fit":
            return
        self._restore()
        if self._posted is not None and trainer.exception is None:
            self._posted[0].wait()  # every rank posted as many; none is left in a collective
        self._posted = None
        if self.received is not None and trainer.exception is None:
            # it came after the last step boundary: fit is complete and saved; the signal is
            # passed on to what handled it before, rather than swallowed
            print(f"ptrain: {self.received.name} arrived after the last training step; the run "
                  f"is complete. Passing the signal on.", file=sys.stderr, flush=True)
            received, self.received = self.received, None
            os.kill(os.getpid(), received)

    def _restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}
        if self._wakeup is not None:
            global _pipe
            write, previous_fd = self._wakeup
            signal.set_wakeup_fd(previous_fd)
            os.close(write)  # the watching thread reads the end of its pipe and ends
            self._wakeup = _pipe = None
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher is not threading.current_thread():
            # a fit leaves no thread of its own behind; the join is at once (it has read the
            # end), and bounded, should a signal handler further up be holding it
            watcher.join(timeout=BLOCKED_GRACE)

    # -- each step -----------------------------------------------------------------------------

    @hookimpl
    def on_train_batch_end(self, trainer, batch, batch_idx, loss) -> None:
        if not trainer.sync_gradients:  # inside an accumulation window: no step boundary
            return
        if self._group is None:
            stop = self.received is not None
        else:
            stop = self._exchange()
        if stop:
            self._stop(trainer)

    def _exchange(self) -> bool:
        """Whether the ranks agreed to stop (the reduction posted at the previous boundary), and
        this boundary's flag posted: the number of the signal this rank received, or 0."""
        import torch.distributed as dist

        agreed = 0
        if self._posted is not None:
            work, flag = self._posted
            work.wait()
            agreed = int(flag.item())  # a CPU tensor: no device sync
        mine = torch.tensor([0 if self.received is None else int(self.received)])
        self._posted = (dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=self._group,
                                        async_op=True), mine)
        if agreed and self.received is None:  # another rank was signalled
            self.received = signal.Signals(agreed)
        return bool(agreed)

    def _stop(self, trainer) -> None:
        if self._posted is not None:
            self._posted[0].wait()  # the one posted just now: every rank posted it
            self._posted = None
        received = self.received or signal.SIGTERM
        path = trainer.last_checkpoint_path
        try:
            # a background write in flight that failed (a user's own save, to another disk
            # perhaps) must not cost the run its stop checkpoint: its error comes after it
            trainer.finish_checkpoint_write()
        except Exception:  # every rank alike: the ranks agree on write errors
            trainer.save_checkpoint(path)  # its own refusal is raised from the earlier one
            if trainer.is_global_zero and not trainer.fast_dev_run:
                print(f"ptrain: {received.name}: the run was saved to {path} at step "
                      f"{trainer.global_step} (resume it with --ckpt-path last); an earlier "
                      f"checkpoint write had failed, and its error stops the run.",
                      file=sys.stderr, flush=True)
            raise
        trainer.save_checkpoint(path)
        written = None if trainer.fast_dev_run else str(path)
        if written and self.requeue and trainer.is_global_zero and "SLURM_JOB_ID" in os.environ:
            self._requeue(os.environ["SLURM_JOB_ID"])
        stop = Interrupted(received.name, int(received), trainer.global_step, written)
        if trainer.is_global_zero:  # said here: uncaught, a SystemExit ends the program silently
            print(f"ptrain: {stop}", file=sys.stderr, flush=True)
        raise stop

    def _requeue(self, job_id: str) -> None:
        import shlex  # here: only a requeue needs it

        command = [part.format(job_id=job_id) for part in shlex.split(self.requeue_command)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"ptrain: stop-signals: requeueing failed ({' '.join(command)}: {exc}); "
                  f"requeue the job yourself.", file=sys.stderr, flush=True)
            return
        if done.returncode != 0:
            print(f"ptrain: stop-signals: requeueing failed ({' '.join(command)} exited with "
                  f"{done.returncode}: {done.stderr.strip()}); requeue the job yourself.",
                  file=sys.stderr, flush=True)
        else:
            print(f"ptrain: requeued SLURM job {job_id}.", file=sys.stderr, flush=True)


#: The wakeup pipe (read end, write end) while a fit watches for a blocked second signal.
_pipe: tuple[int, int] | None = None


def _forget_pipe() -> None:
    """In a process forked during fit (a DataLoader worker): the signals it gets are its own,
    not the training process's to count, and its copy of the pipe must not keep the pipe open."""
    global _pipe
    if _pipe is None:
        return
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # the pipe stays open (its fds never reused) where it can't be unset
        return
    for fd in _pipe:
        try:
            os.close(fd)
        except OSError:
            pass
    _pipe = None


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere no pipe is made (no fork either)
    os.register_at_fork(after_in_child=_forget_pipe)


def _exit_now(signum: int) -> None:
    """End this process at once for a second ``signum`` its main thread could not take: the
    ranks it started (the script launcher's) are killed first, as it runs no exit handlers."""
    from ptrain import script_launch

    if not script_launch.stopped_by_launcher():  # rank 0 reports why it stops the job
        name = signal.Signals(signum).name
        rank = f"rank {os.environ['RANK']}: " if "RANK" in os.environ else ""
        print(f"ptrain: {rank}a second {name} while the main thread was blocked (in a "
              f"collective another rank has not joined?): stopping now, without saving.",
              file=sys.stderr, flush=True)
    script_launch.kill_copies()
    os._exit(128 + signum)


__all__ = ["StopSignals"]
