"""Run folders cannot collide (issue 21): each run reserves its ``version_N`` by creating it, one
``fit`` at a time writes a run's checkpoints (a lock a dead process does not keep), and a root
that can't be written is refused before anything trains. Real ``ptrain fit`` processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ptrain import ConfigError
from ptrain.run_folder import RunLock, reserve
from tests._cli_util import assert_ok, assert_usage_error
from tests._faults import kill_marked, start_job, unwritable_folder
from conftest import run_cli

pytestmark = pytest.mark.slow

TINY = ["--model", "tests.conftest:TinyRegressor", "--accelerator", "cpu", "--max-epochs", "2",
        "-p", "no:progress-bar"]


def slow_fit(root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ptrain", "fit", "--model", "tests._stall_script:Slow",
            "--accelerator", "cpu", "--max-steps", "3000", "--checkpoint-every-n-train-steps",
            "20", "-p", "no:progress-bar", "-p", "no:tensorboard", "--default-root-dir",
            str(root), *extra]


def test_two_runs_started_at_once_on_one_root_get_their_own_folders(tmp_path):
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: run_cli("fit", *TINY, "--default-root-dir",
                                                  str(tmp_path)), range(2)))
    for result in results:
        assert_ok(result)
    runs = sorted(p.name for p in tmp_path.iterdir())
    assert runs == ["version_0", "version_1"]
    for run in runs:
        assert (tmp_path / run / "checkpoints" / "last.ckpt").is_file()


def test_reserve_gives_each_caller_its_own_folder(tmp_path):
    with ThreadPoolExecutor(8) as pool:
        folders = list(pool.map(lambda _: reserve(tmp_path / "runs"), range(32)))
    assert len(set(folders)) == 32 and all(f.is_dir() for f in folders)


def test_a_second_writer_of_a_run_is_refused_and_a_dead_one_keeps_nothing(tmp_path):
    root = tmp_path / "runs"
    first = start_job(slow_fit(root), tmp_path / "first")
    last = root / "version_0" / "checkpoints" / "last.ckpt"
    try:
        deadline = time.monotonic() + 120
        while not last.exists():
            assert first.proc.poll() is None and time.monotonic() < deadline, first.output()
            time.sleep(0.05)
        second = run_cli(*slow_fit(root, "--ckpt-path", "last")[3:])
        message = assert_usage_error(second, "is being written by another ptrain process",
                                     f"pid {first.proc.pid}", "version_0")
        assert message.count("\n") == 1, message
        os.kill(first.proc.pid, signal.SIGKILL)  # dies holding the lock
        first.proc.wait()
    finally:
        kill_marked(first.mark)
    resumed = start_job(slow_fit(root, "--ckpt-path", "last", "--max-steps", "60"),
                        tmp_path / "resumed")
    resumed.finish(timeout=300)
    assert resumed.proc.returncode == 0, resumed.output()


#: a checkpoint write that never ends: its file is pickled into the temporary file until the
#: process is killed, as a preempted machine kills a long write
STUCK_WRITE = """
import sys, time, torch
from ptrain.checkpoint_io import atomic_save
class Stuck:
    def __reduce__(self):
        time.sleep(600)
atomic_save({"model": torch.zeros(1 << 16), "stuck": Stuck()}, sys.argv[1])
"""


def test_what_killed_writes_left_in_a_run_is_removed_when_it_resumes(tmp_path):
    root = tmp_path / "runs"
    assert_ok(run_cli("fit", *TINY, "--default-root-dir", str(root)))
    folder = root / "version_0" / "checkpoints"
    before = (folder / "last.ckpt").read_bytes()
    writer = subprocess.Popen([sys.executable, "-c", STUCK_WRITE, str(folder / "last.ckpt")])
    try:
        deadline = time.monotonic() + 120
        while not list(folder.glob(".last.ckpt.*.tmp")):  # the write is under way
            assert writer.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        writer.kill()
        writer.wait()
    (folder / ".epoch=1-step=16.ckpt.tmp").mkdir()  # a sharded folder's, as fsdp leaves it
    (folder / ".epoch=1-step=16.ckpt.tmp" / "__0_0.distcp").write_bytes(b"partial")
    left = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    assert len(left) == 2 and (folder / "last.ckpt").read_bytes() == before, left
    assert_ok(run_cli("fit", *TINY, "--max-epochs", "3", "--default-root-dir", str(root),
                      "--ckpt-path", "last"))
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]


def test_the_lock_names_its_holder_in_process(tmp_path):
    run = reserve(tmp_path)
    held = RunLock.acquire(run)
    try:
        # flock locks belong to the open file: a second open in this process is refused too
        with pytest.raises(ConfigError, match=f"pid {os.getpid()}"):
            RunLock.acquire(run)
    finally:
        held.release()
    RunLock.acquire(run).release()  # free again


def test_a_root_that_cant_be_written_is_refused_before_training(tmp_path):
    root = tmp_path / "read-only"
    with unwritable_folder(root) as refusal:
        if refusal is None:
            pytest.skip("this user writes anywhere and may not mount a read-only filesystem")
        result = run_cli("fit", *TINY, "--default-root-dir", str(root / "runs"))
    message = assert_usage_error(result, "can't be created under", str(root / "runs"),
                                 f"({refusal})", "--default-root-dir", "Nothing was trained")
    assert message.count("\n") == 1, message
    assert "Epoch" not in result.stdout and "Model summary" not in result.stdout
