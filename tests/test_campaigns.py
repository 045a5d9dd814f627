"""The suite's campaign sampling (tests/_campaigns.py): the default run draws a seeded sample of
each marked family (a test's cases, tests marked with one family name, or whole modules), seeded
from the commit under test; ``--full`` runs every case, and a person picking tests (by name or by
file) gets what they picked. Each check runs pytest itself on small test files, in a
subprocess."""

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
    passed = re.findall(r"(?:^|/)(?:test_\w+\.py::)?(test_\w+(?:\[\d+\])?) PASSED", proc.stdout,
                        re.MULTILINE)
    return proc.returncode, passed, proc.stdout + proc.stderr


def _project(tmp_path, test_source: str = FAMILY, **modules: str):
    """A project with the campaign plugin: ``test_family.py`` holds ``test_source``, and each
    keyword names another test module and its source."""
    (tmp_path / "conftest.py").write_text(
        "from tests import _campaigns\n\n"
        "def pytest_addoption(parser):\n    _campaigns.add_options(parser)\n\n"
        "def pytest_configure(config):\n    config.pluginmanager.register(_campaigns)\n")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    campaign(sample): a family\n")
    (tmp_path / "test_family.py").write_text(test_source)
    for name, source in modules.items():
        (tmp_path / f"{name}.py").write_text(source)
    return tmp_path


def test_the_default_run_draws_the_same_sample_and_says_so(tmp_path):
    project = _project(tmp_path)
    code, first, output = _run(project)
    assert code == 0, output
    assert "test_alone" in first and len(first) == 4, first
    assert "campaigns: a sample of 1 families (seed 0, no git checkout); 7 cases left out" in output
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


def test_a_campaign_without_a_sample_size_or_with_an_unknown_word_is_a_usage_error(tmp_path):
    project = _project(tmp_path, FAMILY.replace("campaign(sample=3)", "campaign"))
    code, _, output = _run(project)
    assert code == 4, output
    assert "test_family.py::test_case: @pytest.mark.campaign needs sample=K" in output
    code, _, output = _run(_project(tmp_path, FAMILY.replace("sample=3", "sampel=3")))
    assert code == 4, output
    assert "@pytest.mark.campaign takes only sample=, family=, per=; not sampel=" in output


PAIRS = """
import pytest

pytestmark = pytest.mark.campaign(sample=2, family="pairs")

def test_{0}_one():
    pass

def test_{0}_two():
    pass
"""


def test_tests_marked_with_one_family_name_are_drawn_as_one_family(tmp_path):
    project = _project(tmp_path, PAIRS.format("a"), test_other=PAIRS.format("b"))
    code, passed, output = _run(project)
    assert code == 0, output
    assert len(passed) == 2, passed
    assert "a sample of 1 families" in output and "2 cases left out" in output, output
    assert len(_run(project, "--full")[1]) == 4


WHOLE_RUN = """
import pytest

@pytest.fixture(scope="module")
def run():
    return "{0}"

@pytest.mark.campaign(sample=1, family="whole runs", per="module")
def test_{0}_first(run):
    pass

@pytest.mark.campaign(sample=1, family="whole runs", per="module")
def test_{0}_second(run):
    pass

def test_{0}_unmarked():
    pass
"""


def test_a_family_drawn_per_module_keeps_or_leaves_out_each_module_whole(tmp_path):
    names = ("x", "y", "z")
    project = _project(tmp_path, "", **{f"test_{n}": WHOLE_RUN.format(n) for n in names})
    code, passed, output = _run(project)
    assert code == 0, output
    drawn = [n for n in names if f"test_{n}_first" in passed]
    assert len(drawn) == 1, passed
    assert set(passed) == {f"test_{drawn[0]}_first", f"test_{drawn[0]}_second",
                           *(f"test_{n}_unmarked" for n in names)}
    left_out = next(n for n in names if n not in drawn)
    named = _run(project, f"test_{left_out}.py")[1]
    assert set(named) == {f"test_{left_out}_first", f"test_{left_out}_second",
                          f"test_{left_out}_unmarked"}, named


def test_a_test_file_named_on_the_command_line_runs_whole(tmp_path):
    code, passed, output = _run(_project(tmp_path), "test_family.py")
    assert code == 0 and len(passed) == 11, output
    assert "campaigns: every case of 1 families runs (the files named run whole)" in output


def test_a_family_marked_two_ways_is_a_usage_error(tmp_path):
    project = _project(tmp_path, PAIRS.format("a"),
                       test_other=PAIRS.format("b").replace("sample=2", "sample=3"))
    code, _, output = _run(project)
    assert code == 4, output
    assert "family 'pairs' is marked sample=3, per='case' here and sample=2" in output, output
    assert "mark it alike" in output


def test_the_default_seed_comes_from_the_commit_under_test(tmp_path):
    project = _project(tmp_path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for command in (["init", "-q"], ["add", "."], ["commit", "-qm", "tests"]):
        subprocess.run([*git, *command], cwd=project, check=True, capture_output=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project, check=True,
                         capture_output=True, text=True).stdout.strip()
    code, passed, output = _run(project)
    seed = int(sha[:6], 16)
    assert code == 0, output
    assert f"(seed {seed}, commit {sha[:9]})" in output, output
    assert set(passed) == set(_run(project, "--campaign-seed", str(seed))[1])
