"""Jobs the tests start as subprocesses: the environment they get, and how they are waited for.

A test may itself run under a launcher (a rank of torchrun, a SLURM step); a job it starts must
not take that launcher's ranks, rendezvous or seed for its own, so :func:`launcher_free_env`
leaves them out. :func:`communicate_or_kill` waits for a job that runs in a process group of its
own and SIGKILLs whatever of that group is left, so a hung or half-killed job never outlives its
test.
"""

from __future__ import annotations

import os
import signal
import subprocess

#: Variables by which a launcher tells a process its place in a job.
_LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT", "GLOO_SOCKET_IFNAME", "PTRAIN_GLOBAL_SEED",
                  "PTRAIN_LAUNCHER_PID", "PTRAIN_ERROR_DIR")


def launcher_free_env(**extra: str) -> dict[str, str]:
    """This environment without a launcher's variables (ranks, rendezvous, seed, torchrun's and
    SLURM's), plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in _LAUNCHER_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    return {**env, **extra}


def communicate_or_kill(proc: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    """Wait up to ``timeout`` seconds for ``proc`` (started with ``start_new_session=True``, text
    pipes), then SIGKILL what is left of its process group; a job killed for the timeout says
    so at the end of its stderr."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        stderr += f"\n[test] timed out after {timeout} s and was killed"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the job's group, if any of it is left
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
