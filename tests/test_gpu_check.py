"""``scripts/gpu-check.sh --reduced``: issue 14's GPU check runs its plumbing on this CPU machine.

Every step runs: the CUDA tests and the conformance suite on ``cuda`` skip, each saying why; the
benchmark's three runners train the tiny decoder and convnet on the CPU from the same weights on
the same batches, so ptrain and the hand-written loop end at the same loss; the configurations
the CPU cannot run are listed with the reason; the activation-checkpointing section finds a batch
size with ptrain's finder. On a GPU the same command, without ``--reduced``, does the real work.
"""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET

import pytest
import torch

from tests.conftest import REPO
from tests._campaigns import WHOLE_TOOL_RUNS

pytestmark = [pytest.mark.slow, WHOLE_TOOL_RUNS,
              pytest.mark.skipif(torch.cuda.is_available(),
                                 reason="a GPU is here: run scripts/gpu-check.sh itself")]


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    proc = subprocess.run(["bash", "scripts/gpu-check.sh", "--reduced", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    return proc, out


def skip_messages(report) -> list[str]:
    return [s.get("message", "") for case in ET.parse(report).getroot().iter("testcase")
            for s in case if s.tag == "skipped"]


def test_every_step_runs_and_passes(reduced):
    proc, out = reduced
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    rows = (out / "summary.md").read_text().splitlines()
    assert [row.split("|")[1].strip() for row in rows] == [
        "environment", "cuda-tests", "conformance-cuda", "bench-decoder", "bench-conv",
        "bench-mlp", "bench-fp8", "bench-ac", "bench-data", "bench-tune", "bench-ckpt"]
    assert all("| passed |" in row for row in rows), rows


def test_the_gpu_tests_skip_saying_why(reduced):
    _, out = reduced
    cuda = skip_messages(out / "cuda-tests.xml")
    assert cuda and all("needs a CUDA GPU" in m for m in cuda), cuda
    conformance = skip_messages(out / "conformance-cuda.xml")
    assert conformance and all("can't run on this machine" in m for m in conformance)


def test_ptrain_and_the_hand_loop_end_at_the_same_loss(reduced):
    _, out = reduced
    for workload in ("decoder", "conv", "mlp"):
        results = json.loads((out / workload / "gpu.json").read_text())["matrix"]
        ran = {(r["arm"]["precision"], r["arm"]["runner"]): r for r in results
               if "final_loss" in r}
        assert {runner for _, runner in ran} == {"hand", "ptrain", "lightning"}
        for (precision, runner), result in ran.items():
            hand = ran[(precision, "hand")]
            assert result["final_loss"] == pytest.approx(hand["final_loss"], rel=1e-4), \
                (workload, precision, runner)
            assert result["final_loss"] < result["first_loss"]  # it trained
            assert result["samples_per_s"] > 0 and result["flops_per_step"] > 0
        skipped = [r for r in results if "skipped" in r]
        assert all(r["skipped"] for r in skipped)
        if workload == "conv":  # cuDNN benchmark is offered, and the CPU says why it can't
            assert {r["arm"]["cudnn_benchmark"] for r in skipped} == {True}
            assert all("only on CUDA" in r["skipped"] for r in skipped)
        assert not [r for r in results if "error" in r]
        assert "| configuration | runner |" in (out / workload / "gpu.md").read_text()


def test_the_fp8_section_trains_ptrain_and_the_hand_loop_alike_in_emulation(reduced):
    """On the CPU the fp8 arms run in torchao's emulation: ptrain's fp8-mixed and the hand
    loop's own conversion of the same layers end at the same loss, which is not bf16-mixed's
    (float8 rounding ran); Lightning's fp8 arm is skipped with the reason."""
    _, out = reduced
    fp8 = json.loads((out / "fp8" / "gpu.json").read_text())["fp8"]
    ran = {(r["arm"]["precision"], r["arm"]["runner"]): r for r in fp8 if "final_loss" in r}
    assert set(ran) == {("bf16-mixed", "hand"), ("bf16-mixed", "ptrain"),
                        ("bf16-mixed", "lightning"), ("fp8-mixed", "hand"),
                        ("fp8-mixed", "ptrain")}
    for (precision, runner), result in ran.items():
        assert result["final_loss"] == pytest.approx(ran[(precision, "hand")]["final_loss"],
                                                     rel=1e-4), (precision, runner)
        assert result["final_loss"] < result["first_loss"]
    assert ran[("fp8-mixed", "hand")]["final_loss"] != ran[("bf16-mixed", "hand")]["final_loss"]
    (lightning,) = [r for r in fp8 if "skipped" in r]
    assert "Lightning has no torchao float8 precision" in lightning["skipped"]
    table = (out / "fp8" / "gpu.md").read_text()
    assert "| fp8-mixed | ptrain |" in table and "MFU (fp8 peak)" in table


def test_the_activation_checkpointing_section_finds_a_batch_size(reduced):
    _, out = reduced
    ac = json.loads((out / "ac" / "gpu.json").read_text())["ac"]
    assert [r["checkpointed"] for r in ac] == [False, True]
    assert all(r["found"] >= 1 and r["trials"] for r in ac), ac


def test_the_data_section_trains_every_loader_on_the_same_images(reduced):
    """Each runner with the naive loader and its faster one (the hand loop's and Lightning's
    tuned by hand, ptrain's with the dataloading advice applied) trains on the images made per
    item, and all end at the same loss: the loaders change the speed, never the data."""
    _, out = reduced
    data = json.loads((out / "data" / "gpu.json").read_text())["data"]
    assert {(r["arm"]["runner"], r["arm"]["loading"]) for r in data} == {
        ("hand", "naive"), ("hand", "tuned"), ("ptrain", "naive"), ("ptrain", "advice"),
        ("lightning", "naive"), ("lightning", "tuned")}
    losses = [r["final_loss"] for r in data]
    assert losses == pytest.approx([losses[0]] * len(losses), rel=1e-4), data
    assert all(r["final_loss"] < r["first_loss"] for r in data)
    assert "### data loading" in (out / "data" / "gpu.md").read_text()


def test_ptrain_tune_runs_on_the_digits_example(reduced):
    _, out = reduced
    log = (out / "bench-tune.log").read_text()
    assert "ptrain tune --config" in log and "bf16-true" in log, log[-3000:]  # a table row
    assert "is your configuration as it is" in log or "Fastest: " in log, log[-3000:]


def test_the_checkpoint_section_measures_each_runner_both_ways(reduced):
    _, out = reduced
    rows = json.loads((out / "ckpt" / "checkpointing.json").read_text())["rows"]
    assert [(r["runner"], r["async"]) for r in rows] == [
        (runner, background) for runner in ("hand", "ptrain", "lightning")
        for background in (False, True)]
    assert all(r["saves"] == 2 and "stall" in r for r in rows), rows


def test_a_bad_argument_is_a_usage_error(tmp_path):
    proc = subprocess.run(["bash", "scripts/gpu-check.sh", "--part", "bogus", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert ("--part 'bogus' is not one of tests conformance decoder conv mlp fp8 ac data tune "
            "ckpt, all" in proc.stderr)
