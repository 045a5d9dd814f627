"""Hung and dead ranks end the whole job (issue 16): a 2-rank job (``tests/_stall_script.py``,
``--ddp-stall-timeout 2``) has one rank stopped (SIGSTOP) or killed (SIGKILL) from outside at a
step; the job must end within a bound, with a message naming the rank and what it was doing,
and leave no process behind (the process table, after the job ended)."""

from __future__ import annotations

import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests._faults import kill_marked, leftovers, stall_job
from tests._campaigns import JOB_MODULES

pytestmark = [pytest.mark.slow, JOB_MODULES]

STALL = 2.0
#: the stall timeout, a heartbeat interval, and a job's error path and exit
BOUND = STALL + 15.0
#: a collective timeout below a stall timeout (whose heartbeat interval is 5 s): the stopped
#: rank's silence when the collective gives up (at least TIMEOUT - 5 s) is past two intervals
TIMEOUT, TIMEOUT_STALL = 16.0, 30.0


def last_step(log: str) -> int:
    """The global step the message says the rank was last at, and where."""
    found = re.search(r"was last training \(epoch \d+, global step (\d+), batch \d+\), in \S+",
                      log)
    assert found, f"no step and function named in:\n{log}"
    return int(found.group(1))


def hurt(out, rank: int, signum: int, launcher: str = "auto", strategy: str = "ddp",
         stall_timeout: float = STALL, timeout: float = 600.0):
    job = stall_job(out, stall_timeout=stall_timeout, launcher=launcher, strategy=strategy,
                    timeout=timeout)
    try:
        job.wait_for_step(0, 10)
        job.wait_for_step(1, 10)
        # a heartbeat (every stall_timeout / 4 s, at most 5 s) has told step 10 or later
        time.sleep(min(stall_timeout / 4, 5.0) + STALL / 2)
        os.kill(job.pid_of(rank), signum)
        took = job.finish(timeout=120)
        left = leftovers(job.mark)
    finally:
        kill_marked(job.mark)
    return job, took, left


CASES = {
    "stop rank 1": dict(rank=1, signum=signal.SIGSTOP),
    "stop rank 0": dict(rank=0, signum=signal.SIGSTOP),
    "kill rank 1": dict(rank=1, signum=signal.SIGKILL),
    "stop rank 1, spawn launcher": dict(rank=1, signum=signal.SIGSTOP, launcher="spawn"),
    "stop rank 1, fsdp": dict(rank=1, signum=signal.SIGSTOP, strategy="fsdp"),
    # the collective timeout ends the job before the stall timeout would
    "stop rank 1, collective timeout": dict(rank=1, signum=signal.SIGSTOP,
                                            stall_timeout=TIMEOUT_STALL, timeout=TIMEOUT),
}


@pytest.fixture(scope="module")
def hurt_jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rank-watch")
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(hurt, root / name.replace(" ", "-").replace(",", ""),
                                     **case)
                   for name, case in CASES.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", ["stop rank 1", "stop rank 1, spawn launcher",
                                  "stop rank 1, fsdp"])
def test_a_stopped_rank_ends_the_job_naming_it_and_its_step(hurt_jobs, name):
    job, took, left = hurt_jobs[name]
    log = job.output()
    assert job.proc.returncode == 1, log
    assert took < BOUND, f"the job took {took:.1f} s to end:\n{log}"
    assert "rank 1 (pid" in log and "stopped responding" in log, log
    assert log.count("stopped responding") == 1, log  # said once, as the job's error
    assert last_step(log) >= 10, log  # what it was doing when it was stopped, not before
    assert "stall-timeout 2 seconds" in log, log
    assert not left, f"processes left running: {left}\n{log}"


def test_a_stopped_rank_zero_is_ended_by_the_others(hurt_jobs):
    job, took, left = hurt_jobs["stop rank 0"]
    log = job.output()
    # rank 0 is the command the user ran: the watch of rank 1 ends it with SIGKILL
    assert job.proc.returncode == -signal.SIGKILL, log
    assert took < BOUND, f"the job took {took:.1f} s to end:\n{log}"
    assert "rank 1: rank 0 (pid" in log and log.count("stopped responding") == 1, log
    assert not left, f"processes left running: {left}\n{log}"


def test_a_killed_rank_ends_the_job_at_once_naming_what_it_was_doing(hurt_jobs):
    job, took, left = hurt_jobs["kill rank 1"]
    log = job.output()
    assert job.proc.returncode == 1, log
    assert took < BOUND, f"the job took {took:.1f} s to end:\n{log}"
    # named with its exit status, also when rank 0's watch found the process gone first
    assert "rank 1 was killed by SIGKILL" in log, log
    assert "It was last training (epoch 0, global step" in log, log
    assert last_step(log) >= 10, log
    # how old that position is is said: heartbeats come every stall_timeout / 4 (0.5 s here)
    age = re.search(r"its last heartbeat, sent (\d+\.\d) s before this", log)
    assert age is not None and float(age.group(1)) < STALL * 5, log
    assert not left, f"processes left running: {left}\n{log}"


def test_a_collective_timeout_names_the_rank_that_stopped(hurt_jobs):
    job, took, left = hurt_jobs["stop rank 1, collective timeout"]
    log = job.output()
    assert job.proc.returncode == 1, log
    assert took < TIMEOUT + 15.0, f"the job took {took:.1f} s to end:\n{log}"
    assert "a collective waited 16 seconds (--ddp-timeout)" in log, log
    assert "rank 1 (pid" in log and "had sent no heartbeat for" in log, log
    assert last_step(log) >= 10, log
    assert "Timed out waiting" not in log, log  # ptrain's paragraph, not gloo's error
    assert not left, f"processes left running: {left}\n{log}"


def test_a_rank_killed_early_ends_the_job_promptly_without_a_stale_step(tmp_path):
    """The default stall timeout (300 s: a heartbeat every 5 s), rank 1 killed at its third
    step, before its first heartbeat after the one written as its watch started. Before, rank 0
    learned which rank was gone only from its next read of the heartbeats (up to 5 s; 4 to 11 s
    in all), and said it was "last training (epoch 0, global step 0, batch 0), in
    where_main_thread_is": its watch's first beat, written before any step, describing itself."""
    job = stall_job(tmp_path, stall_timeout=300.0)
    try:
        job.wait_for_step(1, 3)
        os.kill(job.pid_of(1), signal.SIGKILL)
        took = job.finish(timeout=120)
        left = leftovers(job.mark)
    finally:
        kill_marked(job.mark)
    log = job.output()
    assert job.proc.returncode == 1, log
    assert "rank 1 was killed by SIGKILL" in log, log
    assert took < 4.0, f"the job took {took:.1f} s to end:\n{log}"
    # it told no step since its watch started: none is named (a step it is known to have
    # reached would be, with its heartbeat's age)
    assert "global step 0," not in log and "where_main_thread_is" not in log, log
    assert not left, f"processes left running: {left}\n{log}"
