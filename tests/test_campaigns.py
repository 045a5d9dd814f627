"""The suite's campaign sampling (tests/_campaigns.py): the default run draws a seeded sample of
each marked family, ``--full`` runs every case, and a person picking tests gets what they
picked. Each check runs pytest itself on a small test file, in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import REPO

FAMILY = '''
import pytest

@pytest.mark.campaign(sample=3)
@pytest.mark.parametrize("case", range(10))
def test_case(case):
    pass

def test_alone():
    pass
'''


def _run(folder, *args: str) -> tuple[int, list[str], str]:
    """pytest's exit code, the tests that passed, and its output."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                           *args], cwd=folder, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    passed = re.findall(r"::(test_\w+(?:\[\d+\])?) PASSED", proc.stdout)
    return proc.returncode, passed, proc.stdout + proc.stderr


def _project(tmp_path, test_source: str = FAMILY):
    (tmp_path / "conftest.py").write_text(
        "from tests import _campaigns\n\n"
        "def pytest_addoption(parser):\n    _campaigns.add_options(parser)\n\n"
        "def pytest_configure(config):\n    config.pluginmanager.register(_campaigns)\n")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    campaign(sample): a family\n")
    (tmp_path / "test_family.py").write_text(test_source)
    return tmp_path


def test_the_default_run_draws_the_same_sample_and_says_so(tmp_path):
    project = _project(tmp_path)
    code, first, output = _run(project)
    assert code == 0, output
    assert "test_alone" in first and len(first) == 4, first
    assert "campaigns: a sample of 1 families (seed 0); 7 cases left out" in output
    assert _run(project)[1] == first
    others = [set(_run(project, "--campaign-seed", str(seed))[1]) for seed in (1, 2)]
    assert any(other != set(first) for other in others), (first, others)


def test_full_runs_every_case(tmp_path):
    code, passed, output = _run(_project(tmp_path), "--full")
    assert code == 0 and len(passed) == 11, output
    assert "campaigns:" not in output


def test_a_case_picked_by_hand_runs_whether_drawn_or_not(tmp_path):
    project = _project(tmp_path)
    drawn = {name for name in _run(project)[1] if "[" in name}
    left_out = next(f"test_case[{i}]" for i in range(10) if f"test_case[{i}]" not in drawn)
    assert _run(project, "-k", left_out.replace("test_case", "").strip("[]"))[1] == [left_out]
    assert _run(project, f"test_family.py::{left_out}")[1] == [left_out]
    assert len(_run(project, "test_family.py::test_case")[1]) == 10


def test_a_campaign_without_a_sample_size_is_a_usage_error(tmp_path):
    project = _project(tmp_path, FAMILY.replace("campaign(sample=3)", "campaign"))
    code, _, output = _run(project)
    assert code == 4, output
    assert "test_family.py::test_case: @pytest.mark.campaign needs sample=K" in output
