"""``model-parallel --model-parallel-context N``: each sequence of a batch split over N processes,
on the CPU with real gloo processes.

Attention over a split sequence is torch's ring attention, which exists for CUDA's attention
kernels only; on the CPU the tests train a model that works token by token
(tests/_context_models.py), so the split computes exactly what the whole sequence does, and
check the rest: the mesh, which tokens each process holds, the gradients averaged over the
context-parallel processes by FSDP, the metrics averaged over them, the sampler splitting by
data-parallel replica only; and every refusal, the CPU's attention among them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ptrain
from tests._campaigns import TWO_PROCESS_RUNS
from tests._cli_util import assert_usage_error
from tests._context_models import TokenMLP, read
from tests.conftest import run_cli

QUIET = ["no:progress-bar", "no:model-summary", "no:tensorboard"]
#: float32 sums in another order: the replicas' mean loss against one process's
RTOL = 1e-5


def fit(root: Path, batch_size: int, prebatched: bool = False, **trainer_options):
    """TokenMLP from seed 0 on 32 sequences of 8 tokens, one epoch: the trainer and the
    records of every process that trained."""
    record = root / "record"
    record.mkdir(parents=True)
    torch.manual_seed(0)
    module = TokenMLP(batch_size=batch_size, record_dir=str(record), prebatched=prebatched)
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, seed=0, callbacks=QUIET,
                             default_root_dir=str(root / "runs"), **trainer_options)
    trainer.fit(module)
    ranks = trainer_options.get("devices", 1)
    return trainer, [read(record, rank) for rank in range(ranks)]


@pytest.mark.slow
@TWO_PROCESS_RUNS
@pytest.mark.parametrize("devices, shard", [(2, 1), (4, 2)], ids=["context2", "shard2-context2"])
def test_split_sequences_train_to_the_losses_of_one_process(tmp_path, devices, shard):
    """Each replica reads batches of 8 sequences (``shard`` replicas make one process's batch
    of ``8 x shard``); the two processes of a replica hold chunks 0 and 3, and 1 and 2, of
    each sequence's four."""
    one, (whole,) = fit(tmp_path / "one", batch_size=8 * shard)
    split, ranks = fit(tmp_path / "split", batch_size=8, strategy="model-parallel",
                       devices=devices,
                       plugin_options={"model-parallel": {"context": 2, "tensor": 1}})
    assert len(whole) == 32 // (8 * shard)
    assert all(len(records) == len(whole) for records in ranks)
    # ranks are laid out dp_shard x cp: ranks 2s and 2s+1 are replica s's two parts
    held = [{tuple(r["positions"]) for r in records} for records in ranks]
    assert held == [{(0, 1, 6, 7)}, {(2, 3, 4, 5)}] * shard
    means = torch.tensor([[r["loss"] for r in records] for records in ranks]).mean(0)
    assert means.tolist() == pytest.approx([r["loss"] for r in whole], rel=RTOL)
    for name in ("train_loss", "val_loss"):  # averaged over the parts and the replicas
        assert split.callback_metrics[name].item() == pytest.approx(
            one.callback_metrics[name].item(), rel=RTOL)


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_the_batches_the_loader_gave_are_left_whole(tmp_path):
    """Each batch a view of the dataset's tensors (``batch_size=None``): the split copies the
    parts, so the dataset is as made after training, and the losses are one process's."""
    _, (whole,) = fit(tmp_path / "one", batch_size=8, prebatched=True)
    _, ranks = fit(tmp_path / "split", batch_size=8, prebatched=True, strategy="model-parallel",
                   devices=2, plugin_options={"model-parallel": {"context": 2}})
    assert [json.loads((tmp_path / "split" / "record" / f"dataset{rank}.json").read_text())
            for rank in (0, 1)] == [True, True]
    means = torch.tensor([[r["loss"] for r in records] for records in ranks]).mean(0)
    assert means.tolist() == pytest.approx([r["loss"] for r in whole], rel=RTOL)


def cli_fit(tmp_path: Path, *args: str):
    return run_cli("fit", "--model", "tests._context_models:TokenMLP", "--accelerator", "cpu",
                   "--strategy", "model-parallel", "--max-epochs", "1", "--no-progress-bar",
                   "--default-root-dir", str(tmp_path), *args)


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--devices", "2", "--model-parallel-context", "4"],
     "--model-parallel-replicate 1 x --model-parallel-context 4 x --model-parallel-tensor 1 "
     "does not divide the 2 processes of this job"),
    (["--devices", "2", "--model-parallel-context", "2", "--model-parallel-mesh-names",
      "lightning"], "which Lightning's 2-D mesh (data_parallel x tensor_parallel, "
                   "--model-parallel-mesh-names lightning) has no name for"),
], ids=["sizes", "lightning-mesh-names"])
def test_a_mesh_context_parallel_cannot_lay_out_is_named_before_any_process_starts(
        tmp_path, args, message):
    assert_usage_error(cli_fit(tmp_path, *args), message)
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.slow
@TWO_PROCESS_RUNS
@pytest.mark.parametrize("args, message", [
    (["--model.length", "6"],
     "--model-parallel-context 2 splits each sequence into 4 chunks (two per process, "
     "balanced for causal attention), and a batch tensor of shape (8, 6, 8) has 6 along "
     "dimension 1, which does not divide by 4"),
    (["--model-parallel-context-dim", "3"],
     "this batch has no tensor with that many dimensions ((8, 8, 8), (8, 8, 2)). Give the "
     "sequence dimension with --model-parallel-context-dim"),
], ids=["length-not-divisible", "no-sequence-tensor"])
def test_a_batch_context_parallel_cannot_split_is_named(tmp_path, args, message):
    result = cli_fit(tmp_path, "--devices", "2", "--model-parallel-context", "2", *args)
    assert_usage_error(result, message)
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_attention_on_the_cpu_is_refused_naming_cuda(tmp_path):
    """The worked decoder's attention (scaled_dot_product_attention) under context 2."""
    result = run_cli("fit", "--config", "examples/decoder.toml", "--devices", "2",
                     "--model-parallel-tensor", "1", "--model-parallel-context", "2",
                     "--max-epochs", "1", "--no-progress-bar", "--default-root-dir",
                     str(tmp_path))
    assert_usage_error(result, "--model-parallel-context splits attention over the sequence "
                               "with torch's ring attention, which covers the CUDA kernels",
                       "ran on the 'cpu' device", "Leave --model-parallel-context at 1 here, "
                                                  "or train on CUDA GPUs")
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_predict_under_context_parallel_is_refused(tmp_path):
    result = run_cli("predict", "--model", "tests._context_models:TokenMLP", "--accelerator",
                     "cpu", "--strategy", "model-parallel", "--devices", "2",
                     "--model-parallel-context", "2", "--no-progress-bar",
                     "--default-root-dir", str(tmp_path))
    assert_usage_error(result, "predict would gather predictions made on parts of sequences",
                       "Predict with --model-parallel-context 1")
