"""``model-parallel`` on 4 real gloo processes: a small Llama-style decoder with a
tensor-parallel plan (``tests/_model_parallel_script.py``) trains to the losses of one process
under ``shard 2 x tensor 2`` and under hybrid ``replicate 2 x shard 2`` (also as ``fsdp
--fsdp-replicate 2``); each rank holds about
1/(shard x tensor) of the parameter and optimizer bytes; processes of one tensor-parallel group
read the same batches; gradient clipping takes the norm over the whole mesh; loss parallel; a
sharded checkpoint, also one left by a job killed mid-epoch, resumes on other mesh shapes
(1 x 4, 2 x 2 hybrid, 4 x 1, 2 processes); bad mesh sizes and bad plans are named.

Tolerance: the 4-process runs split the matmuls and sum the gradients in another order, so
their losses match one process's to a relative 1e-4 (float32; seen: within 3e-7 over 4 steps).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests._campaigns import JOB_MODULES
from tests._model_parallel_script import Decoder
from tests.conftest import REPO
from tests.plugins.strategies.test_configure_model import detail, sub_env

SCRIPT = REPO / "tests" / "_model_parallel_script.py"
pytestmark = [pytest.mark.slow, JOB_MODULES]
RTOL = 1e-4

#: name -> the script's arguments
RUNS = {
    "single-dp2": ["--devices", "1", "--dp", "2"],
    "single-dp4": ["--devices", "1", "--dp", "4"],
    "single-dp2-clip": ["--devices", "1", "--dp", "2", "--clip", "0.5"],
    # also the checkpoint that RESUMED resumes
    "shard2-tensor2": ["--tensor", "2", "--dp", "2", "--save"],
    "hybrid2-shard2": ["--replicate", "2", "--tensor", "1", "--dp", "4"],
    "shard2-tensor2-loss-parallel": ["--tensor", "2", "--dp", "2", "--loss-parallel"],
    # two things in one run, as 4-process runs are the module's cost: built whole, and clipped
    "shard2-tensor2-built-whole-clipped": ["--tensor", "2", "--dp", "2", "--build", "init",
                                           "--clip", "0.5"],
    "shard2-tensor2-sharded-by-the-module": ["--tensor", "2", "--dp", "2", "--self-shard"],
    "fsdp-hybrid2-shard2": ["--strategy", "fsdp", "--replicate", "2", "--dp", "4"],
    # one replica per node: on this one machine, plain sharding over the 4 processes
    "fsdp-replicate-nodes": ["--strategy", "fsdp", "--replicate", "nodes", "--dp", "4"],
    # refused at setup: 2 processes are enough
    "plan-typo": ["--devices", "2", "--tensor", "2", "--plan-typo"],
    "uneven-split": ["--devices", "2", "--tensor", "2", "--hidden", "65"],
    # a NaN loss (a DTensor under loss_parallel) found when last.ckpt is written
    "loss-parallel-nan": ["--devices", "2", "--tensor", "2", "--loss-parallel", "--save",
                          "--nan-step", "2"],
}


#: resumed runs: name -> (the run whose checkpoint they resume, their arguments); each resumes
#: a copy of that run's folder, for a second epoch, reading the same global batches (``--batch``
#: per data-parallel replica: 8 on one, 2 on each of four)
RESUMED = {
    "resumed-tensor4-after-a-kill": ("killed-in-epoch-2", ["--tensor", "4", "--batch", "8"]),
    "resumed-replicate2-tensor2": ("shard2-tensor2", ["--replicate", "2", "--shard", "1",
                                                      "--tensor", "2"]),
    "resumed-shard4": ("shard2-tensor2", ["--tensor", "1", "--batch", "2"]),
    "resumed-2-processes-shard2": ("shard2-tensor2", ["--devices", "2", "--tensor", "1"]),
}
RUNS.update({
    "two-epochs": ["--tensor", "2", "--dp", "2", "--epochs", "2"],
    # rank 0 SIGKILLs the whole job after the first step of epoch 2, the checkpoint of epoch 1
    # on disk
    "killed-in-epoch-2": ["--tensor", "2", "--dp", "2", "--epochs", "2", "--save",
                          "--kill-step", "5"],
})


def run(root: Path, name: str, args: list[str]) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = root / name
    proc = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root / "runs" / name),
                           "--out", str(out), *args], cwd=REPO, env=sub_env(),
                          capture_output=True, text=True, timeout=300,
                          start_new_session=True)  # --kill-step kills its process group
    return proc, [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


class Runs(dict):
    """name -> (the finished process, its ranks' records); ``root`` holds the runs' folders
    (``runs/<name>``)."""

    def __init__(self, root: Path):
        super().__init__()
        self.root = root


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    done = Runs(tmp_path_factory.mktemp("model-parallel"))
    # one at a time: 4 processes on 2 cores
    for name, args in RUNS.items():
        done[name] = run(done.root, name, args)
    for name, (source, args) in RESUMED.items():
        shutil.copytree(done.root / "runs" / source, done.root / "runs" / name)
        done[name] = run(done.root, name, [*args, "--epochs", "2", "--resume"])
    return done


def ok(runs, name) -> list[dict]:
    proc, ranks = runs[name]
    assert proc.returncode == 0, detail(proc)
    return ranks


def mean_over_replicas(ranks: list[dict]) -> list[float]:
    """Each step's loss averaged over the data-parallel replicas (one rank of each)."""
    by_replica = {tuple(rank["data_parallel"]): rank["losses"] for rank in ranks}
    steps = zip(*by_replica.values())
    return [sum(step) / len(by_replica) for step in steps]


@pytest.mark.parametrize("name, single", [("shard2-tensor2", "single-dp2"),
                                          ("hybrid2-shard2", "single-dp4"),
                                          ("fsdp-hybrid2-shard2", "single-dp4"),
                                          ("fsdp-replicate-nodes", "single-dp4"),
                                          ("shard2-tensor2-built-whole-clipped",
                                           "single-dp2-clip"),
                                          ("shard2-tensor2-sharded-by-the-module",
                                           "single-dp2")])
def test_trains_to_the_losses_of_one_process(runs, name, single):
    ranks, (one,) = ok(runs, name), ok(runs, single)
    assert len(ranks) == 4 and len(one["losses"]) == 4
    assert mean_over_replicas(ranks) == pytest.approx(one["losses"], rel=RTOL)
    assert one["losses"][-1] < one["losses"][0]  # it learns


def test_mesh_is_laid_out_as_asked(runs):
    assert [r["mesh"] for r in ok(runs, "shard2-tensor2")] == \
        [{"dp_replicate": 1, "dp_shard": 2, "tp": 2}] * 4
    assert [r["coordinate"] for r in ok(runs, "hybrid2-shard2")] == \
        [[0, 0, 0], [0, 1, 0], [1, 0, 0], [1, 1, 0]]
    # fsdp's hybrid sharding (--fsdp-replicate 2): the same data-parallel mesh, no tensor dim
    assert [r["mesh"] for r in ok(runs, "fsdp-hybrid2-shard2")] == \
        [{"dp_replicate": 2, "dp_shard": 2}] * 4
    assert [r["mesh"] for r in ok(runs, "fsdp-replicate-nodes")] == \
        [{"dp_replicate": 1, "dp_shard": 4}] * 4  # --num-nodes 1


def test_a_tensor_parallel_group_reads_the_same_batches(runs):
    """The sampler splits by data-parallel rank: ranks 0 and 1 (one tensor-parallel pair) are
    replica 0 and see the same losses; ranks 2 and 3 are replica 1, on other data."""
    ranks = ok(runs, "shard2-tensor2")
    assert [r["data_parallel"] for r in ranks] == [[0, 2], [0, 2], [1, 2], [1, 2]]
    assert ranks[0]["losses"] == ranks[1]["losses"]
    assert ranks[2]["losses"] == ranks[3]["losses"]
    assert ranks[0]["losses"] != ranks[2]["losses"]


@pytest.mark.parametrize("name, parts", [("shard2-tensor2", 4), ("hybrid2-shard2", 2),
                                         ("shard2-tensor2-sharded-by-the-module", 4),
                                         ("fsdp-hybrid2-shard2", 2)])
def test_each_rank_holds_its_share_of_parameters_and_optimizer_state(runs, name, parts):
    """About 1/(shard x tensor): all but the norms' weights (1/shard only) are split both
    ways. Adam's state is two tensors per parameter, plus one step count each."""
    for rank in ok(runs, name):
        share = rank["whole_param_bytes"] / parts
        held = rank["held_after_step"]
        assert held["parameters"] == pytest.approx(share, rel=0.02), rank
        assert held["optimizer_state"] == pytest.approx(2 * share, rel=0.05), rank


def test_clipping_takes_the_norm_over_the_whole_mesh(runs):
    """Clipped at 0.5 (below the gradients' norm, so every step is clipped), the 4-process run
    ends where one process does; a norm over this rank's part alone would clip differently."""
    clipped = ok(runs, "shard2-tensor2-built-whole-clipped")
    unclipped = ok(runs, "shard2-tensor2")
    (one,) = ok(runs, "single-dp2-clip")
    assert mean_over_replicas(clipped) == pytest.approx(one["losses"], rel=RTOL)
    assert mean_over_replicas(clipped)[2:] != pytest.approx(mean_over_replicas(unclipped)[2:],
                                                            rel=RTOL)


def test_loss_parallel_trains_on_sharded_logits(runs):
    (one,) = ok(runs, "single-dp2")
    assert mean_over_replicas(ok(runs, "shard2-tensor2-loss-parallel")) == \
        pytest.approx(one["losses"], rel=RTOL)


def test_a_non_finite_loss_parallel_loss_is_named_and_nothing_is_saved(runs):
    proc, _ = runs["loss-parallel-nan"]
    assert proc.returncode != 0
    assert "NonFiniteLossError: the training loss became nan at epoch 0, batch 2 (global " \
        "step 2); training stopped. No checkpoint was written over." in proc.stderr, detail(proc)
    assert not list((runs.root / "runs" / "loss-parallel-nan").rglob("*.ckpt"))


def test_a_plan_key_naming_no_submodule_is_named(runs):
    proc, _ = runs["plan-typo"]
    assert proc.returncode != 0
    assert "names 'feed_forwrd.w2', which matches no submodule" in proc.stderr, detail(proc)
    assert "layers.0.feed_forward" in proc.stderr


def test_a_split_that_is_not_even_is_named(runs):
    proc, _ = runs["uneven-split"]
    assert proc.returncode != 0
    assert ("splits layers.0.feed_forward.w1.weight (shape (65, 32)) along dimension 0 into "
            "--model-parallel-tensor 2 parts, but 65 does not divide by 2") in proc.stderr, \
        detail(proc)


@pytest.mark.parametrize("flags, message", [
    (["--model-parallel-shard", "3", "--model-parallel-tensor", "2"],
     "has 6 places, but this job has 4 processes"),
    (["--model-parallel-replicate", "3"],
     "--model-parallel-replicate 3 x --model-parallel-tensor 4 does not divide the 4 processes"),
    (["--model-parallel-tensor", "0"], "--model-parallel-tensor"),
    # a precision the combination can't run: said by the ranks, at start-up
    (["--model-parallel-tensor", "2", "--precision", "16-mixed"],
     "--precision 16-mixed scales the loss"),
])
def test_mesh_sizes_and_a_precision_that_do_not_fit_are_usage_errors(tmp_path, flags, message):
    """Said before any training step (the CLI, exit 2); the sizes before any process starts."""
    proc = subprocess.run(
        [sys.executable, "-m", "ptrain", "fit", "--model", "_model_parallel_script:Decoder",
         "--strategy", "model-parallel", "--devices", "4", "--accelerator", "cpu",
         "--default-root-dir", str(tmp_path), *flags],
        cwd=REPO, env={**sub_env(), "PYTHONPATH": str(REPO / "tests")},
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, detail(proc)
    assert message in proc.stderr, detail(proc)
    assert "Traceback" not in proc.stderr


def test_the_killed_run_was_killed(runs):
    proc, ranks = runs["killed-in-epoch-2"]
    assert proc.returncode == -signal.SIGKILL, detail(proc)
    assert ranks == []  # no rank got to its teardown


@pytest.mark.parametrize("name", list(RESUMED))
def test_a_checkpoint_resumes_on_another_mesh_shape(runs, name):
    """A sharded checkpoint of ``shard 2 x tensor 2`` after one epoch (written by a finished
    run, or by one killed in its second epoch) resumed for a second epoch on ``1 x tensor 4``,
    ``replicate 2 x tensor 2``, ``shard 4 x 1`` and on 2 processes without tensor parallelism,
    each reading the same global batches: the second epoch's losses are the uninterrupted
    run's."""
    unbroken = ok(runs, "two-epochs")
    resumed = ok(runs, name)
    assert len(resumed[0]["losses"]) == 4
    assert mean_over_replicas(resumed) == pytest.approx(mean_over_replicas(unbroken)[4:],
                                                        rel=RTOL)


def test_export_gathers_the_shards_into_the_whole_model(runs, tmp_path):
    """``ptrain export`` of the ``shard 2 x tensor 2`` checkpoint (DTensors split both ways)
    writes whole tensors, which load strictly into the module built whole on one process."""
    ok(runs, "shard2-tensor2")
    (checkpoint,) = runs.root.glob("runs/shard2-tensor2/**/checkpoints/last.ckpt")
    out = tmp_path / "decoder.safetensors"
    proc = subprocess.run([sys.executable, "-m", "ptrain", "export", str(checkpoint),
                           "--output", str(out)], cwd=REPO, env=sub_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, detail(proc)
    whole = Decoder(build="init")
    exported = load_file(out)
    loaded = whole.load_state_dict(exported, strict=True)
    assert not loaded.missing_keys and not loaded.unexpected_keys
    assert {k: tuple(v.shape) for k, v in exported.items()} == \
        {k: tuple(v.shape) for k, v in whole.state_dict().items()}


def test_the_decoder_example_trains_from_its_config_file(tmp_path):
    """``ptrain fit --config examples/decoder.toml``: 4 processes, shard 2 x tensor 2; its
    sharded checkpoint exported loads into the example's module built on one process."""
    proc = subprocess.run(
        [sys.executable, "-m", "ptrain", "fit", "--config", "examples/decoder.toml",
         "--max-epochs", "2", "--default-root-dir", str(tmp_path / "runs"), "--no-progress-bar"],
        cwd=REPO, env=sub_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, detail(proc)
    assert "train_loss=" in proc.stdout, detail(proc)
    (checkpoint,) = (tmp_path / "runs").rglob("last.ckpt")
    assert checkpoint.is_dir()  # sharded
    out = tmp_path / "decoder.safetensors"
    export = subprocess.run([sys.executable, "-m", "ptrain", "export", str(checkpoint),
                             "--output", str(out)], cwd=REPO, env=sub_env(),
                            capture_output=True, text=True, timeout=120)
    assert export.returncode == 0, detail(export)
    from examples.decoder import Decoder as Example

    whole = Example(samples=256, batch_size=16, build="init")
    loaded = whole.load_state_dict(load_file(out), strict=True)
    assert not loaded.missing_keys and not loaded.unexpected_keys
