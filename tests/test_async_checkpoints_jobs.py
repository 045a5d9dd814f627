"""Asynchronous checkpoints in jobs of 2 processes (issue 38): ``fsdp`` writes its sharded
folders in the background (torch.distributed.checkpoint over a gloo group of its own), ``ddp``
its rank-0 file; the ranks agree when a write has ended and whether it failed, at the same step
boundary. A job killed, signalled or refused its write (a file-size limit on rank 0) while a
write is in flight resumes exactly from the last complete checkpoint; under ``model-parallel``
with a tensor-parallel plan the folder written in the background equals the synchronous one.

The runs are tests/_async_checkpoint_script.py's (see tests/test_async_checkpoints.py, the same
faults in one process), with ``--strategy``."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest
import torch

from ptrain.checkpoint_io import sharded_meta
from ptrain_fsdp.checkpoint import consolidate
from tests._campaigns import JOB_MODULES
from tests.conftest import REPO
from tests.test_async_checkpoints import STEPS_PER_EPOCH, last, run

pytestmark = [pytest.mark.slow, JOB_MODULES]

#: (strategy, fault): the faults each strategy's runs are put through
CASES = [("fsdp", "kill"), ("fsdp", "sigterm"), ("fsdp", "fill"), ("ddp", "fill")]


def step_of(path) -> int:
    meta = sharded_meta(path) if path.is_dir() else torch.load(path, weights_only=True)
    return meta["loop"]["global_step"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(strategy, fault) -> (its run, the step of last.ckpt right after it, the run resumed
    from there); (strategy, "none"): the run nothing happened to."""
    base = tmp_path_factory.mktemp("async-checkpoint-jobs")
    done = {}
    for strategy in sorted({s for s, _ in CASES}):
        done[strategy, "none"] = (run("none", base / strategy / "none", strategy=strategy),
                                  None, None)
    for strategy, fault in CASES:
        root = base / strategy / fault
        first = run(fault, root, strategy=strategy)
        after = step_of(last(root))
        done[strategy, fault] = (first, after, run("none", root, resume=True, strategy=strategy))
    return done


def assert_resumed_exactly(runs, strategy: str, fault: str) -> None:
    resumed, reference = runs[strategy, fault][2], runs[strategy, "none"][0]
    assert reference.code == 0, reference.output
    assert resumed.code == 0 and resumed.record["ended"] == "complete", resumed.output
    expected = torch.load(reference.root / "final.pt", weights_only=True)
    got = torch.load(resumed.root / "final.pt", weights_only=True)
    assert got.keys() == expected.keys()
    for name, tensor in got.items():
        assert torch.equal(tensor, expected[name]), (name, (tensor - expected[name]).abs().max())


def test_a_job_killed_during_a_sharded_write_resumes_from_the_last_complete_folder(runs):
    killed, after, _ = runs["fsdp", "kill"]
    assert killed.code == -signal.SIGKILL, killed.output
    assert after == killed.record["acted_at"] - STEPS_PER_EPOCH
    assert_resumed_exactly(runs, "fsdp", "kill")
    # the resumed run cleared what the killed write left
    assert not [p for p in last(killed.root).parent.iterdir() if p.name.endswith(".tmp")]


def test_a_signal_during_a_sharded_write_waits_for_it_then_every_rank_saves(runs):
    stopped, after, _ = runs["fsdp", "sigterm"]
    assert stopped.record["ended"] == "Interrupted", stopped.output
    # the ranks agree on the stop at a later boundary; its save came after the write in flight
    assert after == stopped.record["step"] > stopped.record["acted_at"]
    assert_resumed_exactly(runs, "fsdp", "sigterm")


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_a_write_refused_on_one_rank_stops_every_rank_at_the_next_step(runs, strategy):
    full, after, _ = runs[strategy, "fill"]
    assert full.record["ended"] == "CheckpointWriteError", full.output
    assert full.record["step"] == full.record["acted_at"] + 1  # said at the next step boundary
    assert re.match(r"(rank 0: )?could not write checkpoint .*last\.ckpt': File too large "
                    r"\(EFBIG\)", full.record["message"]), full.record["message"]
    assert "the previous last.ckpt there is intact" in full.record["message"]
    assert after == full.record["acted_at"] - STEPS_PER_EPOCH
    assert not [p for p in last(full.root).parent.iterdir() if p.name.endswith(".tmp")]
    assert_resumed_exactly(runs, strategy, "fill")


def test_under_a_tensor_parallel_plan_the_background_checkpoint_equals_the_synchronous_one(
        tmp_path):
    """``model-parallel`` with tensor 2 (tests/_model_parallel_script.py's decoder and plan):
    the shards copied to host memory keep their layout, and the folder written in the
    background holds the weights and Adam state of the synchronous one."""
    written = {}
    for mode in ("sync", "async"):
        argv = [sys.executable, "tests/_model_parallel_script.py", "--root", str(tmp_path / mode),
                "--out", str(tmp_path / f"{mode}-out"), "--devices", "2", "--dp", "1",
                "--shard", "1", "--tensor", "2", "--epochs", "2", "--save",
                *(["--async-save"] if mode == "async" else [])]
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600,
                              start_new_session=True)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert "written synchronously" not in proc.stderr
        consolidate(last(tmp_path / mode), tmp_path / f"{mode}.pt")
        written[mode] = torch.load(tmp_path / f"{mode}.pt", weights_only=True)
    sync, background = written["sync"], written["async"]
    assert sync["loop"]["global_step"] == background["loop"]["global_step"] == 8
    assert sync["model"].keys() == background["model"].keys()
    for name, tensor in sync["model"].items():
        assert torch.equal(tensor, background["model"][name]), name
    states = [w["optimizers"][0]["state"] for w in (sync, background)]
    assert states[0].keys() == states[1].keys() and states[0]
    for index, state in states[0].items():
        for key, value in state.items():
            assert torch.equal(value, states[1][index][key]), (index, key)


def test_a_copy_lost_on_one_rank_is_every_ranks_loss_and_taken_again_at_the_next_step(
        tmp_path):
    """Under ``fsdp`` the folder is written by every rank's writer thread together: the last
    rank's deferred copy finds its shard changed in place, and rank 0's thread, whose copies
    were made, must not wait for it in the write's collectives (it did, and the job hung).
    Every rank drops the save of step 2 and takes it again at step 3."""
    changed = run("change", tmp_path / "change", strategy="fsdp")
    assert changed.code == 0 and changed.record["ended"] == "complete", changed.output
    said = [line for line in changed.output.splitlines() if "was changed in place" in line]
    assert len(said) == 1 and said[0].startswith("ptrain: warning: rank 1: the checkpoint of "
                                                 "step 2 was not written"), said
    folder = last(changed.root).parent
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "step=3.ckpt",
                                                         "step=4.ckpt"]
    assert step_of(folder / "step=3.ckpt") == 3
