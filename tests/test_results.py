"""The ``results`` callback: every stage says which checkpoint it loaded and what it ended with,
with or without the progress bar (issue 34: ``--no-progress-bar`` used to hide the results,
and a stage never said which checkpoint ``last`` had picked)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ptrain.builtins.results import StageResults
from tests._stage_models import StagedRegressor
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow

STAGED = ["--model", "tests._stage_models:StagedRegressor", "--accelerator", "cpu", "--seed", "0"]
QUIET = ["--no-progress-bar", "-p", "no:tensorboard", "-p", "no:model-summary"]


def _cli(*args: str, cwd: Path):
    """The CLI run in ``cwd`` (paths are shown relative to it), importing the test models."""
    return run_cli(*args, cwd=cwd, env={"PYTHONPATH": str(REPO)})


def _metrics(line: str) -> dict[str, float]:
    return {name: float(value) for name, value in re.findall(r"(\w+)=(\S+)", line)}


def _line(stdout: str, start: str) -> str:
    found = [line for line in stdout.splitlines() if line.startswith(start)]
    assert len(found) == 1, stdout
    return found[0]


def _test_loss(checkpoint: Path) -> float:
    """The test loss of the weights in ``checkpoint``, evaluated here by hand."""
    module = StagedRegressor()
    module.load_state_dict(torch.load(checkpoint, weights_only=True)["model"])
    x, y = module.test_set.tensors
    with torch.no_grad():
        return torch.nn.functional.mse_loss(module(x), y).item()


def test_test_without_the_bar_names_the_checkpoint_and_prints_its_metrics(tmp_path):
    root = tmp_path / "runs"
    fit = _cli("fit", *STAGED, "--max-epochs", "2", "--default-root-dir", str(root), *QUIET,
                  cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr
    assert "Resuming from" not in fit.stdout  # nothing was loaded
    tested = _cli("test", *STAGED, "--ckpt-path", "last", "--default-root-dir", str(root),
                     *QUIET, cwd=tmp_path)
    assert tested.returncode == 0, tested.stderr
    loaded = _line(tested.stdout, "Testing checkpoint ")
    # relative to the working directory, with its run folder
    assert loaded.startswith("Testing checkpoint runs/version_0/checkpoints/last.ckpt "
                             "(run runs/version_0, written "), loaded
    finished = _line(tested.stdout, "Test finished in ")
    checkpoint = root / "version_0" / "checkpoints" / "last.ckpt"
    # batches of 8, 8 and 4 rows: the stage's loss is the mean over rows, as by hand
    assert _metrics(finished)["test_loss"] == pytest.approx(_test_loss(checkpoint), rel=1e-3)
    assert tested.stdout.index(loaded) < tested.stdout.index(finished)


def test_last_says_when_it_passes_over_newer_runs(tmp_path):
    root = tmp_path / "runs"
    common = (*STAGED, "--default-root-dir", str(root), *QUIET)
    assert _cli("fit", *common, "--max-epochs", "1", cwd=tmp_path).returncode == 0
    # a validation without a checkpoint is a run of its own, with no last.ckpt
    validated = _cli("validate", *common, cwd=tmp_path)
    assert validated.returncode == 0, validated.stderr
    assert (root / "version_1").is_dir() and not (root / "version_1" / "checkpoints").exists()
    resumed = _cli("fit", *common, "--max-epochs", "2", "--ckpt-path", "last", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    warning = [line for line in resumed.stderr.splitlines() if "ckpt_path='last'" in line]
    assert len(warning) == 1, resumed.stderr
    assert "runs/version_1" in warning[0] and "runs/version_0/checkpoints/last.ckpt" in warning[0]
    loaded = _line(resumed.stdout, "Resuming from checkpoint ")
    assert "runs/version_0/checkpoints/last.ckpt (run runs/version_0" in loaded
    assert _line(resumed.stdout, "Training finished: ").startswith(
        "Training finished: 2 epoch(s), 8 steps")


def test_a_stage_that_failed_prints_no_results(tmp_path):
    failed = _cli("test", *STAGED, "--ckpt-path", str(tmp_path / "missing.ckpt"),
                     "--default-root-dir", str(tmp_path / "runs"), *QUIET, cwd=tmp_path)
    assert failed.returncode == 2, failed.stderr
    assert "finished" not in failed.stdout


def test_lightning_verbose_false_prints_no_results(tmp_path, capsys):
    from ptrain.lightning import Trainer

    def trainer():
        return Trainer(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path),
                       enable_progress_bar=False, enable_model_summary=False, logger=False,
                       enable_checkpointing=False)

    module = StagedRegressor()
    capsys.readouterr()
    shown = trainer().test(module, verbose=True)
    printed = capsys.readouterr().out
    assert _metrics(_line(printed, "Test finished in "))["test_loss"] == pytest.approx(
        shown[0]["test_loss"], rel=1e-3)
    quiet = trainer()
    assert quiet.test(module, verbose=False) == shown
    assert "finished" not in capsys.readouterr().out
    quiet.validate(module)  # verbose again for the next stage
    assert "Validation finished in " in capsys.readouterr().out
    assert isinstance(quiet.plugins.get("results"), StageResults)
