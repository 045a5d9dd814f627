"""Issue 37: jobs across two machines, each a network namespace with its own address and host
name (tests/_netns.py), so that nothing meets on 127.0.0.1. Each node runs its own
``ptrain fit --num-nodes 2`` with the rendezvous endpoint on the first node, as a user would on
two hosts; the filesystem is shared, as with NFS.

Skipped with the reason where namespaces can't be made (not Linux, not root, a container that
refuses); CI runs as root. The whole file takes about 4 minutes on an idle 2-core machine, so
its tests are a campaign family: the default run draws five (naming the file runs it whole).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests import _netns
from tests._node_models import read
from tests._subprocess_jobs import communicate_or_kill, launcher_free_env
from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.campaign(family="two-machine jobs", sample=5)]

PORT = 29400  # each node has its own ports: any port is free there
#: bounds every wait, so a job that should have ended can't hang the suite
TIMEOUT_S = 60
MODEL = "tests._node_models:NodeRecorder"


@pytest.fixture
def nodes():
    why = _netns.unavailable()
    if why:
        pytest.skip(f"two machines are network namespaces here, and {why}")
    with _netns.nodes(2) as made:
        yield made


def fit_argv(strategy: str, root: Path, record: Path, *extra: str, devices: int = 1,
             num_nodes: int = 2, endpoint: str | None = None, timeout: int = TIMEOUT_S,
             epochs: int = 1) -> list[str]:
    argv = [sys.executable, "-m", "ptrain", "fit", "--model", MODEL,
            "--model.record_dir", str(record), "--strategy", strategy, "--devices", str(devices),
            "--num-nodes", str(num_nodes), "--accelerator", "cpu", "--max-epochs", str(epochs),
            "--seed", "0", "--no-progress-bar", "--default-root-dir", str(root),
            f"--{strategy}-timeout", str(timeout), *extra]
    if endpoint:
        argv += [f"--{strategy}-rdzv-endpoint", endpoint, f"--{strategy}-rdzv-id", "job"]
    return argv


def start(node: _netns.Node, argv: list[str], env: dict[str, str] | None = None,
          disks: dict[Path, Path] | None = None) -> subprocess.Popen:
    return node.popen(argv, disks, cwd=REPO, env=launcher_free_env(**(env or {})),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(procs: list[subprocess.Popen], timeout: float = 4 * TIMEOUT_S
           ) -> list[subprocess.CompletedProcess]:
    """Wait for every process (killing a process group that outlives ``timeout``)."""
    return [communicate_or_kill(proc, timeout) for proc in procs]


def detail(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout[-3000:]}\nstderr:\n" \
           f"{result.stderr[-3000:]}"


def one_paragraph(result: subprocess.CompletedProcess) -> str:
    return " ".join(result.stderr.split())


def two_node_fit(nodes, strategy: str, root: Path, record: Path, *extra: str,
                 devices: int = 1) -> list[subprocess.CompletedProcess]:
    record.mkdir(parents=True)
    endpoint = f"{nodes[0].address}:{PORT}"
    return finish([start(node, fit_argv(strategy, root, record, *extra, devices=devices,
                                        endpoint=endpoint)) for node in nodes])


def one_machine_fit(strategy: str, root: Path, record: Path, epochs: int = 1
                    ) -> subprocess.CompletedProcess:
    """The reference: the same job on this machine alone, with as many processes (2)."""
    record.mkdir()
    result = subprocess.run(
        fit_argv(strategy, root, record, devices=2, num_nodes=1, epochs=epochs),
        cwd=REPO, env=launcher_free_env(), capture_output=True, text=True, timeout=4 * TIMEOUT_S)
    assert result.returncode == 0, detail(result)
    return result


def own_disk_fit(nodes, runs: Path, own: Path, record: Path, *extra: str, epochs: int = 1
                 ) -> list[subprocess.CompletedProcess]:
    """A ddp job whose run root ``runs`` is, on the second machine, its own disk ``own``
    (bind-mounted at the same path)."""
    record.mkdir()
    endpoint = f"{nodes[0].address}:{PORT}"
    return finish([start(node, fit_argv("ddp", runs, record, *extra, endpoint=endpoint,
                                        epochs=epochs),
                         disks={runs: own} if node is nodes[1] else None) for node in nodes])


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_machines_train_as_one_machine_with_as_many_processes(nodes, tmp_path, strategy):
    """Each machine's host name resolves to 127.0.1.1 there (as Debian installs it), so torch
    alone publishes loopback addresses; ptrain publishes the address that faces the endpoint
    and gives gloo that interface. The job trains, step by step, to the losses of one machine
    with two processes, and writes its run folder and checkpoint once."""
    runs = two_node_fit(nodes, strategy, tmp_path / "runs", tmp_path / "two")
    for result in runs:
        assert result.returncode == 0, detail(result)
        assert "Traceback" not in result.stderr and "[W" not in result.stderr, detail(result)
    one_machine_fit(strategy, tmp_path / "one-runs", tmp_path / "one")

    two, one = read(tmp_path / "two"), read(tmp_path / "one")
    assert [two[r]["node"] for r in (0, 1)] == [n.name for n in nodes]
    for rank in (0, 1):
        assert len(two[rank]["losses"]) == 4, two
        assert two[rank]["losses"] == pytest.approx(one[rank]["losses"], rel=1e-6, abs=1e-9)
    # written once, by rank 0, into the run folder it chose
    folders = [p.name for p in (tmp_path / "runs").iterdir()]
    assert len(folders) == 1 and folders[0].startswith("version_"), folders
    checkpoints = list((tmp_path / "runs").rglob("last.ckpt"))
    assert len(checkpoints) == 1, checkpoints


def test_hybrid_sharding_shards_within_a_machine_and_replicates_across(nodes, tmp_path):
    """``--fsdp-replicate nodes`` on 2 machines x 2 processes: each shard group is the two
    processes of one machine, so only the replicas' gradient reduction crosses the link."""
    runs = two_node_fit(nodes, "fsdp", tmp_path / "runs", tmp_path / "rec", "--fsdp-replicate",
                        "nodes", devices=2)
    for result in runs:
        assert result.returncode == 0, detail(result)
    ranks = read(tmp_path / "rec")
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, seen in ranks.items():
        group = seen["shard_group"]
        assert group is not None and len(group) == 2 and rank in group, ranks
        assert {ranks[r]["node"] for r in group} == {seen["node"]}, ranks
    assert {seen["node"] for seen in ranks.values()} == {n.name for n in nodes}


def test_a_node_that_never_comes_is_named_after_the_timeout(nodes, tmp_path):
    """Only the first machine starts: the rendezvous waits out ``--ddp-timeout`` and then says
    how many machines came, which, and what to do."""
    (tmp_path / "rec").mkdir()
    first = start(nodes[0], fit_argv("ddp", tmp_path / "runs", tmp_path / "rec",
                                     endpoint=f"{nodes[0].address}:{PORT}", timeout=10))
    result, = finish([first])
    assert result.returncode == 2, detail(result)
    message = one_paragraph(result)
    assert "not all 2 machines joined" in message and "within 10 s" in message, message
    assert nodes[0].name in message, message  # the one that came
    assert "Traceback" not in result.stderr, detail(result)


def test_a_late_node_is_waited_for_within_the_timeout(nodes, tmp_path):
    """The second machine starts only once the first hosts the rendezvous and waits in it, and
    a few seconds later still: the first waits (within ``--ddp-timeout``) and the job trains."""
    (tmp_path / "rec").mkdir()
    endpoint = f"{nodes[0].address}:{PORT}"
    first = start(nodes[0], fit_argv("ddp", tmp_path / "runs", tmp_path / "rec",
                                     endpoint=endpoint))
    deadline = time.monotonic() + TIMEOUT_S
    while not nodes[0].listens_on(PORT):
        assert first.poll() is None, detail(finish([first])[0])
        assert time.monotonic() < deadline, "the first machine never hosted the rendezvous"
        time.sleep(0.1)
    time.sleep(3)  # the lateness itself: nothing below depends on it being exactly this
    assert first.poll() is None, detail(finish([first])[0])
    second = start(nodes[1], fit_argv("ddp", tmp_path / "runs", tmp_path / "rec",
                                      endpoint=endpoint))
    for result in finish([first, second]):
        assert result.returncode == 0, detail(result)
    ranks = read(tmp_path / "rec")
    assert [ranks[r]["node"] for r in (0, 1)] == [n.name for n in nodes]
    assert all(len(ranks[r]["losses"]) == 4 for r in (0, 1)), ranks


def test_machines_that_would_resume_from_different_checkpoints_are_stopped(nodes, tmp_path):
    """The run root is on each machine's own disk (the same path, another folder behind it on
    the second machine): the first machine's has the job's checkpoint, the second's none. With
    ``--ckpt-path auto`` the first would resume and the second start from scratch; the job
    ends at start-up (exit 2) naming what each machine found."""
    runs, own = tmp_path / "runs", tmp_path / "second-machine-disk"
    runs.mkdir()
    own.mkdir()
    for result in own_disk_fit(nodes, runs, own, tmp_path / "first"):
        assert result.returncode == 0, detail(result)
    assert list(runs.rglob("last.ckpt")) and not list(own.rglob("*.ckpt"))
    results = own_disk_fit(nodes, runs, own, tmp_path / "second", "--ckpt-path", "auto")
    for result in results:
        assert result.returncode == 2, detail(result)
    message = one_paragraph(results[0])
    assert "would not start from one checkpoint" in message, message
    assert f"rank 1 ({nodes[1].name}): no checkpoint (from the start)" in message, message
    assert f"rank 0 ({nodes[0].name}): {runs}" in message, message
    assert "Traceback" not in results[0].stderr, detail(results[0])


def test_with_save_on_each_node_each_machine_resumes_from_its_own_disk(nodes, tmp_path):
    """The run root on each machine's own disk, ``--save-on-each-node``: both machines write
    the checkpoints, and the job run again with ``--ckpt-path auto`` resumes on each from its
    own copy and trains, step for step, what an uninterrupted job trains."""
    runs, own = tmp_path / "runs", tmp_path / "second-machine-disk"
    runs.mkdir()
    own.mkdir()

    def job(record: Path, epochs: int, *extra: str) -> list[subprocess.CompletedProcess]:
        results = own_disk_fit(nodes, runs, own, record, "--save-on-each-node", *extra,
                               epochs=epochs)
        for result in results:
            assert result.returncode == 0, detail(result)
        return results

    job(tmp_path / "first", 1)
    copies = [runs / "version_0" / "checkpoints" / "last.ckpt",
              own / "version_0" / "checkpoints" / "last.ckpt"]
    first, second = (torch.load(c, map_location="cpu", weights_only=False) for c in copies)
    assert first["loop"]["global_step"] == second["loop"]["global_step"] == 4
    for name, tensor in first["model"].items():
        assert torch.equal(tensor, second["model"][name]), name
    resumed = job(tmp_path / "second", 2, "--ckpt-path", "auto")
    assert "Resuming from checkpoint" in resumed[0].stdout, detail(resumed[0])
    one_machine_fit("ddp", tmp_path / "one-runs", tmp_path / "one", epochs=2)
    got, want = read(tmp_path / "second"), read(tmp_path / "one")
    for rank in (0, 1):
        assert got[rank]["steps"] == [4, 5, 6, 7], got
        assert got[rank]["losses"] == pytest.approx(want[rank]["losses"][4:], rel=1e-6,
                                                    abs=1e-9)


def test_save_on_each_node_is_refused_where_checkpoints_are_sharded(nodes, tmp_path):
    runs = two_node_fit(nodes, "fsdp", tmp_path / "runs", tmp_path / "rec",
                        "--save-on-each-node")
    for result in runs:
        assert result.returncode == 2, detail(result)
    message = one_paragraph(runs[0])
    assert "save_on_each_node: fsdp can't write a whole checkpoint on each machine: its " \
           "checkpoints are sharded" in message, message
    assert "Traceback" not in runs[0].stderr, detail(runs[0])


@pytest.mark.parametrize("fault", ["killed", "link-down"])
def test_a_lost_node_ends_the_job_within_the_stall_timeout_naming_it(nodes, tmp_path, fault):
    """Mid-training, the second machine is lost: every process in it SIGKILLed, or its link
    taken down (its processes live on, unreachable). The first machine's processes end within
    ``--ddp-stall-timeout`` (a killed machine sooner: its closed connections break the
    collective, and three missed heartbeats confirm it), naming the lost rank and its machine;
    none waits for torch's collective timeout."""
    record = tmp_path / "rec"
    record.mkdir()
    endpoint = f"{nodes[0].address}:{PORT}"
    procs = [start(node, fit_argv("ddp", tmp_path / "runs", record, "--model.step_s", "0.2",
                                  "--model.n", "4000", "--ddp-stall-timeout", "8",
                                  endpoint=endpoint)) for node in nodes]
    steps = record / "rank1.jsonl"
    deadline = time.monotonic() + 4 * TIMEOUT_S
    while not (steps.is_file() and steps.read_text().count('"step"') >= 3):
        assert all(p.poll() is None for p in procs), [detail(r) for r in finish(procs)]
        assert time.monotonic() < deadline, "the job never reached step 3"
        time.sleep(0.1)
    if fault == "killed":
        nodes[1].kill()
    else:
        nodes[1].cut()
    first, second = finish(procs)
    assert first.returncode not in (0, None), detail(first)
    message = one_paragraph(first)
    assert "rank 1" in message and nodes[1].name in message, detail(first)
    if fault == "killed":  # its connections closed: the watch names it once it missed 3 beats
        assert "is gone: its connection closed under a collective" in message, message
    else:
        assert "stopped responding" in message and "--ddp-stall-timeout 8" in message, message
        # the cut-off machine ends too, saying it lost the others
        assert second.returncode not in (0, None), detail(second)
        assert "rank 0" in one_paragraph(second), detail(second)


def test_a_rank_failing_on_the_other_machine_is_named_with_its_error_on_both(nodes, tmp_path):
    """Rank 1 raises in a training step on the second machine: that machine reports the error
    in full, and the first machine, whose collective broke when rank 1's connection closed,
    names rank 1, its machine and its error's first line (its record can't cross machines)."""
    record = tmp_path / "rec"
    record.mkdir()
    endpoint = f"{nodes[0].address}:{PORT}"
    first, second = finish([start(node, fit_argv(
        "ddp", tmp_path / "runs", record, "--model.fail_rank", "1", "--model.fail_at_step", "3",
        "--ddp-stall-timeout", "8", endpoint=endpoint)) for node in nodes])
    failure = "ValueError: the recorder's planned failure at step 3"
    assert second.returncode == 1 and failure in second.stderr, detail(second)
    assert 'raise ValueError(f"the recorder' in second.stderr, detail(second)  # in full
    assert first.returncode == 1, detail(first)
    message = one_paragraph(first)
    assert "rank 1 (pid " in message and f"on {nodes[1].name}) failed with {failure}" \
        in message, detail(first)
    assert "Traceback" not in message, detail(first)


def test_a_missing_interface_is_named_with_the_ones_there_are(nodes, tmp_path):
    """``GLOO_SOCKET_IFNAME`` names an interface the machine doesn't have: exit 2 at start-up,
    naming it and the interfaces there are."""
    (tmp_path / "rec").mkdir()
    endpoint = f"{nodes[0].address}:{PORT}"
    runs = finish([start(node, fit_argv("ddp", tmp_path / "runs", tmp_path / "rec",
                                        endpoint=endpoint), env={"GLOO_SOCKET_IFNAME": "eth9"})
                   for node in nodes])
    for node, result in zip(nodes, runs):
        assert result.returncode == 2, detail(result)
        message = one_paragraph(result)
        assert "GLOO_SOCKET_IFNAME='eth9'" in message and "does not have" in message, message
        assert node.device in message, message  # the interface it could have named
        assert "Traceback" not in result.stderr, detail(result)


def test_a_loopback_interface_across_machines_is_a_usage_error(nodes, tmp_path):
    (tmp_path / "rec").mkdir()
    endpoint = f"{nodes[0].address}:{PORT}"
    runs = finish([start(node, fit_argv("ddp", tmp_path / "runs", tmp_path / "rec",
                                        endpoint=endpoint), env={"GLOO_SOCKET_IFNAME": "lo"})
                   for node in nodes])
    for result in runs:
        assert result.returncode == 2, detail(result)
        assert "is the loopback interface" in one_paragraph(result), detail(result)


def test_an_unreachable_endpoint_ends_within_the_timeout(nodes, tmp_path):
    """The endpoint is an address no machine has: the second machine says nothing answered
    there, within its timeout, and what to check."""
    (tmp_path / "rec").mkdir()
    result, = finish([start(nodes[1], fit_argv("ddp", tmp_path / "runs", tmp_path / "rec",
                                               endpoint=f"{nodes[0].address[:-1]}9:{PORT}",
                                               timeout=5))])
    assert result.returncode == 2, detail(result)
    message = one_paragraph(result)
    assert "nothing answered at the rendezvous endpoint" in message and "within 5 s" in message
    assert "Traceback" not in result.stderr, detail(result)


@pytest.mark.parametrize("local_addr", [True, False], ids=["local-addr", "host-name"])
def test_torchrun_on_each_machine_trains_the_job(nodes, tmp_path, local_addr):
    """docs/strategies.md's torchrun recipe, one torchrun per machine, with and without
    ``--local-addr`` (the first machine's host name resolves to 127.0.1.1 there and to its
    address on the other)."""
    record = tmp_path / "rec"
    record.mkdir()
    procs = []
    for node in nodes:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                    "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                    f"{nodes[0].address}:{PORT}", "--rdzv-id", "job",
                    # torch guesses the host from the host name, which resolves to
                    # 127.0.1.1 here: it must be told
                    "--rdzv-conf", f"is_host={int(node is nodes[0])}",
                    *(["--local-addr", node.address] if local_addr else []),
                    "-m", "ptrain"]
        argv = fit_argv("ddp", tmp_path / "runs", record)
        procs.append(start(node, launcher + argv[argv.index("fit"):]))
    for result in finish(procs):
        assert result.returncode == 0, detail(result)
        assert "Traceback" not in result.stderr, detail(result)
    ranks = read(record)
    assert sorted(ranks) == [0, 1] and all(len(r["losses"]) == 4 for r in ranks.values()), ranks
    assert {r["node"] for r in ranks.values()} == {n.name for n in nodes}


def test_srun_variables_on_each_machine_train_the_job(nodes, tmp_path):
    """docs/strategies.md's SLURM recipe without SLURM: each machine's process gets the
    variables ``srun --nodes 2 --ntasks-per-node 1`` sets (no endpoint given): the rendezvous
    is the first host of the node list, by a name that resolves to 127.0.1.1 on that host and
    to its address on the other, on a port derived from the job id."""
    record = tmp_path / "rec"
    record.mkdir()
    nodelist = ",".join(node.name for node in nodes)
    procs = [start(node, fit_argv("ddp", tmp_path / "runs", record), env={
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NTASKS": "2",
        "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": nodelist, "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": "0"}) for rank, node in enumerate(nodes)]
    for result in finish(procs):
        assert result.returncode == 0, detail(result)
        assert "Traceback" not in result.stderr, detail(result)
    ranks = read(record)
    assert [ranks[r]["node"] for r in (0, 1)] == [n.name for n in nodes]
    assert all(len(ranks[r]["losses"]) == 4 for r in (0, 1)), ranks


def test_torchrun_restarts_the_job_after_a_lost_process_and_it_resumes_exactly(nodes, tmp_path):
    """torchrun ``--max-restarts 1`` on both machines, ``--ckpt-path auto``: the second
    machine's training process is SIGKILLed after a checkpoint; the agents meet again, and the
    job resumes from that checkpoint and trains, step for step, what an uninterrupted job
    trains. The second machine's restarted process starts 3 s late, so the first machine's
    reaches the store first and finds there what the first try left (torch issue 135712)."""
    def job(root: Path, record: Path, restarts: int) -> list[subprocess.Popen]:
        record.mkdir()
        procs = []
        for node in nodes:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                        "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                        f"{nodes[0].address}:{PORT}", "--rdzv-id", root.name, "--rdzv-conf",
                        f"is_host={int(node is nodes[0])}", "--max-restarts", str(restarts),
                        "-m", "ptrain"]
            argv = fit_argv("ddp", root, record, "--model.step_s", "0.3", "--model.n", "96",
                            "--checkpoint-every-n-train-steps", "3", "--ckpt-path", "auto",
                            "--ddp-stall-timeout", "8")
            if node is nodes[1]:
                argv += ["--model.restart_delay_s", "3"]
            procs.append(start(node, launcher + argv[argv.index("fit"):]))
        return procs

    reference = finish(job(tmp_path / "reference", tmp_path / "reference-rec", 0))
    for result in reference:
        assert result.returncode == 0, detail(result)
    procs = job(tmp_path / "restarted", tmp_path / "rec", 1)
    steps = tmp_path / "rec" / "rank1.jsonl"
    deadline = time.monotonic() + 4 * TIMEOUT_S
    while not (steps.is_file() and steps.read_text().count('"step"') >= 5):
        assert all(p.poll() is None for p in procs), [detail(r) for r in finish(procs)]
        assert time.monotonic() < deadline, "the job never reached step 5"
        time.sleep(0.1)
    trainer_pid = next(pid for pid in nodes[1].pids()
                       if "ptrain" in Path(f"/proc/{pid}/cmdline").read_text()
                       and "torch.distributed.run" not in Path(f"/proc/{pid}/cmdline").read_text())
    os.kill(trainer_pid, signal.SIGKILL)
    results = finish(procs)
    for result in results:
        assert result.returncode == 0, detail(result)
    assert "Resuming from checkpoint" in results[0].stdout, detail(results[0])
    want, got = read(tmp_path / "reference-rec"), read(tmp_path / "rec")
    for rank in (0, 1):
        steps, losses = got[rank]["steps"], got[rank]["losses"]
        # the second attempt starts where its step count goes back: at the checkpoint's step
        resumed = max(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
        at = steps[resumed]
        assert at > 0 and at % 3 == 0, steps  # from a checkpoint, not from the start
        assert steps[resumed:] == want[rank]["steps"][at:], (steps, want[rank]["steps"])
        assert losses[resumed:] == pytest.approx(want[rank]["losses"][at:], rel=1e-6, abs=1e-9)
