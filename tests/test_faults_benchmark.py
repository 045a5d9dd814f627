"""``benchmarks/faults.py --quick``: one trial of each fault (a SIGKILL per strategy, a stopped
rank, a full disk) runs end to end, every job resumed bit-exact, none left running. The full
campaign (``benchmarks/faults.py``) gives the table in ``docs/reliability.md``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests._campaigns import WHOLE_TOOL_RUNS

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, WHOLE_TOOL_RUNS]


def test_the_quick_fault_campaign_loses_nothing_and_leaves_nothing(tmp_path):
    out = tmp_path / "trials.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "faults.py"), "--quick",
                           "--seed", "5", "--json", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-4000:]}"
    trials = json.loads(out.read_text())
    assert {(t["fault"], t["strategy"]) for t in trials} == {
        ("kill", "single-device"), ("kill", "ddp"), ("kill", "fsdp"), ("hung", "ddp"),
        ("disk-full", "single-device")}
    assert all(t["bit_exact"] and t["leftovers"] == 0 for t in trials), trials
    assert "| fault | strategy | trials |" in done.stdout
