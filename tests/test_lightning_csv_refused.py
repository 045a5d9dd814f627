"""``ptrain.lightning``'s ``CSVLogger`` on a full disk, a real tmpfs the test mounts. Under
``on_write_error="warn"``, as the native ``csv`` logger, the refusal is said once and nothing more
is written, nor kept in memory for a write that will not come (it kept buffering every later row;
the disk filled from inside the run, ``tests._log_fault_models.FillDisk``). Under ``"stop"``, a
refused ``log_hyperparams`` raises ``LogWriteError`` and leaves ``hparams.toml`` as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from ptrain import LogWriteError
from ptrain import lightning as L
from ptrain.lightning.loggers import CSVLogger
from tests._faults import SmallDisk, fill_tmpfs
from tests._log_fault_models import FillDisk

pytestmark = pytest.mark.slow

FILL_AT = 10
STEPS = 32  # an epoch: 256 samples, batches of 8


class Chatty(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log_dict({f"chat{i}": loss.detach() * i for i in range(10)})
        return loss

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8 * STEPS, 4)), batch_size=8)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.fixture
def disk(tmp_path):
    small = SmallDisk(tmp_path / "disk", size=1 << 20)
    if small.kind != "tmpfs":
        pytest.skip("mounting a tmpfs needs root here")
    yield small.path
    small.close()


def test_after_a_refused_write_it_is_said_once_and_no_row_is_kept(disk, capfd):
    logger = CSVLogger(disk / "logs", flush_logs_every_n_steps=1)
    logger.on_write_error = "warn"
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, logger=logger, log_every_n_steps=1,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[FillDisk(str(disk), FILL_AT)])
    trainer.fit(Chatty())
    assert trainer.global_step == 2 * STEPS
    said = [line for line in capfd.readouterr().err.splitlines()
            if "could not write the CSV log" in line]
    assert len(said) == 1 and said[0].startswith("ptrain: warning: "), said
    assert logger.rows == []  # no row kept for a write that will not come


def test_hyperparameters_refused_by_a_full_disk_stop_with_one_clear_error(disk):
    """Lightning's logger raised the system's OSError and left hparams.toml cut short; this one
    stops with the csv plugin's LogWriteError and leaves the file as it was."""
    logger = CSVLogger(disk / "logs")
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, logger=logger, limit_train_batches=2,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Chatty())
    logger.log_hyperparams({"width": 4})
    hparams = Path(logger.log_dir) / "hparams.toml"
    before = hparams.read_text(encoding="utf-8")
    assert "width = 4" in before
    fill_tmpfs(disk)
    with pytest.raises(LogWriteError, match="could not write the hyperparameters") as refused:
        logger.log_hyperparams({"notes": "x" * 100_000})
    assert str(hparams) in str(refused.value) and "on-write-error warn" in str(refused.value)
    assert hparams.read_text(encoding="utf-8") == before
    assert [p.name for p in hparams.parent.iterdir() if p.name.endswith(".tmp")] == []
