"""Running a job and hurting it from outside, as a scheduler or a failing machine would: shared
by the fault tests and ``benchmarks/faults.py``.

A job is started with a marker in its environment, which every process it starts inherits;
:func:`leftovers` finds any of them still running after the job ended (the process table, read
from ``/proc``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARK = "PTRAIN_FAULT_TEST_MARK"


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the variables of a launcher (ranks, rendezvous, seed)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", "PTRAIN_GLOBAL_SEED", "PTRAIN_LAUNCHER_PID",
                        "PTRAIN_ERROR_DIR")
           and not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.update(extra)
    return env


@dataclass
class Job:
    """A running job: its process, its output folder and its marker."""

    proc: subprocess.Popen
    out: Path
    mark: str
    started: float

    def wait_for_files(self, names: list[str], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not all((self.out / n).exists() for n in names):
            if self.proc.poll() is not None:
                raise AssertionError(f"the job ended (exit {self.proc.returncode}) before "
                                     f"writing {names}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {names} after {timeout} s:\n{self.output()}")
            time.sleep(0.05)

    def wait_for_step(self, rank: int, step: int, timeout: float = 120) -> None:
        """Wait until ``rank`` has written (``out/rank<r>.step``) a global step >= ``step``."""
        path = self.out / f"rank{rank}.step"
        deadline = time.monotonic() + timeout
        while True:
            try:
                if int(path.read_text() or -1) >= step:
                    return
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None:
                raise AssertionError(f"the job ended (exit {self.proc.returncode}) before rank "
                                     f"{rank} reached step {step}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"rank {rank} not at step {step} after {timeout} s:\n"
                                     f"{self.output()}")
            time.sleep(0.05)

    def pid_of(self, rank: int) -> int:
        return int((self.out / f"rank{rank}.pid").read_text())

    def finish(self, timeout: float) -> float:
        """Wait for the job's first process to end; the seconds it took, or raise after
        ``timeout`` (the job is killed then)."""
        start = time.monotonic()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_marked(self.mark)
            self.proc.wait()
            raise AssertionError(f"the job was still running {timeout} s later:\n"
                                 f"{self.output()}") from None
        return time.monotonic() - start

    def output(self) -> str:
        log = self.out / "job.log"
        return log.read_text(errors="replace") if log.exists() else ""


def start_job(argv: list[str], out: Path, cwd: Path = REPO) -> Job:
    """Start ``argv`` with its output (both streams) in ``out/job.log``."""
    out.mkdir(parents=True, exist_ok=True)
    mark = uuid.uuid4().hex
    with open(out / "job.log", "wb") as log:
        proc = subprocess.Popen(argv, cwd=cwd, env=clean_env(**{MARK: mark}), stdout=log,
                                stderr=subprocess.STDOUT)
    return Job(proc, out, mark, time.monotonic())


def marked_pids(mark: str) -> list[int]:
    """The processes whose environment holds ``mark``."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def leftovers(mark: str, settle: float = 10.0) -> list[int]:
    """The job's processes still running ``settle`` seconds after its first one ended (they
    get that long to notice and stop)."""
    deadline = time.monotonic() + settle
    while (pids := marked_pids(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pids


def kill_marked(mark: str) -> None:
    for pid in marked_pids(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class SmallDisk:
    """A real filesystem that can be made full while a job writes to it: a tmpfs of ``size``
    bytes mounted at ``path`` where this process may mount one (root), else a plain folder
    whose writers get a file-size limit (``RLIMIT_FSIZE``, set on the running job's processes
    with ``prlimit``), so that a checkpoint write fails with EFBIG instead of ENOSPC."""

    def __init__(self, path: Path, size: int = 8 << 20):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                  str(path)], capture_output=True)
        self.kind = "tmpfs" if mounted.returncode == 0 else "file-size limit"

    def fill(self, mark: str) -> None:
        """Leave no room for another checkpoint for the job marked ``mark``."""
        if self.kind == "tmpfs":
            fill_tmpfs(self.path)
            return
        import resource

        for pid in marked_pids(mark):
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (1024, 1024))

    def refusal(self) -> str:
        """How the system words the refusal this disk gives."""
        return "ENOSPC" if self.kind == "tmpfs" else "EFBIG"

    def close(self) -> None:
        if self.kind == "tmpfs":
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def fill_tmpfs(path: Path) -> None:
    """Fill the tmpfs at ``path`` with a file of zeros until it refuses more. A file written to
    before may still grow into the rest of its last page (4 KiB)."""
    with open(path / "filler", "ab") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError:
            pass


@contextlib.contextmanager
def unwritable_folder(path: Path):
    """``path``, made a folder nobody may write in: a read-only tmpfs mounted there where this
    process may mount one (root, whom a folder's permissions do not stop), else a folder without
    write permission. Yields the system's word for the refusal (EROFS or EACCES), or ``None``
    where neither stops this user."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
                             capture_output=True).returncode == 0
    if not mounted:
        path.chmod(0o500)
    try:
        yield "EROFS" if mounted else None if os.access(path, os.W_OK) else "EACCES"
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
        else:
            path.chmod(0o700)


def stall_job(out: Path, *, strategy: str = "ddp", stall_timeout: float = 2.0,
              launcher: str = "auto", timeout: float = 600.0,
              block_at: int | None = None) -> Job:
    """``tests/_stall_script.py``: 2 ranks training slowly until stopped from outside;
    ``timeout`` is the strategy's collective timeout; ``block_at``: the step at which rank 0
    blocks in a barrier rank 1 never joins."""
    block = ["--block-at", str(block_at)] if block_at is not None else []
    return start_job([sys.executable, str(REPO / "tests" / "_stall_script.py"), str(out),
                      "--strategy", strategy, "--stall-timeout", str(stall_timeout),
                      "--launcher", launcher, "--timeout", str(timeout), *block], out)


__all__ = ["Job", "SmallDisk", "clean_env", "fill_tmpfs", "unwritable_folder", "kill_marked",
           "leftovers", "marked_pids", "stall_job", "start_job"]
