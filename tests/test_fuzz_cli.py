"""``ptrain fit`` under 300 random combinations of flags and values (issue 16): each ends in
success or in a one-paragraph usage error with exit code 2, never a traceback, a hang or another
exit code. The campaign (``tests/_fuzz_cli.py``, seeded) runs in a process of its own; a larger
one: ``python tests/_fuzz_cli.py --runs 3000 --seed N``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

RUNS = 300


def test_300_random_fit_command_lines_end_in_success_or_a_usage_error(tmp_path):
    out = tmp_path / "fuzz.json"
    done = subprocess.run([sys.executable, str(REPO / "tests" / "_fuzz_cli.py"), "--runs",
                           str(RUNS), "--seed", "16", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    assert out.exists(), done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert len(results) == RUNS
    bad = [r for r in results if r["outcome"] not in ("ok", "usage")]
    assert not bad, "\n\n".join(f"{r['outcome']}: ptrain {' '.join(r['argv'])}\n{r['detail']}"
                                for r in bad[:5])
    # the campaign exercised both ends: runs that trained and runs that were refused
    outcomes = {r["outcome"] for r in results}
    assert outcomes == {"ok", "usage"}, outcomes
    assert done.returncode == 0, done.stderr[-3000:]
