"""A disk that stays full under ``--checkpoint-on-write-error warn``: the refusal is said once,
not at every checkpoint point; a checkpoint written again (space freed) is said, and a refusal
after it is said anew; the end of fit says how many writes were refused since the last complete
one and names the newest complete checkpoint.

A real tmpfs the test mounts (tests/_faults.py ``SmallDisk``), filled and freed from inside the
run at known steps, once the write in flight (``async_save``) has ended."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import ptrain
from ptrain.checkpoint_io import safe_load
from tests._faults import SmallDisk, fill_tmpfs
from tests.conftest import TinyRegressor

pytestmark = pytest.mark.slow

STEPS = 8  # an epoch of TinyRegressor: 64 samples, batches of 8
SAID = "could not write checkpoint"


class FillAndFree:
    """Fill the tmpfs at ``path`` after the optimizer steps in ``fill``, free it after those in
    ``free``; each once the checkpoint write in flight has ended."""

    name = "fill-and-free"

    def __init__(self, path: Path, fill: set[int], free: set[int]):
        self.path, self.fill, self.free = path, fill, free

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer) -> None:
        step = trainer.global_step
        if step not in self.fill | self.free:
            return
        while not trainer.checkpoint_write_done():
            time.sleep(0.01)
        if step in self.fill:
            fill_tmpfs(self.path)
        else:
            (self.path / "filler").unlink()


@pytest.fixture
def disk(tmp_path):
    small = SmallDisk(tmp_path / "disk", size=1 << 20)
    if small.kind != "tmpfs":
        pytest.skip("mounting a tmpfs needs root here")
    yield small.path
    small.close()


def fit(disk: Path, epochs: int, fill: set[int], free: set[int], asynchronous: bool) -> Path:
    trainer = ptrain.Trainer(
        accelerator="cpu", max_epochs=epochs, seed=0, default_root_dir=str(disk / "runs"),
        callbacks=["no:progress-bar", "no:tensorboard", "no:csv", FillAndFree(disk, fill, free)],
        plugin_options={"checkpoint": {"on_write_error": "warn", "async_save": asynchronous}})
    trainer.fit(TinyRegressor())
    assert trainer.global_step == epochs * STEPS
    return disk / "runs" / "version_0" / "checkpoints" / "last.ckpt"


def warnings_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("ptrain: warning: ")]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_disk_that_stays_full_is_said_once_then_counted_at_the_end(disk, capfd,
                                                                     asynchronous):
    epochs = 5
    last = fit(disk, epochs, fill={STEPS + 1}, free=set(), asynchronous=asynchronous)
    said = warnings_of(capfd.readouterr().err)
    assert len(said) == 2, said
    assert SAID in said[0] and "No space left on device (ENOSPC)" in said[0], said
    assert "further refusals for this cause are counted, not said" in said[0], said
    # every epoch end after the fill was refused; the first epoch's last.ckpt is the newest
    assert said[1] == (f"ptrain: warning: checkpoint: {epochs - 1} writes refused since the "
                       f"last complete one (the first is said above); the newest complete "
                       f"checkpoint is '{last}'."), said
    assert safe_load(last)["loop"]["global_step"] == STEPS


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_write_after_space_was_freed_is_said_and_a_new_refusal_said_anew(disk, capfd,
                                                                           asynchronous):
    # full after epochs 0 and 2's checkpoints; freed before epoch 2's end; 6 epochs
    last = fit(disk, 6, fill={STEPS + 1, 3 * STEPS + 1}, free={2 * STEPS + 1},
               asynchronous=asynchronous)
    said = warnings_of(capfd.readouterr().err)
    assert [SAID in line for line in said] == [True, False, True, False], said
    assert said[1] == (f"ptrain: warning: checkpoint '{last}' was written after 1 write "
                       f"refused: checkpoints are saved again."), said
    assert said[3] == (f"ptrain: warning: checkpoint: 3 writes refused since the last complete "
                       f"one (the first is said above); the newest complete checkpoint is "
                       f"'{last}'."), said
    assert safe_load(last)["loop"]["global_step"] == 3 * STEPS
