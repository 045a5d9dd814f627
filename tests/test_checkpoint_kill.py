"""A kill between a checkpoint point's complete files and the deletion of the file that fell
out of the top-k: the resumed run deletes it (the checkpoints written list it as due), so the
folder ends with the top-k files its record names, and nothing else.

The runs are tests/_checkpoint_kill_script.py's, in their own processes (a SIGKILL)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests._campaigns import TWO_PROCESS_RUNS
from tests._checkpoint_kill_script import TOP_K, top_k_files
from tests.conftest import REPO

SCRIPT = "tests._checkpoint_kill_script"
LIGHTNING_SCRIPT = "tests._lightning_checkpoint_kill_script"


def run(root: Path, *flags: str, script: str = SCRIPT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", script, str(root), *flags], cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          start_new_session=True)  # the kill is of the script's process group


def kill_then_resume(root: Path, *flags: str, script: str = SCRIPT) -> Path:
    killed = run(root, *flags, script=script)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    # the window was hit: epoch 2's point is complete, epoch 0's file still there
    kill = json.loads((root / "killed.json").read_text())
    folder, held = Path(kill["folder"]), kill["held"]
    assert held == ["epoch=0-val_metric=5.0.ckpt", "epoch=1-val_metric=3.0.ckpt",
                    "epoch=2-val_metric=4.0.ckpt"], held
    assert top_k_files(folder) == held
    resumed = run(root, *flags, "--resume", script=script)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    return folder


def assert_only_the_recorded_top_k(folder: Path) -> None:
    record = json.loads((folder / "best_k_models.json").read_text())
    assert top_k_files(folder) == sorted(record["best_k_models"]), record
    assert len(record["best_k_models"]) == TOP_K
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [*record["best_k_models"], "best_k_models.json", "last.ckpt"])


@pytest.mark.parametrize("flags", [(), ("--async",)], ids=["sync", "async"])
def test_a_file_left_by_a_kill_before_its_deletion_is_deleted_by_the_resumed_run(tmp_path,
                                                                               flags):
    folder = kill_then_resume(tmp_path, *flags)
    assert_only_the_recorded_top_k(folder)
    assert top_k_files(folder) == ["epoch=3-val_metric=1.0.ckpt", "epoch=4-val_metric=2.0.ckpt"]


def test_a_top_k_file_written_after_the_state_resumed_from_is_deleted(tmp_path):
    """A kill after epoch 2's top-k file and record, before its last.ckpt: the resumed run
    (from epoch 1's state) does epoch 2 again, whose value (another here) names another file;
    the file the record named beyond the resumed state is deleted, not left an orphan."""
    folder = kill_then_resume(tmp_path, "--kill-before-last")
    assert_only_the_recorded_top_k(folder)
    assert top_k_files(folder) == ["epoch=3-val_metric=1.0.ckpt", "epoch=4-val_metric=2.0.ckpt"]


def test_a_fit_resumed_from_an_older_top_k_file_keeps_the_later_ones(tmp_path):
    """Going back to an older top-k file on purpose is no kill to repair: the top-k files the
    record names beyond that state are the user's, and stay (only a resume from last.ckpt
    deletes what its state does not know). A folder of the user's own (``dirpath``), which
    every run of theirs shares: a resume from another file starts a new run folder, but the
    callback's folder is the same."""
    import ptrain
    from tests._checkpoint_kill_script import VALUES
    from tests._es_models import SequenceModule

    def trainer(max_epochs: int) -> ptrain.Trainer:
        return ptrain.Trainer(
            accelerator="cpu", max_epochs=max_epochs, seed=0, default_root_dir=str(tmp_path),
            callbacks=["no:progress-bar", "no:tensorboard", "no:model-summary"],
            plugin_options={"checkpoint": {"monitor": "val_metric", "save_top_k": TOP_K,
                                           "filename": "{epoch}-{val_metric:.1f}",
                                           "dirpath": str(tmp_path / "mine")}})

    first = trainer(2)
    first.fit(SequenceModule(VALUES, n=16))
    folder = Path(first.plugins["checkpoint"].dirpath)
    epoch_1 = (folder / "last.ckpt").read_bytes()  # the run's state after epoch 1
    trainer(5).fit(SequenceModule(VALUES, n=16), ckpt_path="last")
    later = ["epoch=3-val_metric=1.0.ckpt", "epoch=4-val_metric=2.0.ckpt"]
    assert top_k_files(folder) == later
    older = folder / "older.ckpt"  # kept by the user in the run's folder
    older.write_bytes(epoch_1)
    trainer(3).fit(SequenceModule(VALUES, n=16), ckpt_path=str(older))  # epoch 2 again
    assert set(later) <= set(top_k_files(folder)), top_k_files(folder)


def test_under_ptrain_lightning_a_file_left_by_a_kill_is_deleted_by_the_resumed_run(tmp_path):
    """Lightning's ModelCheckpoint state format, with the files due for deletion beside its
    keys: the resumed program deletes the file the kill left."""
    folder = kill_then_resume(tmp_path, script=LIGHTNING_SCRIPT)
    assert_only_the_recorded_top_k(folder)
    assert top_k_files(folder) == ["epoch=3-val_metric=1.0.ckpt", "epoch=4-val_metric=2.0.ckpt"]


@pytest.mark.slow
@TWO_PROCESS_RUNS
@pytest.mark.parametrize("flags", [(), ("--async",)], ids=["sync", "async"])
def test_under_ddp_rank_0_deletes_what_a_kill_left_on_resume(tmp_path, flags):
    folder = kill_then_resume(tmp_path, *flags, "--strategy", "ddp")
    assert_only_the_recorded_top_k(folder)
