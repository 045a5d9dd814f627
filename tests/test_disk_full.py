"""A checkpoint write the system refuses (issue 16): on a real small filesystem made full while
``ptrain fit`` runs (a tmpfs mounted by the test where it may, else a file-size limit set on the
job's processes), the run stops with a clear error or, with ``--checkpoint-on-write-error warn``,
trains on; the previous checkpoint stays intact and readable and no partial file is left. One
process, 2 ``ddp`` ranks and 2 ``fsdp`` ranks (sharded folders), and a rank killed in the middle
of a sharded write."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ptrain import CheckpointWriteError
from ptrain.checkpoint_io import atomic_save, safe_load
from tests._faults import (SmallDisk, kill_marked, leftovers, marked_pids, start_job,
                           unwritable_folder)
from tests._campaigns import JOB_MODULES
from tests.conftest import REPO

pytestmark = [pytest.mark.slow, JOB_MODULES]

EVERY = 50  # a checkpoint every EVERY steps: the disk is filled after the first


def fit_argv(root: Path, *extra: str, every: int = EVERY, steps: int = 6 * EVERY) -> list[str]:
    return [sys.executable, "-m", "ptrain", "fit", "--model", "tests._stall_script:Slow",
            "--accelerator", "cpu", "--max-steps", str(steps),
            "--checkpoint-every-n-train-steps", str(every), "-p", "no:tensorboard",
            "-p", "no:progress-bar", "-p", "no:model-summary", "--default-root-dir", str(root),
            *extra]


def last_of(root: Path) -> Path:
    return root / "version_0" / "checkpoints" / "last.ckpt"


def step_of(last: Path) -> int:
    """The global step a (single-file or sharded) checkpoint was written at; reading it proves
    it intact."""
    meta = last / "meta.pt" if last.is_dir() else last
    return safe_load(meta)["loop"]["global_step"]


def partial_files(root: Path) -> list[str]:
    return [str(p) for p in root.rglob(".*") if p.name.endswith((".tmp", ".old"))]


def fill_during_run(disk: SmallDisk, name: str, *extra: str):
    root = disk.path / name
    job = start_job(fit_argv(root, *extra), disk.path.parent / f"{name}-out")
    try:
        deadline = time.monotonic() + 180
        while not (last_of(root) / "meta.pt").exists() and not last_of(root).is_file():
            assert job.proc.poll() is None, f"the run ended early:\n{job.output()}"
            assert time.monotonic() < deadline, job.output()
            time.sleep(0.02)
        disk.fill(job.mark)
        job.finish(timeout=180)
        left = leftovers(job.mark)
    finally:
        kill_marked(job.mark)
    return job, root, left


@pytest.fixture(scope="module")
def full_disk_runs(tmp_path_factory):
    disk = SmallDisk(tmp_path_factory.mktemp("small-disk") / "disk")
    cases = {
        "stop": (),
        "warn": ("--checkpoint-on-write-error", "warn"),
        "ddp": ("--strategy", "ddp", "--devices", "2"),
        "fsdp": ("--strategy", "fsdp", "--devices", "2"),
    }
    runs = {}
    try:
        for name, extra in cases.items():  # one at a time, each with room again at its start
            (disk.path / "filler").unlink(missing_ok=True)
            runs[name] = fill_during_run(disk, name, *extra)
        yield disk, runs
    finally:
        disk.close()


@pytest.mark.parametrize("name", ["stop", "ddp", "fsdp"])
def test_a_refused_checkpoint_write_stops_the_run_and_keeps_the_last_one(full_disk_runs, name):
    disk, runs = full_disk_runs
    job, root, left = runs[name]
    log = job.output()
    assert job.proc.returncode == 2, log
    assert "Traceback" not in log, log
    # ddp (rank 0 writes) names the rank that could not write, whichever rank's error the
    # launcher reports; fsdp's sharded write is refused alike on every rank
    rank = r"rank 0: " if name == "ddp" else ""
    assert re.search(f"ptrain: error: {rank}could not write checkpoint", log), log
    assert f"({disk.refusal()})" in log, log
    assert "the previous last.ckpt there is intact" in log, log
    assert "--checkpoint-on-write-error warn" in log, log
    assert step_of(last_of(root)) == EVERY  # the checkpoint before the disk was full
    assert not partial_files(root)
    assert not left, f"processes left running: {left}"


def test_the_advice_to_resume_elsewhere_works_as_printed(full_disk_runs, tmp_path):
    """The refusal's advice, followed literally: the run resumes from the named checkpoint into
    a new run folder under the new root, and nothing is written to the full disk."""
    disk, runs = full_disk_runs
    job, root, _ = runs["stop"]
    advice = re.search(r"--default-root-dir NEW --ckpt-path '([^']+)'", job.output())
    assert advice, job.output()
    assert Path(advice.group(1)) == last_of(root)
    new_root = tmp_path / "elsewhere"
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    argv = fit_argv(new_root, "--ckpt-path", advice.group(1), steps=EVERY + 10)
    resumed = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr
    assert step_of(last_of(new_root)) == EVERY + 10
    origin = json.loads((new_root / "version_0" / "resumed_from.json").read_text())
    assert Path(origin["checkpoint"]) == last_of(root).resolve(), origin
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    assert step_of(last_of(root)) == EVERY


def test_with_warn_the_run_trains_on_and_keeps_the_last_checkpoint(full_disk_runs):
    disk, runs = full_disk_runs
    job, root, left = runs["warn"]
    log = job.output()
    assert job.proc.returncode == 0, log
    warnings = [line for line in log.splitlines() if "could not write checkpoint" in line]
    # every later checkpoint was refused: said once, then counted at the end of fit
    assert len(warnings) == 1 and warnings[0].startswith("ptrain: warning:"), log
    assert "Training goes on" in warnings[0], log
    counted = re.search(r"^ptrain: warning: checkpoint: (\d+) writes refused since the last "
                        r"complete one \(the first is said above\); the newest complete "
                        r"checkpoint is '(.+)'\.$", log, re.MULTILINE)
    assert counted and int(counted.group(1)) >= 4, log
    assert Path(counted.group(2)) == last_of(root)
    assert step_of(last_of(root)) == EVERY
    assert not partial_files(root)


def test_atomic_save_on_a_full_disk_keeps_the_old_file_and_names_the_reason(tmp_path):
    disk = SmallDisk(tmp_path / "disk", size=1 << 20)
    try:
        if disk.kind != "tmpfs":
            pytest.skip("mounting a tmpfs is not permitted here; the file-size limit runs are "
                        "the other tests of this module")
        path = disk.path / "last.ckpt"
        atomic_save({"x": torch.arange(10)}, path)
        with pytest.raises(CheckpointWriteError) as refused:
            atomic_save({"x": torch.zeros(1 << 20)}, path)  # 8 MiB on a 1 MiB disk
        assert "No space left on device (ENOSPC)" in str(refused.value)
        assert torch.equal(torch.load(path, weights_only=True)["x"], torch.arange(10))
        assert sorted(p.name for p in disk.path.iterdir()) == ["last.ckpt"]
    finally:
        disk.close()


def test_a_refused_folder_names_the_fix(tmp_path):
    with unwritable_folder(tmp_path / "read-only") as refusal:
        if refusal is None:
            pytest.skip("this user writes anywhere and may not mount a read-only filesystem")
        with pytest.raises(CheckpointWriteError) as refused:
            atomic_save({"x": torch.ones(1)}, tmp_path / "read-only" / "sub" / "last.ckpt")
    fix = {"EROFS": "the filesystem is read-only", "EACCES": "make the folder writable"}[refusal]
    assert f"({refusal})" in str(refused.value) and fix in str(refused.value)


def test_a_rank_killed_during_a_sharded_write_leaves_the_previous_checkpoint(tmp_path):
    root = tmp_path / "runs"
    sharded = ("--strategy", "fsdp", "--devices", "2")
    job = start_job(fit_argv(root, *sharded, every=1, steps=60), tmp_path / "out")
    tmp = last_of(root).with_name(".last.ckpt.tmp")
    try:
        deadline = time.monotonic() + 180
        while not (last_of(root) / "meta.pt").exists():  # a first complete checkpoint
            assert job.proc.poll() is None and time.monotonic() < deadline, job.output()
            time.sleep(0.01)
        while not any(tmp.glob("*.distcp")):  # a write in progress: shards, no swap yet
            assert job.proc.poll() is None and time.monotonic() < deadline, job.output()
            time.sleep(0.001)
        os.kill(int(_rank_pid(job.mark, rank=1)), signal.SIGKILL)
        job.finish(timeout=120)
        left = leftovers(job.mark)
    finally:
        kill_marked(job.mark)
    assert job.proc.returncode == 1, job.output()
    assert "rank 1 was killed by SIGKILL" in job.output(), job.output()
    assert not left
    saved = step_of(last_of(root))  # intact and readable
    assert 0 < saved < 60
    resumed = start_job(fit_argv(root, *sharded, "--ckpt-path", "last", every=1, steps=60),
                        tmp_path / "resumed")
    resumed.finish(timeout=300)
    assert resumed.proc.returncode == 0, resumed.output()
    assert step_of(last_of(root)) == 60
    assert not tmp.exists()  # the next write removed the killed one's folder


def test_a_refused_meta_pt_is_said_of_the_sharded_checkpoint_whose_previous_one_is_kept(
        tmp_path):
    """A sharded folder's meta.pt (everything but the shards: here a large hyperparameter)
    refused once the shards are written: the error names the checkpoint, whose previous folder
    is intact, and says to resume from it (it named the temporary folder's meta.pt and said no
    checkpoint of the run had been written: train again from the start)."""
    root = tmp_path / "runs"
    argv = [sys.executable, "-m", "ptrain", "fit", "--model",
            "tests._ckpt_models:MetaHeavyRegressor", "--accelerator", "cpu", "--max-epochs",
            "50", "--strategy", "fsdp", "--devices", "2", "--checkpoint-every-n-train-steps",
            "20", "--checkpoint-async-save", "-p", "no:tensorboard", "-p", "no:progress-bar",
            "-p", "no:model-summary", "--default-root-dir", str(root)]
    job = start_job(argv, tmp_path / "out")
    try:
        deadline = time.monotonic() + 180
        while not (last_of(root) / "meta.pt").exists():  # a first complete checkpoint
            assert job.proc.poll() is None and time.monotonic() < deadline, job.output()
            time.sleep(0.02)
        for pid in marked_pids(job.mark):  # the shards are KBs, meta.pt 2 MB
            subprocess.run(["prlimit", "--pid", str(pid), f"--fsize={1 << 20}"], check=True)
        job.finish(timeout=180)
        left = leftovers(job.mark)
    finally:
        kill_marked(job.mark)
    log = job.output()
    assert job.proc.returncode == 2, log
    assert f"could not write checkpoint '{last_of(root)}': File too large (EFBIG)" in log, log
    assert "the previous last.ckpt there is intact" in log, log
    assert f"then resume with --ckpt-path '{last_of(root)}'" in log, log
    assert "meta.pt" not in log and "train again" not in log, log
    assert step_of(last_of(root)) > 0  # intact and readable
    assert not partial_files(root)
    assert not left, f"processes left running: {left}"


def _rank_pid(mark: str, rank: int) -> int:
    """The process of the job marked ``mark`` whose RANK is ``rank``."""
    from tests._faults import marked_pids

    for pid in marked_pids(mark):
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return pid
    raise AssertionError(f"no process of rank {rank}")
