"""A logger's file on a full disk: a tmpfs the test mounts, filled from inside the run after the
first epoch's checkpoint (``tests._log_fault_models.FillDisk``). The ``tensorboard`` and ``csv``
loggers stop the run with one clear error (``on_write_error="stop"``, the default; CLI exit 2) or
say it once and train on (``warn``); no traceback either way (TensorBoard's writer thread printed
one, and its error came back at each later write), and what the file and the checkpoint held
before stays readable."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

import ptrain
from ptrain.checkpoint_io import safe_load
from tests._faults import SmallDisk
from tests._log_fault_models import ChattyRegressor, FillDisk
from tests.conftest import REPO

pytestmark = pytest.mark.slow

FILL_AT = 130  # two steps after the first epoch's checkpoint (128 steps an epoch)
LOGGERS = {"tensorboard": "the TensorBoard log", "csv": "the CSV log"}


@pytest.fixture
def disk(tmp_path):
    small = SmallDisk(tmp_path / "disk", size=4 << 20)
    if small.kind != "tmpfs":
        pytest.skip("mounting a tmpfs needs root here")
    yield small.path
    small.close()


def fit(disk: Path, logger: str, on_write_error: str = "stop") -> ptrain.Trainer:
    others = {"tensorboard": "no:csv", "csv": "no:tensorboard"}
    trainer = ptrain.Trainer(
        accelerator="cpu", max_epochs=2, seed=0, default_root_dir=str(disk / "runs"),
        log_every_n_steps=1,
        callbacks=["no:progress-bar", logger, others[logger], FillDisk(str(disk), FILL_AT)],
        plugin_options={logger: {"on_write_error": on_write_error,
                                 **({"flush_every_n_steps": 1} if logger == "csv" else {})},
                        "checkpoint": {"on_write_error": on_write_error}})
    trainer.fit(ChattyRegressor())
    return trainer


def logged_steps(run: Path, logger: str) -> list[int]:
    """The steps of ``train_loss`` the logger's file holds, read by the file's own reader."""
    if logger == "csv":
        text = (run / "metrics.csv").read_text(encoding="utf-8")
        rows = list(csv.DictReader(text.splitlines()))
        # no row cut short: its last number would read as another
        assert text.endswith("\n") and all(None not in row.values() for row in rows), text[-300:]
        return [int(row["step"]) for row in rows if row["train_loss"]]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run))
    events.Reload()
    return [event.step for event in events.Scalars("train_loss")]


def no_traceback(err: str) -> None:
    assert "Traceback" not in err and "Exception in thread" not in err, err


@pytest.mark.parametrize("logger", LOGGERS)
def test_a_full_disk_stops_the_run_with_one_clear_error(disk, logger, capfd):
    with pytest.raises(ptrain.LogWriteError) as stopped:
        fit(disk, logger)
    run = disk / "runs" / "version_0"
    last = run / "checkpoints" / "last.ckpt"
    message = str(stopped.value)
    assert f"could not write {LOGGERS[logger]} '{run}" in message, message
    assert "No space left on device (ENOSPC)" in message, message
    assert f"free space on that disk, then resume with --ckpt-path '{last}'" in message, message
    assert f"pass --{logger}-on-write-error warn." in message, message
    no_traceback(capfd.readouterr().err)
    assert safe_load(last)["loop"]["global_step"] == 128
    steps = logged_steps(run, logger)
    assert steps[:FILL_AT] == list(range(1, FILL_AT + 1)), steps  # all up to the fill
    assert not (run / "metrics.csv.tmp").exists()


@pytest.mark.parametrize("logger", LOGGERS)
def test_with_warn_it_is_said_once_and_the_run_trains_on(disk, logger, capfd):
    trainer = fit(disk, logger, on_write_error="warn")
    assert trainer.global_step == 256
    err = capfd.readouterr().err
    no_traceback(err)
    said = [line for line in err.splitlines() if f"could not write {LOGGERS[logger]}" in line]
    assert len(said) == 1 and said[0].startswith("ptrain: warning: "), err
    assert said[0].endswith(f"training goes on (--{logger}-on-write-error warn)."), said
    steps = logged_steps(disk / "runs" / "version_0", logger)
    assert steps[:FILL_AT] == list(range(1, FILL_AT + 1)) and steps[-1] < 256, steps


def test_the_cli_exits_2_with_one_paragraph(disk):
    from conftest import run_cli

    result = run_cli("fit", "--model", "tests._log_fault_models:ChattyRegressor",
                     "--accelerator", "cpu", "--max-epochs", "2", "--log-every-n-steps", "1",
                     "--default-root-dir", str(disk / "runs"), "-p", "no:progress-bar",
                     "-p", "tests._log_fault_models:FillDisk", "--fill-disk-path", str(disk),
                     "--fill-disk-at-step", str(FILL_AT), cwd=REPO,
                     env={"PYTHONPATH": os.pathsep.join([str(REPO),
                                                         os.environ.get("PYTHONPATH", "")])})
    assert result.returncode == 2, result.stderr
    no_traceback(result.stderr)
    error = [line for line in result.stderr.splitlines() if line.startswith("ptrain: error:")]
    assert len(error) == 1 and "could not write the TensorBoard log" in error[0], result.stderr
