"""``benchmarks/checkpointing.py --quick`` runs every arm (the hand loop, ptrain and Lightning,
each writing synchronously and in the background, in one process and as 2 fsdp processes) and
reports each one's stall, on checkpoints of the same size: the plumbing of the issue-38 figures
in docs/benchmarks.md. With Adam (``--optimizer adam``), so that every arm is seen to write the
optimizer's state with the weights."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests._campaigns import WHOLE_TOOL_RUNS
from tests.conftest import REPO

pytestmark = [pytest.mark.slow, WHOLE_TOOL_RUNS]


def test_every_arm_saves_and_reports_its_stall(tmp_path):
    out = tmp_path / "checkpointing.json"
    proc = subprocess.run([sys.executable, "benchmarks/checkpointing.py", "--quick", "--steps",
                           "9", "--every", "3", "--optimizer", "adam", "--workdir", str(tmp_path),
                           "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["runner"], r["async"]) for r in rows] == [
        (runner, background) for runner in ("hand", "ptrain", "lightning", "hand fsdp",
                                            "ptrain fsdp")
        for background in (False, True)] + [("lightning fsdp", False)]
    *measured, lightning_fsdp = rows
    assert lightning_fsdp["refused"].startswith("The strategy `fsdp` requires a GPU")
    assert all(r["saves"] == 2 and r["step"] > 0 for r in measured), rows
    # the CPU time of each step after the first, the save's figure from it
    assert all(len(r["cpu_steps"]) == 8 and min(r["cpu_steps"]) > 0 and
               isinstance(r["cpu"], float) for r in measured), rows
    # the same 17 M float32 weights and Adam's two moments (3 x 67 MB) in every file or
    # sharded folder, with each runner's own metadata
    assert all(201.3e6 < r["checkpoint_bytes"] < 202.5e6 for r in measured), rows
    assert "| ptrain | background |" in proc.stdout
    assert not list(tmp_path.glob("ckpt-bench-*"))  # every arm's folder removed


@pytest.mark.parametrize("flags, message", [
    (["--only-fsdp", "--no-fsdp"], "--no-fsdp: not allowed with argument --only-fsdp"),
    (["--only-fsdp", "--device", "cuda"], "--only-fsdp runs 2 CPU processes"),
    (["--device", "cuda"], "add --no-fsdp"),
], ids=["only-and-no-fsdp", "only-fsdp-on-cuda", "fsdp-on-cuda"])
def test_arms_that_cannot_run_together_are_usage_errors(flags, message):
    proc = subprocess.run([sys.executable, "benchmarks/checkpointing.py", *flags], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
