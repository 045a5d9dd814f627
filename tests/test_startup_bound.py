"""A job's start-up ends within its timeout, with one paragraph naming the rendezvous endpoint,
under every launcher and environment: real ``ptrain fit --strategy ddp`` processes on the CPU
(gloo), against sockets this test opens.

A *silent* endpoint is a socket that listens (connections are accepted by the kernel) but is
never accepted or answered: torch's store client would wait on it for ever. A *busy* port is
one such socket where ptrain must host the rendezvous itself.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._cli_util import assert_ok, assert_usage_error
from tests.conftest import REPO

pytestmark = pytest.mark.slow

#: The --ddp-timeout of every run here: the bound under test.
BOUND_S = 10
#: What a run may take beyond the bound on a loaded machine (start-up, imports, two ranks).
SLACK_S = 60
#: Past this a run is killed: it did not end by itself.
KILL_S = 240

SANITISED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
             "MASTER_PORT", "PTRAIN_GLOBAL_SEED", "PTRAIN_LAUNCHER_PID", "PTRAIN_ERROR_DIR")


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str, seconds: float):
        self.returncode, self.stdout, self.stderr, self.seconds = (returncode, stdout, stderr,
                                                                   seconds)


def ptrain_fit(root: Path, *args: str, env: dict[str, str] | None = None,
               devices: int = 2) -> Result:
    """``ptrain fit`` of a tiny model with ddp, in its own session (whatever is left of it is
    killed); how long it took comes back too."""
    argv = [sys.executable, "-m", "ptrain", "fit", "--model", "tests.conftest:TinyRegressor",
            "--strategy", "ddp", "--devices", str(devices), "--accelerator", "cpu",
            "--max-epochs", "1", "--no-progress-bar", "--default-root-dir", str(root),
            "--ddp-timeout", str(BOUND_S), *args]
    full_env = {k: v for k, v in os.environ.items()
                if k not in SANITISED and not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    full_env.update(env or {})
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=KILL_S)
    except subprocess.TimeoutExpired:
        stdout, stderr = "", ""
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.returncode is None:
        stdout, stderr = proc.communicate()
        pytest.fail(f"the run did not end within {KILL_S} s\n{stdout}\n{stderr}")
    return Result(proc.returncode, stdout, stderr, time.monotonic() - started)


def assert_bounded(result: Result) -> None:
    assert result.seconds < BOUND_S + SLACK_S, (
        f"took {result.seconds:.0f} s for a bound of {BOUND_S} s\n{result.stderr}")


@pytest.fixture
def silent_port():
    """A port on 127.0.0.1 where something listens but never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield s.getsockname()[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_silent_endpoint_under_the_spawn_launcher_ends_within_the_timeout(tmp_path,
                                                                              silent_port):
    result = ptrain_fit(tmp_path, "--ddp-launcher", "spawn",
                        "--ddp-rdzv-endpoint", f"127.0.0.1:{silent_port}")
    assert_usage_error(result, f"127.0.0.1:{silent_port}", "--ddp-rdzv-endpoint",
                       "did not answer", f"within {BOUND_S} s")
    assert_bounded(result)


def test_machines_that_never_join_end_the_spawn_launcher_within_the_timeout(tmp_path):
    # one of two machines: the first hosts the rendezvous and waits for the second
    result = ptrain_fit(tmp_path, "--num-nodes", "2", "--ddp-rdzv-endpoint",
                        f"127.0.0.1:{free_port()}", "--ddp-rdzv-id", "alone", devices=1)
    assert_usage_error(result, "not all 2 machines joined", "--ddp-rdzv-endpoint", "'alone'",
                       f"within {BOUND_S} s")
    assert_bounded(result)


def test_the_default_launcher_uses_the_endpoint_given_and_names_its_busy_port(tmp_path,
                                                                               silent_port):
    result = ptrain_fit(tmp_path, "--ddp-rdzv-endpoint", f"127.0.0.1:{silent_port}")
    assert_usage_error(result, f"port {silent_port}", "--ddp-rdzv-endpoint", "already in use",
                       "free port")
    assert_bounded(result)


def test_the_default_launcher_meets_at_the_endpoint_given(tmp_path):
    port = free_port()
    result = ptrain_fit(tmp_path / "runs", "--model", "tests._startup_models:PortRecorder",
                        "--model.folder", str(tmp_path),
                        "--ddp-rdzv-endpoint", f"127.0.0.1:{port}")
    assert_ok(result)
    seen = sorted(p.read_text() for p in tmp_path.glob("*.endpoint"))
    assert seen == [f"127.0.0.1:{port}"] * 2, seen


def test_the_default_launcher_refuses_an_endpoint_of_another_machine(tmp_path):
    result = ptrain_fit(tmp_path, "--ddp-rdzv-endpoint", "192.0.2.1:29400")  # TEST-NET-1
    assert_usage_error(result, "192.0.2.1:29400", "not an address of this machine")


def test_a_malformed_endpoint_is_refused(tmp_path):
    result = ptrain_fit(tmp_path, "--ddp-launcher", "spawn", "--ddp-rdzv-endpoint", "localhost")
    assert_usage_error(result, "'localhost'", "HOST:PORT")


def torchrun_env(addr: str, port: int, rank: int, world_size: int) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": addr, "MASTER_PORT": str(port)}


def test_an_unresolvable_master_addr_is_named_at_once(tmp_path):
    result = ptrain_fit(tmp_path, env=torchrun_env("no-such-host.invalid", free_port(), 0, 2))
    assert_usage_error(result, "'no-such-host.invalid'", "MASTER_ADDR", "does not resolve")
    assert "c10d" not in result.stderr
    assert_bounded(result)


def test_a_busy_master_port_on_rank_zero_is_one_paragraph(tmp_path, silent_port):
    result = ptrain_fit(tmp_path, devices=1, env=torchrun_env("127.0.0.1", silent_port, 0, 1))
    assert_usage_error(result, f"port {silent_port}", "MASTER_PORT", "already in use")
    assert_bounded(result)


def test_a_silent_master_port_ends_another_rank_within_the_timeout(tmp_path, silent_port):
    result = ptrain_fit(tmp_path, env=torchrun_env("127.0.0.1", silent_port, 1, 2))
    assert_usage_error(result, f"127.0.0.1:{silent_port}", "MASTER_PORT", "did not answer")
    assert_bounded(result)


#: A program without its ``if __name__ == "__main__":`` guard, run with ddp_spawn: each worker
#: runs it again while it starts and dies there. The module is bigger than a pipe's buffer.
UNGUARDED = '''
import torch
import ptrain.lightning as pl


class Big(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.register_buffer("table", torch.zeros(400_000))  # 1.6 MB pickled

    def training_step(self, batch, batch_idx):
        return self.layer(batch).pow(2).mean()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


pl.Trainer(strategy="ddp_spawn", devices=2, accelerator="cpu", max_epochs=1, logger=False,
           enable_checkpointing=False, enable_progress_bar=False).fit(Big())
'''


def test_a_worker_that_dies_while_starting_ends_the_spawn_launcher(tmp_path):
    """The launcher sends each spawned worker its function; a worker that dies before taking
    it (here: the program has no main guard, so the worker's import of it launches again)
    must end the job with an error, not leave the launcher waiting to hand it over (pykeen's
    lit_pipeline with ddp_spawn in a script without the guard waited for ever)."""
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    env = {k: v for k, v in os.environ.items()
           if k not in SANITISED and not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "core"), env.get("PYTHONPATH", "")])
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=SLACK_S)
        ended = True
    except subprocess.TimeoutExpired:
        stderr, ended = "", False
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert ended, f"the launcher still waited after {time.monotonic() - started:.0f} s"
    assert proc.returncode != 0
    assert "exited with code 1" in stderr and "__main__" in stderr, stderr[-3000:]
