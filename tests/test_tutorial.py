"""docs/tutorial-first-plugin.md, followed step by step, so that the tutorial can't drift from
the code.

The page's convention: each file is a fenced block right after a line ``<!-- file: PATH -->``
(PATH relative to the folder the reader is in at that step); each command is a ``$ `` line of a
``console`` block, followed by what it prints (``...`` for lines left out). The ``walk`` fixture
reads the page in order, writes each file where the page says, runs each command, and the tests
compare what each command printed with what the page shows (numbers are matched as numbers: the
page shows one run's values).

Where the walk departs from the page, and why:

- ``pip install -e .`` is run as ``pip install --no-deps --no-build-isolation --no-index
  --target SITE .``: the test must not change ``.venv`` (the environment the whole suite runs
  in), and CI has no network for pip's build isolation. The ``ptrain`` commands then run with SITE
  on ``PYTHONPATH``, which ``importlib.metadata`` searches like site-packages, so the plugin is
  found through its entry point exactly as after a real install.
- The page starts in an empty temporary folder (``home``); the run folder ``runs/`` that
  ``ptrain example digits`` writes is made there.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import DIGITS_CONFIG

REPO = Path(__file__).resolve().parent.parent
TUTORIAL = REPO / "docs" / "tutorial-first-plugin.md"
PAGE_INSTALL = ["pip", "install", "-e", "."]
MAX_PYTHON_LINES = 49  # "under 50 lines of Python"

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
FILE_MARK = re.compile(r"<!-- file: (\S+) -->\n\Z")
STEP = re.compile(r"^## (\d+)\. ", re.M)
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


@dataclass
class Block:
    step: int
    lang: str
    body: str
    path: str | None  # set for a file block


@dataclass
class Command:
    line: str
    shown: list[str]  # the output lines the page shows after it
    stdout: str = ""
    stderr: str = ""
    returncode: int = 0


@dataclass
class Walk:
    commands: list[Command] = field(default_factory=list)
    home: Path | None = None  # where the page starts, and trains
    env_pythonpath: str = ""  # the PYTHONPATH the page's commands ran with

    def command(self, prefix: str) -> Command:
        found = [c for c in self.commands if c.line.startswith(prefix)]
        assert len(found) == 1, f"the tutorial has {len(found)} commands starting {prefix!r}"
        return found[0]


def blocks(text: str) -> list[Block]:
    """Every fenced block of the page in order, with the number of the step it is in."""
    result = []
    for match in FENCE.finditer(text):
        before = text[:match.start()]
        steps = STEP.findall(before)
        mark = FILE_MARK.search(before)
        result.append(Block(int(steps[-1]) if steps else 0, match.group(1), match.group(2),
                            mark.group(1) if mark else None))
    return result


def commands(block: Block) -> list[Command]:
    result: list[Command] = []
    for line in block.body.splitlines():
        if line.startswith("$ "):
            result.append(Command(line[2:].strip(), []))
        elif line.strip():
            assert result, f"step {block.step}: output before any command: {line!r}"
            result[-1].shown.append(line)
    return result


def line_pattern(shown: str) -> re.Pattern[str]:
    """A shown output line as a pattern: words as they are, numbers as any number, any run of
    spaces as any run of spaces."""
    words = []
    for word in shown.split():
        pieces = NUMBER.split(word)
        numbers = len(pieces) - 1
        parts = [re.escape(pieces[0])]
        for i in range(numbers):
            parts += [r"(?:\d+(?:\.\d+)?(?:e[-+]?\d+)?|nan|inf)", re.escape(pieces[i + 1])]
        words.append("".join(parts))
    return re.compile(r"\s+".join(words))


def mismatch(shown: list[str], printed: str) -> str | None:
    """``None`` when ``printed`` is what ``shown`` shows (in order; ``...`` stands for any lines,
    none included), else what differs."""
    actual = [line.strip() for line in printed.splitlines() if line.strip()]
    position, gap = 0, False
    for expected in shown:
        if expected.strip() == "...":
            gap = True
            continue
        pattern = line_pattern(expected)
        if gap:
            while position < len(actual) and not pattern.fullmatch(actual[position]):
                position += 1
            if position == len(actual):
                return f"no line after the previous match looks like {expected!r}"
        elif position >= len(actual) or not pattern.fullmatch(actual[position]):
            got = actual[position] if position < len(actual) else "(end of output)"
            return f"line {position + 1} is {got!r}, the page shows {expected!r}"
        position, gap = position + 1, False
    if not gap and position < len(actual):
        return f"more output than the page shows: {actual[position:]!r}"
    return None


def python_lines(page: list[Block]) -> int:
    return sum(len(b.body.splitlines()) for b in page if b.path and b.path.endswith(".py"))


# -- what the page is made of (no commands run) ----------------------------------------------------


def test_every_block_is_a_file_or_a_console_session():
    page = blocks(TUTORIAL.read_text(encoding="utf-8"))
    assert page, "no fenced blocks found"
    for block in page:
        assert block.path is not None or block.lang == "console", (
            f"step {block.step} has a ```{block.lang} block that is neither a file (preceded by "
            f"<!-- file: PATH -->) nor a console session: this test could not follow it")
        if block.path is None:
            assert commands(block), f"step {block.step}: a console block without a $ command"


def test_steps_are_numbered_in_order():
    numbers = [int(n) for n in STEP.findall(TUTORIAL.read_text(encoding="utf-8"))]
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    assert len(numbers) >= 5


def test_the_python_is_under_50_lines_and_the_page_says_how_many():
    text = TUTORIAL.read_text(encoding="utf-8")
    count = python_lines(blocks(text))
    assert 0 < count <= MAX_PYTHON_LINES, f"the tutorial's Python is {count} lines"
    claimed = re.search(r"(\d+) lines of\s+Python", text)
    assert claimed and int(claimed.group(1)) == count, (
        f"the page says {claimed.group(0) if claimed else '(nothing)'!r}; it has {count}")


def test_the_python_uses_only_the_public_api():
    from ptrain.testing import private_imports

    for block in blocks(TUTORIAL.read_text(encoding="utf-8")):
        if block.path and block.path.endswith(".py"):
            assert private_imports(block.body, block.path) == []


def test_the_links_of_the_plugin_author_docs_resolve():
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    for page in (TUTORIAL, REPO / "docs" / "plugins.md"):
        for target in link.findall(page.read_text(encoding="utf-8")):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


# -- following it ---------------------------------------------------------------------------------


def _run(command: Command, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    command.stdout, command.stderr, command.returncode = proc.stdout, proc.stderr, proc.returncode


@pytest.fixture(scope="module")
def walk(tmp_path_factory) -> Walk:
    """Follow the page in order from an empty folder; every command's output is kept."""
    root = tmp_path_factory.mktemp("tutorial")
    home, site = root / "home", root / "site"
    home.mkdir()
    existing = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PYTHONPATH": str(site) + (os.pathsep + existing if existing else "")}
    result = Walk(home=home, env_pythonpath=env["PYTHONPATH"])
    cwd = home
    for block in blocks(TUTORIAL.read_text(encoding="utf-8")):
        if block.path is not None:
            target = cwd / block.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.body, encoding="utf-8")
            continue
        for command in commands(block):
            result.commands.append(command)
            argv = shlex.split(command.line, comments=True)
            where = f"step {block.step}, `{command.line}`"
            if argv[0] == "mkdir" and len(argv) == 2:
                (cwd / argv[1]).mkdir()  # fails if it exists: the page starts from nothing
            elif argv[0] == "cd" and len(argv) == 2:
                cwd = (cwd / argv[1]).resolve()
                assert cwd.is_dir(), f"{where}: no such folder"
            elif argv[:2] == ["pip", "install"]:
                assert argv == PAGE_INSTALL, f"{where}: this test knows how to follow only " \
                                             f"{' '.join(PAGE_INSTALL)!r}; update it"
                _run(command, [sys.executable, "-m", "pip", "install", "--no-deps",
                               "--no-build-isolation", "--no-index", "--quiet", "--target",
                               str(site), "."], cwd, env)
            elif argv[0] == "ptrain":
                _run(command, [sys.executable, "-m", "ptrain", *argv[1:]], cwd, env)
            else:
                pytest.fail(f"{where}: a command this test does not know how to follow")
            assert command.returncode == 0, (f"{where} exited with {command.returncode}\n"
                                             f"{command.stdout}\n{command.stderr}")
    return result


@pytest.mark.slow
def test_each_command_prints_what_the_page_shows(walk):
    compared = 0
    for command in walk.commands:
        assert "Traceback" not in command.stderr, f"`{command.line}`:\n{command.stderr}"
        if not command.shown:
            continue
        problem = mismatch(command.shown, command.stdout)
        assert problem is None, f"`{command.line}`: {problem}\n--- printed:\n{command.stdout}"
        compared += 1
    assert compared >= 2  # the listing and the training run


@pytest.mark.slow
def test_the_plugin_is_listed_with_its_distribution(walk):
    rows = [line.split() for line in walk.command("ptrain plugins").stdout.splitlines()]
    assert ["callback", "grad-norm", "ptrain-grad-norm", "0.1.0"] in rows


@pytest.mark.slow
def test_training_reports_a_gradient_norm_per_epoch(walk):
    fit = walk.command("ptrain example")
    epochs = int(re.search(r"--max-epochs (\d+)", fit.line).group(1))
    reports = re.findall(r"^grad-norm: epoch (\d+)  mean (\S+)  max (\S+)$", fit.stdout, re.M)
    assert [int(epoch) for epoch, _, _ in reports] == list(range(epochs))
    for _, mean, peak in reports:
        assert math.isfinite(float(peak)) and 0 < float(mean) <= float(peak)


NORMS = re.compile(r"^grad-norm: epoch \d+  mean (\S+)  max (\S+)$", re.M)


@pytest.mark.slow
def test_the_norms_shown_are_a_run_of_the_torch_the_page_names(walk):
    """Output is matched with numbers as any number, so the page showed norms no run gave (mean
    0.842, max 1.556 in epoch 0, where a run gives 0.826 and 1.277). The page names the torch
    it ran with; with that torch (major.minor), the run gives the norms shown, within 1% (room
    for another CPU's rounding, none for another run's numbers)."""
    import torch

    named = re.search(r"these numbers are\s+from torch (\d+\.\d+)\.",
                      TUTORIAL.read_text(encoding="utf-8"))
    assert named, "the page no longer says which torch its numbers come from"
    if ".".join(torch.__version__.split(".")[:2]) != named.group(1):
        pytest.skip(f"the page's numbers are from torch {named.group(1)}")
    fit = walk.command("ptrain example")
    shown = [float(n) for pair in NORMS.findall("\n".join(fit.shown)) for n in pair]
    printed = [float(n) for pair in NORMS.findall(fit.stdout) for n in pair]
    assert shown and printed == pytest.approx(shown, rel=0.01), (shown, printed)


@pytest.mark.slow
def test_the_norms_are_logged_as_the_page_says(walk):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    fit = walk.command("ptrain example")
    (run,) = sorted((walk.home / "runs").glob("version_*"))
    events = EventAccumulator(str(run))
    events.Reload()
    logged = [round(e.value, 3) for e in events.Scalars("grad_norm_mean")]
    printed = [float(m) for m in re.findall(r"^grad-norm: epoch \d+  mean (\S+)", fit.stdout, re.M)]
    assert logged == pytest.approx(printed, abs=1e-3)
    assert len(events.Scalars("grad_norm_max")) == len(printed)


@pytest.mark.slow
def test_the_plugin_reports_whole_gradient_norms_under_sharding(walk):
    """The page says a sharding strategy gives the same numbers as ddp: the same two-process
    epoch under ddp and fsdp (real gloo processes) prints the same norms."""
    env = {**os.environ, "PYTHONPATH": walk.env_pythonpath}
    printed = {}
    for strategy in ("ddp", "fsdp"):
        proc = subprocess.run(
            [sys.executable, "-m", "ptrain", "fit", "--config", DIGITS_CONFIG,
             "--max-epochs", "1", "--limit-train-batches", "8", "--limit-val-batches", "1",
             "-p", "grad-norm", "--no-progress-bar", "--strategy", strategy, "--devices", "2",
             "--default-root-dir", str(walk.home / f"runs-{strategy}")],
            cwd=walk.home, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{strategy}:\n{proc.stdout}\n{proc.stderr}"
        printed[strategy] = re.findall(r"^grad-norm: epoch 0  mean (\S+)  max (\S+)$",
                                       proc.stdout, re.M)
    assert len(printed["ddp"]) == 1, printed  # printed once, by the first process
    assert printed["fsdp"] == printed["ddp"]
