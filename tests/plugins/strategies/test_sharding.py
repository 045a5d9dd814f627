"""The sharding strategies ``zero1``, ``zero2``, ``zero3`` and ``fsdp`` (with ``ddp`` as the
unsharded baseline), in real 2-rank gloo jobs on the CPU; nothing of torch is mocked.

- The same model, data, seed and optimizer (SGD with momentum, gradient clipping by norm,
  accumulate_grad_batches=2) end with the same parameters under every strategy; checked
  against ``ddp`` and against a plain single-process computation of 2-rank data parallelism.
- Per-rank memory, measured on each rank with :func:`ptrain.distributed.held_bytes`.
- Sharded checkpoints: exact resume after SIGKILL of the whole job, ``ptrain-consolidate`` into
  a single file that loads with ``weights_only=True`` and resumes single-device, atomic writes.
- Start-up errors: loss-scaling precision, ``wrap_classes`` naming no module of the model;
  ``bf16-mixed`` trains. (Activation checkpointing is the ``activation-checkpointing``
  callback's, under every strategy: its fsdp run is in
  ``tests/plugins/callbacks/test_activation_checkpointing.py``.)

A 2-rank job costs ~5-10 s (a Python start and a torch import per worker), so each
configuration runs once (the ``runs`` fixture, shared by the tests reading it) and the runs that
are independent processes are started together.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import ptrain
from _shard_models import RunProbe, SetupProbe, ShardNet, ValidatedShardNet
from _shard_resume_script import (EVERY_N_TRAIN_STEPS, MAX_EPOCHS as RESUME_EPOCHS,
                                  MODEL_ARGS as RESUME_MODEL_ARGS)
from ptrain import CheckpointError
from ptrain_fsdp.checkpoint import consolidate
from tests._campaigns import JOB_MODULES

pytestmark = [pytest.mark.slow, JOB_MODULES]

TESTS = Path(__file__).resolve().parents[2]
REPO = TESTS.parent
RESUME_SCRIPT = TESTS / "_shard_resume_script.py"
CONSOLIDATE = Path(sys.executable).parent / "ptrain-consolidate"  # the console script
QUIET = ["no:progress-bar", "no:tensorboard"]

WORLD_SIZE = 2
#: ShardNet's defaults otherwise: width 256, depth 4, SGD with momentum 0.9, shuffled data,
#: 64 samples in batches of 8 per rank (4 batches per rank per epoch), no dropout.
MODEL_ARGS = dict(lr=0.02)
CLIP = 0.5  # well below the gradient norms of this model (asserted): every step is clipped
ACCUMULATE = 2
EPOCHS = 2
STEPS = EPOCHS * (64 // (8 * WORLD_SIZE)) // ACCUMULATE  # 4 optimizer steps
TRAIN = dict(max_epochs=EPOCHS, seed=0, accumulate_grad_batches=ACCUMULATE,
             gradient_clip_val=CLIP, gradient_clip_algorithm="norm")

#: Stated tolerance for "the same parameters": float32 reductions summed in another order
#: (a reduce-scatter of shards vs DDP's bucketed all-reduce, a clip norm summed from per-shard
#: norms) differ in the last bits; over 4 steps that stays far below 1e-5 (measured: 1.5e-8),
#: while a wrongly scaled or wrongly clipped step moves parameters by ~1e-2 (see
#: test_reference_is_sensitive_to_clipping_and_accumulation).
PARAM_ATOL = 1e-5

#: Stated tolerances of the memory ratios (a rank's bytes / ddp's bytes on a rank):
#: - FSDP2 (zero2, zero3, fsdp) splits every tensor along dim 0 into 2 nearly equal shards; only
#:   tensors whose first dim is odd (the head's 1x256 weight and its bias, 0.1% of the bytes)
#:   land on one rank alone, so each rank holds 0.5 +- 0.001: 0.45-0.55 allowed.
#: - ZeroRedundancyOptimizer (zero1) partitions whole parameters among the ranks, balancing
#:   sizes greedily; one 256x256 weight is ~24% of the state, so the split is only as even as
#:   whole tensors allow: 0.35-0.65 allowed.
HALF = (0.45, 0.55)
PARTITION = (0.35, 0.65)
FULL = (1.0, 1.0)
EXPECTED_MEMORY = {
    "ddp": {"parameters": FULL, "gradients": FULL, "optimizer_state": FULL},
    "zero1": {"parameters": FULL, "gradients": FULL, "optimizer_state": PARTITION},
    # zero2 keeps each unit's gathered parameters from its forward to its backward only;
    # between steps (where held_bytes looks) they are sharded too, as its docs say
    "zero2": {"parameters": HALF, "gradients": HALF, "optimizer_state": HALF},
    "zero3": {"parameters": HALF, "gradients": HALF, "optimizer_state": HALF},
    "fsdp": {"parameters": HALF, "gradients": HALF, "optimizer_state": HALF},
}

#: bf16-mixed vs 32-true, same run: bfloat16 keeps 8 significant bits (relative rounding
#: ~4e-3 per operation) in the forward pass; the weights, gradients and optimizer state stay
#: float32 and every step is clipped. Measured: final loss 0.8% apart, parameters 4e-5 apart.
#: Allowed: loss within 5% (relative) and parameters within 1e-3 of 32-true's, yet more than
#: 1e-7 apart (float32 reduction-order noise is 1.5e-8: bfloat16 numerics really were used).
BF16_LOSS_RTOL = 0.05
BF16_PARAM_ATOL = 1e-3
BF16_PARAM_MIN = 1e-7


# ---------------------------------------------------------------------------------------------
# The reference: 2-rank data parallelism computed in this process, with plain torch


def data_parallel_reference(clip: float | None = CLIP, accumulate: int = ACCUMULATE,
                            epochs: int = EPOCHS) -> tuple[dict[str, torch.Tensor], list[float]]:
    """What 2-rank data-parallel training must compute: each rank's batch comes from a
    ``DistributedSampler`` (shuffled with seed 0, ``set_epoch`` per epoch), each rank's loss is
    divided by the accumulation factor, the gradients are averaged over the ranks and summed
    over the window, then clipped by their global norm and stepped. Returns the final parameters
    and the gradient norms before clipping."""
    module = ShardNet(**MODEL_ARGS)
    optimizer = module.configure_optimizers()
    loaders = [DataLoader(module.train_set, batch_size=module.batch_size,
                          sampler=DistributedSampler(module.train_set, num_replicas=WORLD_SIZE,
                                                     rank=rank, shuffle=True, seed=0))
               for rank in range(WORLD_SIZE)]
    norms = []
    for epoch in range(epochs):
        for loader in loaders:
            loader.sampler.set_epoch(epoch)
        batches = [list(loader) for loader in loaders]
        for i in range(len(batches[0])):
            for rank in range(WORLD_SIZE):
                x, y = batches[rank][i]
                loss = torch.nn.functional.mse_loss(module(x), y) / accumulate / WORLD_SIZE
                loss.backward()
            if (i + 1) % accumulate == 0 or i + 1 == len(batches[0]):
                params = list(module.parameters())
                norms.append(float(torch.linalg.vector_norm(
                    torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))))
                if clip is not None:
                    torch.nn.utils.clip_grad_norm_(params, clip)
                optimizer.step()
                optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in module.state_dict().items()}, norms


@pytest.fixture(scope="module")
def reference():
    return data_parallel_reference()


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def full_bytes() -> int:
    return sum(p.numel() * p.element_size() for p in ShardNet(**MODEL_ARGS).parameters())


# ---------------------------------------------------------------------------------------------
# The in-process 2-rank runs, one per configuration, shared by the tests that read them


@dataclass
class Run:
    params: dict[str, torch.Tensor]  # the launching process's module after fit (rank 0's)
    metrics: dict[str, float]
    global_step: int
    ranks: list[dict]  # what RunProbe wrote on each rank
    log_dir: Path


class Runs:
    def __init__(self, root: Path):
        self.root = root
        self.done: dict[str, Run | BaseException] = {}

    def get(self, name: str, strategy: str, **options) -> Run:
        if name not in self.done:
            try:
                self.done[name] = self._fit(name, strategy, **options)
            except Exception as exc:  # every test reading this run reports the same error
                self.done[name] = exc
        result = self.done[name]
        if isinstance(result, BaseException):
            raise result
        return result

    def _fit(self, name: str, strategy: str, precision: str = "32-true",
             plugin_options: dict | None = None) -> Run:
        out = self.root / name
        module = ShardNet(**MODEL_ARGS)
        trainer = ptrain.Trainer(strategy=strategy, devices=WORLD_SIZE, accelerator="cpu",
                                 precision=precision, default_root_dir=str(out / "runs"),
                                 callbacks=[*QUIET, RunProbe(str(out / "probe"))],
                                 plugin_options=plugin_options, **TRAIN)
        trainer.fit(module)
        ranks = [json.loads((out / "probe" / f"rank{r}.json").read_text())
                 for r in range(WORLD_SIZE)]
        return Run({k: v.detach().clone() for k, v in module.state_dict().items()},
                   {k: float(v) for k, v in trainer.callback_metrics.items()},
                   trainer.global_step, ranks, out / "runs" / "version_0")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("sharding-runs"))


# ---------------------------------------------------------------------------------------------
# 1. The same parameters as ddp


def test_reference_is_sensitive_to_clipping_and_accumulation(reference):
    """The comparisons below can only catch a wrong clip or accumulation if those change the
    result by much more than PARAM_ATOL: every step's gradient norm is above the clip value, and
    leaving out clipping or accumulation moves the parameters by >100x the tolerance."""
    params, norms = reference
    assert len(norms) == STEPS
    assert min(norms) > 2 * CLIP, norms
    unclipped, _ = data_parallel_reference(clip=None)
    assert max_difference(params, unclipped) > 100 * PARAM_ATOL
    not_accumulated, _ = data_parallel_reference(accumulate=1)
    assert max_difference(params, not_accumulated) > 100 * PARAM_ATOL


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp"])
def test_final_parameters_match_data_parallel_reference(runs, reference, strategy):
    run = runs.get(strategy, strategy)
    assert run.global_step == STEPS
    assert all(rank["global_step"] == STEPS and rank["world_size"] == WORLD_SIZE
               for rank in run.ranks)
    difference = max_difference(run.params, reference[0])
    assert difference <= PARAM_ATOL, f"{strategy}: max |param - reference| = {difference}"


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3", "fsdp"])
def test_final_parameters_match_ddp(runs, strategy):
    ddp, run = runs.get("ddp", "ddp"), runs.get(strategy, strategy)
    assert run.global_step == ddp.global_step == STEPS
    difference = max_difference(run.params, ddp.params)
    assert difference <= PARAM_ATOL, f"{strategy}: max |param - ddp's| = {difference}"


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp"])
def test_each_rank_owns_its_parameters(runs, strategy):
    """No rank's parameters live in memory another process can write. (Handed to spawned
    workers through torch.multiprocessing's pickling, a module's tensors are moved to shared
    memory: under ddp every rank then stepped the same storage, each update applied once per
    rank; zero1's partitioned step hid it.)"""
    run = runs.get(strategy, strategy)
    for rank, probe in enumerate(run.ranks):
        assert probe["parameters_shared"] and not any(probe["parameters_shared"]), (
            f"rank {rank}: parameters in shared memory: {probe['parameters_shared']}")


# ---------------------------------------------------------------------------------------------
# 2. Per-rank memory


@pytest.mark.parametrize("strategy", list(EXPECTED_MEMORY))
def test_memory_held_per_rank(runs, strategy):
    """held_bytes at the last step's on_before_optimizer_step (gradients complete, optimizer
    state of the earlier steps present), on each rank, against ddp's full sizes: a model's
    parameters, one gradient each, one momentum buffer each (SGD with momentum)."""
    run = runs.get(strategy, strategy)
    full = full_bytes()
    last = [probe["records"][-1] for probe in run.ranks]
    print(strategy, {kind: [round(held[kind] / full, 4) for held in last] for kind in last[0]})
    assert all(len(probe["records"]) == STEPS for probe in run.ranks)
    for kind, (low, high) in EXPECTED_MEMORY[strategy].items():
        ratios = [held[kind] / full for held in last]
        assert all(low <= r <= high for r in ratios), (
            f"{strategy} {kind}: per-rank ratios {ratios} not in [{low}, {high}] of {full} bytes")
        if (low, high) != FULL:  # sharded: the shards together hold everything exactly once
            assert sum(held[kind] for held in last) == full, (strategy, kind, last)


def test_ddp_memory_is_the_baseline(runs):
    """ddp holds, on both ranks, what the memory test divides by (full_bytes)."""
    run = runs.get("ddp", "ddp")
    for probe in run.ranks:
        assert probe["records"][-1] == {"parameters": full_bytes(), "gradients": full_bytes(),
                                        "optimizer_state": full_bytes()}


# ---------------------------------------------------------------------------------------------
# 5. Precision: bf16-mixed trains; 16-mixed (loss scaling) is refused (CLI runs further down)


def test_bf16_mixed_fsdp_trains_close_to_32_true(runs):
    full, bf16 = runs.get("fsdp", "fsdp"), runs.get("fsdp-bf16", "fsdp", precision="bf16-mixed")
    assert bf16.global_step == STEPS
    loss, reference_loss = bf16.metrics["train_loss"], full.metrics["train_loss"]
    assert math.isfinite(loss)
    assert abs(loss - reference_loss) <= BF16_LOSS_RTOL * abs(reference_loss), (
        loss, reference_loss)
    difference = max_difference(bf16.params, full.params)
    print(f"bf16-mixed vs 32-true: loss {loss} vs {reference_loss}, max |param diff| {difference}")
    assert difference <= BF16_PARAM_ATOL, difference
    # trained in bfloat16 numerics, not silently in float32
    assert difference > BF16_PARAM_MIN, difference
    assert all(v.dtype == torch.float32 for v in bf16.params.values())  # float32 weights kept


# ---------------------------------------------------------------------------------------------
# 7. Sharded checkpoint writes are atomic: nothing of a write is left after a completed run


def assert_clean_sharded_checkpoint(checkpoints: Path) -> None:
    assert sorted(os.listdir(checkpoints)) == ["last.ckpt"], (
        f"left in {checkpoints}: {sorted(os.listdir(checkpoints))}")
    last = checkpoints / "last.ckpt"
    assert last.is_dir()
    assert {".metadata", "meta.pt", "__0_0.distcp", "__1_0.distcp"} <= set(os.listdir(last))


@pytest.mark.parametrize("strategy", ["zero2", "zero3", "fsdp"])
def test_sharded_checkpoint_leaves_no_temporary_or_old_folder(runs, strategy):
    """Each of these runs wrote last.ckpt at the end of both epochs: the second write replaced
    the first through .last.ckpt.tmp and .last.ckpt.old, neither of which may remain."""
    run = runs.get(strategy, strategy)
    assert_clean_sharded_checkpoint(run.log_dir / "checkpoints")
    meta = torch.load(run.log_dir / "checkpoints" / "last.ckpt" / "meta.pt", weights_only=True)
    assert meta["loop"]["global_step"] == STEPS


# ---------------------------------------------------------------------------------------------
# 3. Resume after SIGKILL of the whole job (fsdp), in subprocesses of their own sessions


def start_script(root: Path, out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(RESUME_SCRIPT), "--root", str(root),
                             "--out", str(out), *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"the run did not finish in {timeout} s:\n{output}")
    return proc.returncode, output


KILL_STEP = 7  # 4 steps per epoch: killed in epoch 1, after the checkpoint of step 6


@dataclass
class ResumeRuns:
    reference_root: Path
    reference: dict
    full_optimizer_state: dict
    killed_rc: int
    killed_output: str
    killed_out_exists: bool
    checkpoint_after_kill: dict
    files_after_kill: set[str]
    resumed_root: Path
    resumed: dict


@pytest.fixture(scope="module")
def resume_runs(tmp_path_factory) -> ResumeRuns:
    tmp = tmp_path_factory.mktemp("sharded-resume")
    reference = start_script(tmp / "reference", tmp / "reference.pt",
                             "--full-state-out", str(tmp / "full_state.pt"))
    try:
        killed = start_script(tmp / "run", tmp / "run.pt", "--kill-step", str(KILL_STEP))
        killed_rc, killed_output = finish(killed)
    finally:
        reference_rc, reference_output = finish(reference)
    assert reference_rc == 0, f"the uninterrupted run failed:\n{reference_output}"
    last = tmp / "run" / "version_0" / "checkpoints" / "last.ckpt"
    killed_out_exists = (tmp / "run.pt").exists()
    files = set(os.listdir(last)) if last.is_dir() else set()
    meta = torch.load(last / "meta.pt", weights_only=True) if (last / "meta.pt").is_file() else {}
    rc, output = finish(start_script(tmp / "run", tmp / "run.pt", "--resume"))
    assert rc == 0, f"the resumed run failed:\n{output}"
    return ResumeRuns(tmp / "reference", torch.load(tmp / "reference.pt", weights_only=True),
                      torch.load(tmp / "full_state.pt", weights_only=True),
                      killed_rc, killed_output, killed_out_exists, meta, files, tmp / "run",
                      torch.load(tmp / "run.pt", weights_only=True))


def test_fsdp_resume_after_sigkill_of_the_job_is_exact(resume_runs):
    r = resume_runs
    assert r.killed_rc == -signal.SIGKILL, (
        f"expected the job to be SIGKILLed, got {r.killed_rc}:\n{r.killed_output}")
    assert not r.killed_out_exists
    # the kill left the sharded checkpoint of step 6 (epoch 1 after its 2nd batch), complete
    assert {".metadata", "meta.pt", "__0_0.distcp", "__1_0.distcp"} <= r.files_after_kill
    loop = r.checkpoint_after_kill["loop"]
    assert (loop["epoch"], loop["batch"], loop["global_step"]) == (1, 2, 2 * EVERY_N_TRAIN_STEPS)
    steps = RESUME_EPOCHS * 64 // (8 * WORLD_SIZE)
    assert r.resumed["global_step"] == r.reference["global_step"] == steps
    assert r.resumed["params"].keys() == r.reference["params"].keys()
    for name, value in r.reference["params"].items():
        assert torch.equal(r.resumed["params"][name], value), (
            f"{name}: max difference {(r.resumed['params'][name] - value).abs().max().item()}")
    assert r.resumed["metrics"] == r.reference["metrics"]


def test_resumed_sharded_runs_leave_no_temporary_or_old_folder(resume_runs):
    for root in (resume_runs.reference_root, resume_runs.resumed_root):
        assert_clean_sharded_checkpoint(root / "version_0" / "checkpoints")


# ---------------------------------------------------------------------------------------------
# 4. ptrain-consolidate


@pytest.fixture(scope="module")
def consolidated(resume_runs, tmp_path_factory) -> Path:
    src = resume_runs.reference_root / "version_0" / "checkpoints" / "last.ckpt"
    dst = tmp_path_factory.mktemp("consolidated") / "whole.ckpt"
    proc = subprocess.run([str(CONSOLIDATE), str(src), str(dst)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert str(dst) in proc.stdout
    return dst


def test_consolidate_writes_one_file_of_the_full_state(resume_runs, consolidated):
    assert consolidated.is_file()
    checkpoint = torch.load(consolidated, map_location="cpu", weights_only=True)
    reference = resume_runs.reference
    # the full parameters, equal to the trained module's
    assert checkpoint["model"].keys() == reference["params"].keys()
    for name, value in reference["params"].items():
        assert checkpoint["model"][name].shape == value.shape
        assert torch.equal(checkpoint["model"][name], value), name
    # the optimizer state in Optimizer.state_dict() layout: position i is the module's i-th
    # parameter; equal to the whole state gathered by name at the end of the run
    names = [n for n, _ in ShardNet(**RESUME_MODEL_ARGS).named_parameters()]
    full = resume_runs.full_optimizer_state["optimizer"]
    [optimizer] = checkpoint["optimizers"]
    assert [g["params"] for g in optimizer["param_groups"]] == [list(range(len(names)))]
    assert sorted(optimizer["state"]) == list(range(len(names)))
    for i, name in enumerate(names):
        assert optimizer["state"][i].keys() == full["state"][name].keys()
        for field, value in full["state"][name].items():
            assert torch.equal(torch.as_tensor(optimizer["state"][i][field]),
                               torch.as_tensor(value)), (name, field)
    assert checkpoint["loop"]["global_step"] == resume_runs.reference["global_step"]
    assert "num_optimizers" not in checkpoint


def test_consolidated_checkpoint_resumes_single_device(resume_runs, consolidated, tmp_path):
    checkpoint = torch.load(consolidated, map_location="cpu", weights_only=True)
    probe = SetupProbe()
    module = ShardNet(**RESUME_MODEL_ARGS)
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=RESUME_EPOCHS + 1, seed=0,
                             default_root_dir=str(tmp_path / "runs"), callbacks=[*QUIET, probe])
    assert trainer.options["strategy"] == "single-device"
    trainer.fit(module, ckpt_path=str(consolidated))
    # restored: the parameters and the optimizer state of the fsdp run
    for name, value in checkpoint["model"].items():
        assert torch.equal(probe.params[name], value), name
    for i, state in checkpoint["optimizers"][0]["state"].items():
        for field, value in state.items():
            assert torch.equal(torch.as_tensor(probe.optimizer["state"][i][field]),
                               torch.as_tensor(value)), (i, field)
    # and went on from step 12: one more epoch is 8 single-device batches
    start = checkpoint["loop"]["global_step"]
    assert trainer.global_step == start + 64 // 8
    assert all(int(s["step"]) == start + 8
               for s in trainer.optimizers[0].state_dict()["state"].values())
    assert trainer.lr_schedulers[0]["scheduler"].last_epoch == start + 8
    assert math.isfinite(float(trainer.callback_metrics["train_loss"]))


def test_a_sharded_checkpoint_validates_with_no_optimizer_to_restore(resume_runs, consolidated,
                                                                   tmp_path):
    """``validate`` from a sharded folder (fsdp, 2 ranks) gives the metrics of the same weights
    validated in one process from the consolidated file."""
    last = resume_runs.reference_root / "version_0" / "checkpoints" / "last.ckpt"
    proc = subprocess.run([sys.executable, str(TESTS / "_shard_validate_script.py"), str(last),
                           str(tmp_path / "sharded.json")], cwd=REPO, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [sharded] = json.loads((tmp_path / "sharded.json").read_text())
    [whole] = ptrain.Trainer(accelerator="cpu", seed=0, default_root_dir=str(tmp_path / "one"),
                           callbacks=QUIET).validate(ValidatedShardNet(**RESUME_MODEL_ARGS),
                                                     ckpt_path=str(consolidated))
    assert sharded["val_loss"] == pytest.approx(whole["val_loss"], rel=1e-5)


def test_consolidate_refuses_a_path_that_is_not_sharded(consolidated, tmp_path):
    dst = tmp_path / "out.ckpt"
    proc = subprocess.run([str(CONSOLIDATE), str(consolidated), str(dst)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("ptrain-consolidate: error:"), proc.stderr
    assert "not a sharded checkpoint folder" in proc.stderr and str(consolidated) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not dst.exists()
    with pytest.raises(CheckpointError, match="not a sharded checkpoint folder"):
        consolidate(tmp_path, dst)  # a folder without .metadata


# ---------------------------------------------------------------------------------------------
# 5 and 6 through the CLI: usage errors at start-up, exit code 2


CLI_FAILURES = {
    "16-mixed-fsdp": ["--strategy", "fsdp", "--precision", "16-mixed"],
    "16-mixed-zero3": ["--strategy", "zero3", "--precision", "16-mixed"],
    "wrap-classes-missing": ["--strategy", "fsdp", "--fsdp-wrap-classes", "Block,NoSuchBlock"],
}


@pytest.fixture(scope="module")
def cli_failures(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """The CLI runs that must fail, started together (each is a 2-rank job)."""
    tmp = tmp_path_factory.mktemp("cli-failures")
    procs = {}
    for name, args in CLI_FAILURES.items():
        root = tmp / name
        command = [sys.executable, "-m", "ptrain", "fit", "--model", "tests._shard_models:ShardNet",
                   "--accelerator", "cpu", "--devices", "2", "--max-epochs", "1",
                   "--default-root-dir", str(root), "--no-progress-bar", "-p", "no:tensorboard",
                   *args]
        procs[name] = (subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True), root, command)
    results = {}
    for name, (proc, root, command) in procs.items():
        stdout, stderr = proc.communicate(timeout=240)
        results[name] = (subprocess.CompletedProcess(command, proc.returncode, stdout, stderr),
                         root)
    return results


def assert_usage_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    """A usage error as cli.py promises it: exit code 2 and one ``ptrain: error:`` paragraph
    on stderr (no traceback, nothing logged by torch before it), naming every needle."""
    detail = f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert result.returncode == 2, detail
    assert "Traceback" not in result.stderr + result.stdout, detail
    assert result.stderr.startswith("ptrain: error:"), detail
    assert result.stderr.count("ptrain: error:") == 1, detail
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} is not in the message\n{detail}"


@pytest.mark.parametrize("strategy", ["fsdp", "zero3"])
def test_loss_scaling_precision_is_refused_at_start_up(cli_failures, strategy):
    result, root = cli_failures[f"16-mixed-{strategy}"]
    assert_usage_error(result, "16-mixed", "bf16-mixed", strategy)
    assert not list(root.rglob("last.ckpt")), "it trained before refusing"


def test_wrap_classes_naming_a_missing_class_lists_the_model_classes(cli_failures):
    result, root = cli_failures["wrap-classes-missing"]
    assert_usage_error(result, "wrap_classes", "'NoSuchBlock'", "Block", "Linear", "ModuleList",
                       "ShardNet")
    assert not list(root.rglob("last.ckpt"))

