"""benchmarks/first_step.py's plumbing (issue 18): each runner's fresh process reaches its first
training step and reports the time, and the table names every runner. Its figures are the
benchmark's to report, not a test's to judge."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_every_runner_reaches_its_first_step_in_a_fresh_process():
    result = subprocess.run([sys.executable, "benchmarks/first_step.py", "--runs", "1",
                             "--no-lightning", "--pre-intern", "100"], cwd=REPO, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")][2:]
    assert [row.split(" | ")[0].lstrip("| ") for row in rows] == [
        "hand-written", "ptrain (defaults)", "ptrain (default callbacks off)"]
    for row in rows:
        median = float(row.split(" | ")[1])
        assert 0 < median < 60_000, row
