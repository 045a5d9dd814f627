"""The ``ddp`` strategy, with real gloo process groups of two CPU ranks: nothing of torch or
torch.distributed is replaced.

Each 2-rank job costs a few seconds (spawning, importing torch, rendezvous), so the jobs that run
in subprocesses (CLI, torchrun, the SIGKILL resume) are started up front by the ``jobs`` fixture,
two at a time, while the jobs started from Python in this process run; each test checks its own
job's result. Models come from ``tests/_dist_models.py`` and ``tests/conftest.py``: the workers
unpickle them, so they must live in an importable module.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

import ptrain

from ptrain.distributed import Environment, detect_environment, first_host
from ptrain.errors import ConfigError, NonFiniteLossError, WorkerError
from ptrain.data import available_cpus
from ptrain.seeding import seed_replica_worker
from tests._campaigns import TWO_PROCESS_RUNS
from tests._cli_util import assert_usage_error
from tests._subprocess_jobs import communicate_or_kill, launcher_free_env
from tests._dist_models import (DrawRecorder, FailingRegressor, NaNOnOneRank, OwnSamplerRegressor,
                                RandomDraws, RankOwnNames, RankRecorder, StartMethodRecorder,
                                StopOnOneRank, ThreadRecorder, read_records)
from tests.conftest import REPO, TinyRegressor, run_cli

QUIET = ["no:progress-bar", "no:tensorboard"]
WORLD = 2
#: A collective waits at most this long, so that a test of a job that should have ended can't
#: hang for torch's default half hour; the checks of how fast a failing job ends use less.
SAFETY_TIMEOUT_S = 120.0
FAILURE_BOUND_S = 60.0
RESUME_SCRIPT = REPO / "tests" / "_ddp_resume_script.py"
TINY = "tests.conftest:TinyRegressor"



def detail(proc: subprocess.CompletedProcess | Any) -> str:
    return (f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")


def run_in_group(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run ``argv`` from the repository root in a new session (its own process group); whatever
    is left of that group afterwards (a run killed half-way, a timeout) is SIGKILLed."""
    proc = subprocess.Popen(argv, cwd=REPO, env=launcher_free_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    return communicate_or_kill(proc, timeout)


def version_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and re.fullmatch(r"version_\d+", p.name))


def steps_per_epoch(n: int, batch_size: int, world: int = WORLD) -> int:
    """Optimizer steps per epoch when a DistributedSampler splits ``n`` samples over ``world``
    ranks (padded to equal shards) and each rank batches its shard by ``batch_size``."""
    return math.ceil(math.ceil(n / world) / batch_size)


# ---------------------------------------------------------------------------------------------
# Jobs that run in subprocesses, started up front


def ddp_cli(root: Path, *args: str) -> list[str]:
    return ["--strategy", "ddp", "--devices", str(WORLD), "--accelerator", "cpu",
            "--max-epochs", "1", "--no-progress-bar", "--default-root-dir", str(root),
            "--ddp-timeout", str(SAFETY_TIMEOUT_S), *args]


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
            "--standalone", "-m", "ptrain", *args]


def resume_job(root: Path, kill_step: int) -> dict[str, Any]:
    """A run SIGKILLed (the whole process group, from rank 0) at ``kill_step``, then resumed."""
    out = root / "out.pt"
    base = [sys.executable, str(RESUME_SCRIPT), "--root", str(root / "runs"), "--out", str(out)]
    killed = run_in_group([*base, "--kill-step", str(kill_step)], timeout=180)
    result = {"killed": killed, "out_after_kill": out.exists(), "checkpoint_loop": None}
    last = root / "runs" / "version_0" / "checkpoints" / "last.ckpt"
    if last.exists():
        result["checkpoint_loop"] = {k: v for k, v in torch.load(last, weights_only=True)[
            "loop"].items() if k != "epoch_rng"}
    result["resumed"] = run_in_group([*base, "--resume"], timeout=180)
    return result


def reference_job(root: Path) -> subprocess.CompletedProcess:
    return run_in_group([sys.executable, str(RESUME_SCRIPT), "--root", str(root / "runs"),
                         "--out", str(root / "out.pt")], timeout=180)


def two_node_job(root: Path) -> list[subprocess.CompletedProcess]:
    """Two "machines" on localhost, one process each, meeting at one rendezvous endpoint: each
    is a separate ``ptrain fit --num-nodes 2`` with its own launcher, started together."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for node in range(2):
        argv = [sys.executable, "-m", "ptrain", "fit", "--model", TINY,
                *ddp_cli(root / f"node{node}", "--devices", "1", "--num-nodes", "2",
                         "--ddp-rdzv-endpoint", f"127.0.0.1:{port}", "--ddp-rdzv-id", "two")]
        procs.append(subprocess.Popen(argv, cwd=REPO, env=launcher_free_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    results = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return results


RESUME_KILL_STEP = 7  # checkpoints every 3 steps: the last one before the kill is step 6


class Jobs:
    """Subprocess jobs run two at a time in the background; ``jobs[key]`` waits for one."""

    def __init__(self, request, root: Path):
        self.root = root
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ddp-job")
        self._futures: dict[str, Future] = {}
        self._selected = {item.originalname for item in request.session.items
                          if item.path == request.path}

    def start(self, key: str, function: Callable[..., Any], *args: Any,
              used_by: tuple[str, ...]) -> None:
        if self._selected.intersection(used_by):
            self._futures[key] = self._pool.submit(function, *args)

    def __getitem__(self, key: str) -> Any:
        return self._futures[key].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module", autouse=True)
def jobs(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp-jobs")
    jobs = Jobs(request, root)
    # the longest first
    jobs.start("resume", resume_job, root / "resume", RESUME_KILL_STEP,
               used_by=("test_resume_after_sigkill_of_the_whole_job_is_exact",))
    jobs.start("reference", reference_job, root / "reference",
               used_by=("test_resume_after_sigkill_of_the_whole_job_is_exact",
                        "test_only_rank_zero_writes"))
    jobs.start("torchrun", run_in_group, torchrun(
        "fit", "--model", TINY, *ddp_cli(root / "torchrun")), 180,
        used_by=("test_torchrun_launched_processes_train_as_one_job",
                 "test_only_rank_zero_writes"))
    jobs.start("torchrun-devices-1", run_in_group, torchrun(
        "fit", "--model", TINY, *ddp_cli(root / "torchrun-devices-1", "--devices", "1")), 180,
        used_by=("test_torchrun_with_disagreeing_devices_is_a_usage_error",))
    jobs.start("cli-failure", run_cli, "fit", "--model", "tests._dist_models:FailingRegressor",
               "--model.message", "cli-rank-one-broke-here", *ddp_cli(root / "cli-failure"),
               used_by=("test_failing_rank_through_the_cli",))
    jobs.start("two-nodes", two_node_job, root / "two-nodes",
               used_by=("test_two_machines_meet_at_the_rendezvous_endpoint",))
    # rank 0 is late, so rank 1 fails first and the launcher stops rank 0
    jobs.start("cli-usage", run_cli, "fit", "--model", "tests._dist_models:OwnSamplerRegressor",
               "--model.slow_rank", "0", "--model.delay_s", "3", *ddp_cli(root / "cli-usage"),
               used_by=("test_usage_error_in_a_worker",
                        "test_usage_error_in_a_worker_is_one_paragraph_through_the_cli"))
    yield jobs
    jobs.close()


# ---------------------------------------------------------------------------------------------
# Unit tests of the environment detection (no processes)


@pytest.mark.parametrize("nodelist,host", [
    ("gpu[03-05,09],cpu1", "gpu03"),
    ("node7", "node7"),
    ("a-b[1-2]", "a-b1"),
    ("node7,node8", "node7"),
    ("gpu[12,04]", "gpu12"),
    (" n[0001-0004] ", "n0001"),
])
def test_first_host_of_a_slurm_node_list(nodelist, host):
    assert first_host(nodelist) == host


LAUNCHER_VARS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
                 "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID", "SLURM_JOB_NAME"]


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher variables; any the code under test sets are removed again afterwards."""
    for name in LAUNCHER_VARS:
        monkeypatch.setenv(name, "placeholder")  # records the original value (or its absence)
        monkeypatch.delenv(name)
    return monkeypatch


def slurm_task(monkeypatch, procid: int, localid: int, ntasks: int = 8,
               nodelist: str = "gpu[03-05,09],cpu1", job_id: str = "4242",
               job_name: str = "train") -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", str(procid))
    monkeypatch.setenv("SLURM_LOCALID", str(localid))
    monkeypatch.setenv("SLURM_NTASKS", str(ntasks))
    monkeypatch.setenv("SLURM_JOB_NODELIST", nodelist)
    monkeypatch.setenv("SLURM_JOB_ID", job_id)
    monkeypatch.setenv("SLURM_JOB_NAME", job_name)


def test_no_launcher_variables_means_no_environment(clean_env):
    assert detect_environment() is None
    assert "MASTER_ADDR" not in os.environ and "RANK" not in os.environ


def test_slurm_task_gets_its_ranks_and_the_first_node_as_master(clean_env):
    slurm_task(clean_env, procid=5, localid=1, ntasks=8)
    env = detect_environment()
    assert env == Environment(global_rank=5, local_rank=1, world_size=8, source="slurm")
    assert os.environ["MASTER_ADDR"] == "gpu03"
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"]) == \
        ("5", "1", "8")
    port = os.environ["MASTER_PORT"]
    assert 1024 <= int(port) <= 65535

    # another task of the same job meets at the same address and port
    slurm_task(clean_env, procid=0, localid=0, ntasks=8)
    assert detect_environment() == Environment(0, 0, 8, "slurm")
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("gpu03", port)


def test_slurm_keeps_a_master_address_given_by_the_user(clean_env):
    slurm_task(clean_env, procid=1, localid=1, ntasks=2)
    clean_env.setenv("MASTER_ADDR", "10.1.2.3")
    clean_env.setenv("MASTER_PORT", "29555")
    assert detect_environment() == Environment(1, 1, 2, "slurm")
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("10.1.2.3", "29555")


@pytest.mark.parametrize("ntasks,job_name", [(1, "train"), (4, "bash"), (4, "interactive")])
def test_interactive_slurm_allocation_is_not_a_launcher(clean_env, ntasks, job_name):
    slurm_task(clean_env, procid=0, localid=0, ntasks=ntasks, job_name=job_name)
    assert detect_environment() is None
    assert "MASTER_ADDR" not in os.environ


def test_torchrun_variables_win_over_slurm(clean_env):
    slurm_task(clean_env, procid=5, localid=1, ntasks=8)
    for name, value in {"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "3",
                        "MASTER_ADDR": "localhost", "MASTER_PORT": "29500",
                        "TORCHELASTIC_RUN_ID": "job"}.items():
        clean_env.setenv(name, value)
    assert detect_environment() == Environment(1, 0, 3, "torchelastic")


# ---------------------------------------------------------------------------------------------
# Training from Python: the launching Trainer adopts rank 0's result


@pytest.mark.slow
@TWO_PROCESS_RUNS
@pytest.mark.parametrize("accumulate", [1, 2])
def test_two_ranks_train_like_one_process_with_twice_the_batch(make_trainer, accumulate):
    """shuffle=False: the DistributedSampler gives rank r the samples r, r+2, r+4, ..., so batch
    k of rank 0 and batch k of rank 1 together are batch k of one process with twice the batch;
    DDP averages the gradients, so plain SGD must take the same steps."""
    torch.manual_seed(0)
    ddp_module = TinyRegressor(batch_size=8, lr=0.1, with_val=False)
    single_module = copy.deepcopy(ddp_module)
    single_module.batch_size = 2 * ddp_module.batch_size
    initial = copy.deepcopy(ddp_module.state_dict())

    single = make_trainer(max_epochs=2, accumulate_grad_batches=accumulate, callbacks=QUIET)
    single.fit(single_module)
    ddp = make_trainer(strategy="ddp", devices=WORLD, max_epochs=2, callbacks=QUIET,
                       accumulate_grad_batches=accumulate,
                       plugin_options={"ddp": {"timeout": SAFETY_TIMEOUT_S}})
    ddp.fit(ddp_module)

    assert ddp.global_step == single.global_step == 2 * math.ceil(
        steps_per_epoch(len(ddp_module.train_set), ddp_module.batch_size) / accumulate)
    assert ddp.current_epoch == single.current_epoch
    trained = single_module.state_dict()
    assert any(not torch.equal(initial[k], trained[k]) for k in initial)  # it did train
    # the module in this process holds rank 0's trained weights
    torch.testing.assert_close(ddp_module.state_dict(), trained)


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_metrics_are_reduced_and_each_epoch_reshuffles_the_shards(make_trainer, tmp_path,
                                                                  monkeypatch):
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    module = RankRecorder(str(record_dir), n=64, batch_size=8, shuffle=True, val_n=16)
    epochs = 2
    trainer = make_trainer(strategy="ddp", devices=WORLD, max_epochs=epochs, seed=3,
                           callbacks=QUIET, plugin_options={"ddp": {"timeout": SAFETY_TIMEOUT_S}})
    monkeypatch.delenv("TORCHELASTIC_SIGNALS_TO_HANDLE", raising=False)
    environment = dict(os.environ)
    trainer.fit(module)
    # starting the workers left the caller's environment as it was (torch's launcher sets a
    # variable in it)
    assert {k: v for k, v in os.environ.items() if not k.endswith("GLOBAL_SEED")} == \
        {k: v for k, v in environment.items() if not k.endswith("GLOBAL_SEED")}

    # every rank logged its own rank; what comes back is their mean, not rank 0's value
    mean_rank = sum(range(WORLD)) / WORLD
    assert trainer.callback_metrics["rank"].item() == pytest.approx(mean_rank)
    assert trainer.callback_metrics["val_rank"].item() == pytest.approx(mean_rank)
    assert {"train_loss", "val_loss"} <= set(trainer.callback_metrics)
    n, per_epoch = len(module.train_set), steps_per_epoch(64, 8)
    assert trainer.global_step == epochs * per_epoch and trainer.current_epoch == epochs

    records = read_records(record_dir)
    assert sorted(records) == list(range(WORLD))
    orders = {}  # (rank, epoch) -> the sample indices in the order the rank saw them
    for rank, lines in records.items():
        for line in lines:
            orders.setdefault((rank, line["epoch"]), []).extend(line["indices"])
        assert [line["batch_idx"] for line in lines] == list(range(per_epoch)) * epochs
    for epoch in range(epochs):
        shards = [orders[rank, epoch] for rank in range(WORLD)]
        # each rank a different shard; together the whole dataset, each sample once
        assert sorted(i for shard in shards for i in shard) == list(range(n)), epoch
        assert all(len(shard) == n // WORLD for shard in shards)
    for rank in range(WORLD):
        assert orders[rank, 0] != sorted(orders[rank, 0])  # shuffle=True was kept
        # set_epoch each epoch: a new permutation (without it every epoch repeats the first)
        assert orders[rank, 0] != orders[rank, 1], f"rank {rank} saw the same order twice"


def _loader_put_in(trainer, loader, stage: str):
    """What the run's strategy makes of ``loader`` for ``stage`` (its real
    ``prepare_dataloader`` wrapper, driven as pluggy drives it)."""
    wrapper = trainer.plugins[trainer.options["strategy"]].prepare_dataloader(trainer, stage)
    next(wrapper)
    with pytest.raises(StopIteration) as done:
        wrapper.send(loader)
    return done.value.value


def _sampler_put_in(trainer, loader, stage: str):
    """The sampler the run's strategy puts in ``loader`` for ``stage``."""
    return _loader_put_in(trainer, loader, stage).sampler


def test_the_training_shard_shuffles_as_the_dataloader_says_unless_told_always():
    data = torch.utils.data.TensorDataset(torch.arange(32.0))
    in_order = torch.utils.data.DataLoader(data, batch_size=4)
    shuffled = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    trainer = ptrain.Trainer(strategy="ddp", devices=WORLD, accelerator="cpu")
    assert _sampler_put_in(trainer, in_order, "train").shuffle is False
    assert _sampler_put_in(trainer, shuffled, "train").shuffle is True
    always = ptrain.Trainer(strategy="ddp", devices=WORLD, accelerator="cpu",
                            plugin_options={"ddp": {"train_shuffle": "always"}})
    assert _sampler_put_in(always, in_order, "train").shuffle is True
    # evaluation shards are never shuffled
    assert _sampler_put_in(always, shuffled, "validate").shuffle is False
    with pytest.raises(ConfigError, match="loader or always"):
        ptrain.Trainer(strategy="ddp", devices=WORLD, accelerator="cpu",
                       plugin_options={"ddp": {"train_shuffle": "sometimes"}})


def _worker_draws(**loader_options) -> list[list[float]]:
    torch.manual_seed(0)  # as every rank of a job is seeded
    loader = torch.utils.data.DataLoader(RandomDraws(), batch_size=2, num_workers=2,
                                         **loader_options)
    return [row for batch in loader for row in batch.tolist()]


def test_each_replicas_dataloader_workers_draw_their_own_random_numbers():
    """Torch seeds a worker from the loader's base seed, drawn alike on ranks seeded alike:
    two ranks' workers draw the same augmentations. The strategy binds each loader with
    workers and no worker_init_fn of its own to seed_replica_worker and the replica's rank,
    whose workers then draw apart from the other rank's, and alike from run to run."""
    trainer = ptrain.Trainer(strategy="ddp", devices=WORLD, accelerator="cpu")
    loader = _loader_put_in(trainer, torch.utils.data.DataLoader(RandomDraws(), num_workers=2),
                            "train")
    assert loader.worker_init_fn.func is seed_replica_worker
    assert loader.worker_init_fn.args == (0,)  # this process's data-parallel rank
    own = torch.utils.data.DataLoader(RandomDraws(), num_workers=2, worker_init_fn=print)
    assert _loader_put_in(trainer, own, "train").worker_init_fn is print
    assert _worker_draws() == _worker_draws()  # the problem: every rank draws these
    ranks = [_worker_draws(worker_init_fn=functools.partial(seed_replica_worker, rank))
             for rank in range(WORLD)]
    assert ranks[0] == _worker_draws(worker_init_fn=functools.partial(seed_replica_worker, 0))
    for a, b in zip(*ranks):
        assert all(x != y for x, y in zip(a, b)), (a, b)  # torch, NumPy, Python: each apart


@TWO_PROCESS_RUNS
def test_the_ranks_of_a_job_draw_different_augmentations_in_their_workers(make_trainer,
                                                                          tmp_path):
    trainer = make_trainer(strategy="ddp", devices=WORLD, max_epochs=1, callbacks=QUIET,
                           seed=0, plugin_options={"ddp": {"timeout": SAFETY_TIMEOUT_S}})
    trainer.fit(DrawRecorder(str(tmp_path)))
    draws = [json.loads((tmp_path / f"draws{rank}.json").read_text()) for rank in range(WORLD)]
    assert len(draws[0]) == len(draws[1]) == 4
    for a, b in zip(*draws):
        assert all(x != y for x, y in zip(a, b)), (a, b)


@TWO_PROCESS_RUNS
def test_a_name_only_some_ranks_log_is_reduced_over_those_and_known_to_all(make_trainer,
                                                                          tmp_path):
    """Reduced by position, rank 0's ``a`` took in rank 1's ``b`` (both 50.5), and a rank
    logging one name more left the ranks in collectives of different sizes: the job hung."""
    trainer = make_trainer(strategy="ddp", devices=WORLD, max_epochs=1, callbacks=QUIET,
                           log_every_n_steps=1,
                           plugin_options={"ddp": {"timeout": SAFETY_TIMEOUT_S}})
    trainer.fit(RankOwnNames(str(tmp_path)))
    seen = [json.loads((tmp_path / f"metrics{rank}.json").read_text()) for rank in range(WORLD)]
    assert seen[0] == seen[1] == {"a": 1.0, "b": 100.0, "c": 7.0, "both": 15.0}


def test_overfit_batches_reads_the_same_shard_in_order_every_epoch():
    """``ptrain.lightning`` shuffles the training shard always, as Lightning; overfit_batches
    must not: each epoch trains on the same batches, as in one process."""
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)),
                                       shuffle=True)
    always = {"ddp": {"train_shuffle": "always"}}
    overfit = ptrain.Trainer(strategy="ddp", devices=WORLD, accelerator="cpu",
                             overfit_batches=1, plugin_options=always)
    assert _sampler_put_in(overfit, data, "train").shuffle is False
    plain = ptrain.Trainer(strategy="ddp", devices=WORLD, accelerator="cpu",
                           plugin_options=always)
    assert _sampler_put_in(plain, data, "train").shuffle is True


@TWO_PROCESS_RUNS
def test_the_processes_of_a_cpu_job_share_the_cores(make_trainer, tmp_path, monkeypatch):
    """Without OMP_NUM_THREADS each process took every core for its threads, and two
    processes on two cores contended for them (3 to 12 times as slow)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    trainer = make_trainer(strategy="ddp", devices=WORLD, max_epochs=1, callbacks=QUIET,
                           plugin_options={"ddp": {"timeout": SAFETY_TIMEOUT_S}})
    trainer.fit(ThreadRecorder(str(tmp_path)))
    share = str(max(1, available_cpus() // WORLD))
    assert [(tmp_path / f"threads{rank}").read_text() for rank in range(WORLD)] == [share] * 2


def test_the_samplers_seed_is_the_jobs_seed_everything_seed(monkeypatch):
    monkeypatch.delenv("PTRAIN_GLOBAL_SEED", raising=False)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)),
                                       shuffle=True)
    trainer = ptrain.Trainer(strategy="ddp", devices=WORLD, accelerator="cpu")
    assert _sampler_put_in(trainer, data, "train").seed == 0
    ptrain.seed_everything(1234)
    assert _sampler_put_in(trainer, data, "train").seed == 1234
    seeded = ptrain.Trainer(strategy="ddp", devices=WORLD, accelerator="cpu", seed=99)
    assert _sampler_put_in(seeded, data, "train").seed == 99


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_failing_rank_ends_the_job_with_its_error(make_trainer):
    message = f"rank-one-broke-{os.getpid()}"
    trainer = make_trainer(strategy="ddp", devices=WORLD, max_epochs=1, callbacks=QUIET,
                           plugin_options={"ddp": {"timeout": SAFETY_TIMEOUT_S}})
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        trainer.fit(FailingRegressor(fail_rank=1, fail_batch=2, message=message))
    elapsed = time.monotonic() - start
    # rank 0 was waiting for rank 1 in the gradient all-reduce; it was stopped, not left to time out
    assert elapsed < FAILURE_BOUND_S, f"the failed job took {elapsed:.0f} s to end"
    text = str(info.value)
    assert re.match(r"rank 1\b", text), text
    assert f"RuntimeError: {message}" in text  # the worker's own traceback
    assert "training_step" in text


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_failing_rank_through_the_cli(jobs):
    result = jobs["cli-failure"]
    assert result.returncode == 1, detail(result)
    # one report naming the rank that failed (torch may log a line of its own before it)
    reports = [line for line in result.stderr.splitlines() if line.startswith("ptrain:")]
    assert len(reports) == 1 and reports[0].startswith("ptrain: rank 1 failed"), detail(result)
    assert "RuntimeError: cli-rank-one-broke-here" in result.stderr, detail(result)


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_usage_error_in_a_worker(jobs, make_trainer):
    # from Python: the worker's ConfigError arrives as itself
    trainer = make_trainer(strategy="ddp", devices=WORLD, max_epochs=1, callbacks=QUIET,
                           plugin_options={"ddp": {"timeout": SAFETY_TIMEOUT_S}})
    with pytest.raises(ConfigError, match="own sampler") as info:
        trainer.fit(OwnSamplerRegressor())
    assert "SubsetRandomSampler" in str(info.value)
    assert "--no-ddp-distributed-sampler" in str(info.value)
    # from the CLI: exit 2 and the message, without a traceback
    result = jobs["cli-usage"]
    assert result.returncode == 2, detail(result)
    assert "Traceback" not in result.stdout + result.stderr, detail(result)
    reports = [line for line in result.stderr.splitlines() if line.startswith("ptrain:")]
    assert len(reports) == 1 and reports[0].startswith("ptrain: error:"), detail(result)
    for needle in ("own sampler", "SubsetRandomSampler", "--no-ddp-distributed-sampler"):
        assert needle in reports[0], detail(result)


@TWO_PROCESS_RUNS
def test_a_worker_starts_its_dataloader_workers_as_the_launching_process_would(make_trainer,
                                                                                 tmp_path):
    """The workers are started by spawn; left so, each would start its DataLoader workers by
    spawn, importing the program again for every pass (a notebook ran 5x slower)."""
    trainer = make_trainer(strategy="ddp", devices=WORLD, max_epochs=1, callbacks=QUIET,
                           plugin_options={"ddp": {"timeout": SAFETY_TIMEOUT_S}})
    trainer.fit(StartMethodRecorder(str(tmp_path)))
    launching = multiprocessing.get_start_method()
    assert [(tmp_path / f"rank{rank}.txt").read_text() for rank in range(WORLD)] == \
        [launching] * WORLD


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_usage_error_in_a_worker_is_one_paragraph_through_the_cli(jobs):
    """The CLI's rule for usage errors: one ``ptrain: error:`` paragraph on stderr, nothing
    else. Here rank 1 fails first and the launcher stops rank 0 (which is late on purpose)."""
    assert_usage_error(jobs["cli-usage"], "own sampler", "--no-ddp-distributed-sampler")


# ---------------------------------------------------------------------------------------------
# Resume after the whole job was SIGKILLed


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_resume_after_sigkill_of_the_whole_job_is_exact(jobs):
    """Adam, shuffled data, dropout and a per-step scheduler, on two ranks; rank 0 kills the
    process group (the launching process, its elastic agent, both workers) at step 7, after the
    checkpoint of step 6. The resumed run must end with the uninterrupted run's parameters."""
    run = jobs["resume"]
    killed, resumed = run["killed"], run["resumed"]
    assert killed.returncode == -signal.SIGKILL, detail(killed)
    assert not run["out_after_kill"]
    loop = run["checkpoint_loop"]
    assert loop is not None, "the killed run wrote no checkpoint"
    every = 3  # the script's --every-n-train-steps
    assert loop["global_step"] == RESUME_KILL_STEP // every * every < RESUME_KILL_STEP
    assert 0 < loop["batch"] < steps_per_epoch(64, 8)  # a mid-epoch checkpoint
    assert resumed.returncode == 0, detail(resumed)

    reference = jobs["reference"]
    assert reference.returncode == 0, detail(reference)
    got = torch.load(Path(jobs.root) / "resume" / "out.pt", weights_only=True)
    want = torch.load(Path(jobs.root) / "reference" / "out.pt", weights_only=True)
    assert got["global_step"] == want["global_step"] > RESUME_KILL_STEP
    assert got["params"].keys() == want["params"].keys()
    for name, value in want["params"].items():
        assert torch.equal(got["params"][name], value), (
            f"{name}: max difference {(got['params'][name] - value).abs().max().item()}")
    assert got["metrics"] == want["metrics"]


# ---------------------------------------------------------------------------------------------
# torchrun, and who writes


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_torchrun_launched_processes_train_as_one_job(jobs):
    assert (REPO / "core" / "ptrain" / "__main__.py").is_file()  # what `-m ptrain` runs
    result = jobs["torchrun"]
    assert result.returncode == 0, detail(result)
    runs = version_dirs(jobs.root / "torchrun")
    assert len(runs) == 1, runs
    checkpoints = sorted((runs[0] / "checkpoints").iterdir())
    assert [p.name for p in checkpoints] == ["last.ckpt"]
    loop = torch.load(checkpoints[0], weights_only=True)["loop"]
    # the two processes shared the data: one epoch is half as many steps as one process takes
    assert loop["global_step"] == steps_per_epoch(len(TinyRegressor().train_set), 8)


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_torchrun_with_disagreeing_devices_is_a_usage_error(jobs):
    result = jobs["torchrun-devices-1"]
    assert result.returncode != 0, detail(result)
    output = result.stdout + result.stderr
    assert "ptrain: error:" in output and "make them agree" in output, detail(result)
    assert "--devices 1" in output, detail(result)
    assert not (jobs.root / "torchrun-devices-1").exists()  # nothing was written


@pytest.mark.slow
@TWO_PROCESS_RUNS
@pytest.mark.parametrize("job", ["reference", "torchrun"])
def test_only_rank_zero_writes(jobs, job):
    """One run folder (under torchrun each process picks one; rank 0's is used), one event file,
    one checkpoint, and no temporary files of a second writer."""
    result = jobs[job]
    assert result.returncode == 0, detail(result)
    root = jobs.root / job / ("runs" if job == "reference" else "")
    runs = version_dirs(root)
    assert [p.name for p in runs] == ["version_0"], list(root.iterdir())
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    events = [f for f in files if Path(f).name.startswith("events.out.tfevents")]
    assert len(events) == 1, files
    assert sorted(set(files) - set(events)) == ["version_0/.ptrain.lock",  # the run's lock
                                                "version_0/checkpoints/last.ckpt"], files


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_a_stop_asked_by_one_rank_is_agreed_by_all(make_trainer):
    """Only rank 1 sets ``should_stop`` (at the end of epoch 1); both ranks stop there, so the
    job ends instead of rank 0 waiting in epoch 2's collectives."""
    trainer = make_trainer(strategy="ddp", devices=WORLD, accelerator="cpu", max_epochs=5,
                           callbacks=[StopOnOneRank(rank=1, epoch=1), *QUIET],
                           plugin_options={"ddp": {"timeout": SAFETY_TIMEOUT_S}})
    start = time.monotonic()
    trainer.fit(TinyRegressor(n=64, batch_size=8))
    assert time.monotonic() - start < FAILURE_BOUND_S
    assert trainer.current_epoch == 2  # epochs run (Lightning's meaning after fit)
    assert trainer.global_step == 2 * steps_per_epoch(64, 8)


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_a_stop_asked_in_on_train_batch_end_by_one_rank_is_agreed_by_all(make_trainer):
    """Only rank 1 sets ``should_stop``, in ``on_train_batch_end`` at step 3; with a check point
    every step, both ranks stop after that batch."""
    trainer = make_trainer(strategy="ddp", devices=WORLD, accelerator="cpu", max_epochs=5,
                           log_every_n_steps=1,
                           callbacks=[StopOnOneRank(rank=1, step=3), *QUIET],
                           plugin_options={"ddp": {"timeout": SAFETY_TIMEOUT_S}})
    start = time.monotonic()
    trainer.fit(TinyRegressor(n=64, batch_size=8))
    assert time.monotonic() - start < FAILURE_BOUND_S
    assert trainer.global_step == 3


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_a_nan_loss_on_one_rank_ends_the_job_with_its_error(make_trainer):
    """Rank 1's loss is NaN at batch 1; its NaN gradients reach rank 0 through the all-reduce,
    so rank 0's loss is NaN from batch 2. Both ranks stop at the epoch's check point, and the
    job ends with the error of whichever reported first, never waiting for a collective."""
    trainer = make_trainer(strategy="ddp", devices=WORLD, accelerator="cpu", max_epochs=2,
                           callbacks=QUIET,
                           plugin_options={"ddp": {"timeout": SAFETY_TIMEOUT_S}})
    start = time.monotonic()
    with pytest.raises(NonFiniteLossError, match=r"loss became nan at epoch 0, batch [12] "):
        trainer.fit(NaNOnOneRank(rank=1, batch=1, n=64, batch_size=8))
    assert time.monotonic() - start < FAILURE_BOUND_S


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_two_machines_meet_at_the_rendezvous_endpoint(jobs):
    node0, node1 = jobs["two-nodes"]
    assert node0.returncode == 0, detail(node0)
    assert node1.returncode == 0, detail(node1)
    # one job of 2 ranks: the data is split in two, and only global rank 0 wrote, into the run
    # folder it chose (its own --default-root-dir)
    written = [p for p in (jobs.root / "two-nodes").rglob("last.ckpt")]
    assert len(written) == 1, written
    checkpoint = torch.load(written[0], weights_only=True)
    assert checkpoint["loop"]["global_step"] == steps_per_epoch(64, 8)


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_16_mixed_under_ddp_matches_32_true_and_saves_its_scaler(make_trainer, tmp_path):
    """The precision and strategy plugins compose without knowing each other: float16 autocast
    and loss scaling on top of DDP train to 32-true's parameters within float16's tolerance, and
    the scaler's state is in rank 0's checkpoint."""
    runs = {}
    for precision in ("32-true", "16-mixed"):
        trainer = make_trainer(strategy="ddp", devices=WORLD, accelerator="cpu", max_epochs=1,
                               precision=precision, callbacks=["no:progress-bar"],
                               default_root_dir=str(tmp_path / precision),
                               plugin_options={"ddp": {"timeout": SAFETY_TIMEOUT_S}, **(
                                   # a scale this small can't overflow here: no step is skipped
                                   {"16-mixed": {"init_scale": 1024.0}}
                                   if precision == "16-mixed" else {})})
        module = TinyRegressor(n=64, batch_size=8)
        torch.manual_seed(0)
        module.net[1].reset_parameters()
        trainer.fit(module)
        runs[precision] = (trainer, module)
    reference, mixed = runs["32-true"][1], runs["16-mixed"][1]
    for a, b in zip(reference.parameters(), mixed.parameters()):
        torch.testing.assert_close(b, a, atol=5e-3, rtol=5e-3)
    checkpoint = torch.load(runs["16-mixed"][0].last_checkpoint_path, weights_only=True)
    scaler = checkpoint["plugins"]["16-mixed"]
    assert scaler["scale"] > 0 and scaler["_growth_tracker"] == steps_per_epoch(64, 8)


@TWO_PROCESS_RUNS
def test_a_resume_by_another_number_of_processes_is_said_once(tmp_path):
    """A mid-epoch checkpoint of one process resumed by two ddp ranks: every rank computes the
    same resume point, rank 0 alone says it (before, each rank printed the warning)."""
    common = ("--model", "tests.conftest:TinyRegressor", "--accelerator", "cpu",
              "-p", "no:progress-bar", "-p", "no:model-summary", "--default-root-dir",
              str(tmp_path))
    first = run_cli("fit", *common, "--max-steps", "3")  # 8 batches an epoch: mid-epoch
    assert first.returncode == 0, first.stderr
    resumed = run_cli("fit", *common, "--strategy", "ddp", "--devices", "2", "--max-steps", "5",
                      "--ckpt-path", "last")
    assert resumed.returncode == 0, resumed.stderr
    said = "saved after batch 3 of epoch 0 by 1 process; 2 run now"
    assert resumed.stderr.count(said) == 1, resumed.stderr
