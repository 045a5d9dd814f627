"""docs/first-model.md followed literally, in its order, in an empty folder (issue 34): its
``model.py``, every ``$ ptrain ...`` command of its console blocks (through a shell, as typed),
its Python block; each step must succeed, and the output the page shows must be what the
commands print (up to the numbers that vary: times, metrics, dates)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._campaigns import WHOLE_TOOL_RUNS

pytestmark = [pytest.mark.slow, WHOLE_TOOL_RUNS]

PAGE = Path(__file__).resolve().parent.parent / "docs" / "first-model.md"
BLOCK = re.compile(r"```(console|python|text)\n(.*?)```", re.S)


def _steps() -> list[tuple[str, str]]:
    """The page's blocks in order: ("model", code), ("python", code), ("shell", command) and
    ("shown", text) (printed output the page promises)."""
    steps = []
    for kind, body in BLOCK.findall(PAGE.read_text(encoding="utf-8")):
        if kind == "python":
            steps.append(("model" if body.startswith("# model.py") else "python", body))
        elif kind == "text":
            steps.append(("shown", body))
        else:
            steps += [("shell", line[2:].split("  #")[0].strip())
                      for line in body.splitlines() if line.startswith("$ ")]
    return steps


def _promise(line: str) -> str:
    """The part of a shown output line that does not vary from run to run: up to the first
    time, metric value or date."""
    return re.split(r" in [\d.]+ s\.|, written |=", line)[0]


def test_the_first_model_page_works_in_its_order(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    printed = ""
    steps = _steps()
    assert [kind for kind, _ in steps].count("shell") >= 10, steps
    for kind, body in steps:
        if kind == "model":
            (tmp_path / "model.py").write_text(body, encoding="utf-8")
            continue
        if kind == "shown":  # the output of the commands since the last shown block
            for line in body.strip().splitlines():
                assert _promise(line) in printed, (line, printed)
            printed = ""
            continue
        argv = (["bash", "-c", body] if kind == "shell"
                else [sys.executable, "-c", body])
        result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, f"{body}\n--- stdout\n{result.stdout}\n--- stderr\n" \
                                       f"{result.stderr}"
        printed += result.stdout
        if kind == "shell" and body.startswith("ptrain predict"):
            predictions = list((tmp_path / "runs").glob("version_*/predictions.pt"))
            assert len(predictions) == 1, predictions
    assert (tmp_path / "moons.safetensors").is_file()
