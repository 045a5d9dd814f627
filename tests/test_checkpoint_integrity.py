"""A checkpoint proves its integrity (issue 21): bytes changed on disk after the save are found
at load and the checkpoint is refused, naming the file and what failed, for single files (the
CRC-32 every torch.save archive entry carries) and sharded folders (a CRC-32 per file, kept in
``meta.pt``)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import TinyRegressor, run_cli
from ptrain import CheckpointError, hookimpl
from ptrain.checkpoint_io import safe_load
from tests._cli_util import assert_usage_error

REPO = Path(__file__).resolve().parent.parent


def flip(path: Path, offset: int, count: int = 100) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, offset + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def tensor_data_offset(path: Path) -> tuple[int, int]:
    """Where the largest tensor's bytes start in the archive at ``path``, and their length."""
    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if "/data/" in i.filename),
                   key=lambda i: i.file_size)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2),
                                                                                 "little")
    return info.header_offset + 30 + name_len + extra_len, info.file_size


@pytest.fixture
def trained(make_trainer):
    module = TinyRegressor(n=256)
    trainer = make_trainer(max_epochs=1)
    trainer.fit(module)
    return trainer, Path(trainer.last_checkpoint_path)


def test_a_bit_flipped_checkpoint_is_refused_naming_the_damage(trained, make_trainer):
    _, last = trained
    start, size = tensor_data_offset(last)
    flip(last, start, min(100, size))
    with pytest.raises(CheckpointError) as refused:
        make_trainer().validate(TinyRegressor(n=256), ckpt_path=str(last))
    message = str(refused.value)
    assert "failed its integrity check" in message and str(last) in message
    assert "tensor data" in message


@pytest.mark.parametrize("stage", ["validate", "test", "predict", "fit"])
def test_the_cli_refuses_it_with_a_usage_error(make_trainer, stage):
    """Every stage that reads a checkpoint checks it first (issue 35)."""
    from tests._stage_models import StagedRegressor

    trainer = make_trainer(max_epochs=1)
    trainer.fit(StagedRegressor())
    last = Path(trainer.last_checkpoint_path)
    start, _ = tensor_data_offset(last)
    flip(last, start, 4)
    result = run_cli(stage, "--model", "tests._stage_models:StagedRegressor", "--ckpt-path",
                     str(last), "--accelerator", "cpu", "-p", "no:progress-bar")
    assert_usage_error(result, "failed its integrity check", str(last))


def test_an_intact_checkpoint_still_loads(trained, make_trainer):
    _, last = trained
    metrics = make_trainer().validate(TinyRegressor(n=256), ckpt_path=str(last))
    assert "val_loss" in metrics[0]


@pytest.mark.slow
def test_a_damaged_shard_of_a_sharded_checkpoint_is_refused(tmp_path):
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    script = REPO / "tests" / "_shard_resume_script.py"
    first = subprocess.run([sys.executable, str(script), "--root", str(root), "--out", str(out)],
                           cwd=REPO, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    last = root / "version_0" / "checkpoints" / "last.ckpt"
    # given to a strategy that reads single files, the folder is named for what it is
    with pytest.raises(CheckpointError, match="is a sharded checkpoint folder") as refused:
        safe_load(last)
    assert "ptrain-consolidate" in str(refused.value)
    # what ckpt_path='last-intact' asks of the strategy that wrote it (verify_checkpoint)
    from ptrain_fsdp.checkpoint import verify
    assert verify(last) is True and verify(out) is None
    shard = sorted(last.glob("__1_*.distcp"))[0]
    flip(shard, shard.stat().st_size // 2, 8)
    with pytest.raises(CheckpointError, match=f"failed its integrity check.*{shard.name}"):
        verify(last)
    resumed = subprocess.run([sys.executable, str(script), "--root", str(root), "--out",
                              str(out), "--resume"], cwd=REPO, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode != 0
    assert "failed its integrity check" in resumed.stderr, resumed.stderr[-3000:]
    assert repr(shard.name) in resumed.stderr, resumed.stderr[-3000:]
    # the other read paths of a sharded folder refuse it too, writing nothing (issue 35)
    for command in ([sys.executable, "-m", "ptrain_fsdp.consolidate", str(last),
                     str(tmp_path / "whole.ckpt")],
                    [sys.executable, "-m", "ptrain", "export", str(last), "--output",
                     str(tmp_path / "whole.safetensors")]):
        read = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert read.returncode == 2, (command, read.stderr[-3000:])
        assert "failed its integrity check" in read.stderr and "Traceback" not in read.stderr
    assert not (tmp_path / "whole.ckpt").exists()
    assert not (tmp_path / "whole.safetensors").exists()


def test_last_intact_falls_back_saying_so_and_last_does_not(make_trainer, tmp_path):
    """Two runs; the newest one's last.ckpt is damaged: --ckpt-path last refuses it,
    last-intact passes over it (saying so) to the newest checkpoint that is intact."""
    for _ in range(2):
        make_trainer(max_epochs=1).fit(TinyRegressor(n=256))
    damaged = tmp_path / "runs" / "version_1" / "checkpoints" / "last.ckpt"
    start, _ = tensor_data_offset(damaged)
    flip(damaged, start, 4)
    common = ["--model", "tests.conftest:TinyRegressor", "--model.n", "256", "--accelerator",
              "cpu", "-p", "no:progress-bar", "--default-root-dir", str(tmp_path / "runs")]
    assert_usage_error(run_cli("validate", *common, "--ckpt-path", "last"),
                       "failed its integrity check", "--ckpt-path last-intact")
    result = run_cli("validate", *common, "--ckpt-path", "last-intact")
    assert result.returncode == 0, result.stderr
    assert f"passing over {damaged}, which is not intact" in result.stderr
    intact = tmp_path / "runs" / "version_0" / "checkpoints" / "last.ckpt"
    assert f"using {intact}, the newest intact checkpoint" in result.stderr


class RefuseVersion1:
    """A plugin with its own idea of intact: it refuses every checkpoint of ``version_1``."""

    name = "refuse-version-1"

    @hookimpl(tryfirst=True)
    def verify_checkpoint(self, path):
        if "version_1" in Path(path).parts:
            raise CheckpointError(f"{path}: refused by the test's own check")
        return None


def test_last_intact_asks_every_plugin_that_verifies_checkpoints(make_trainer, tmp_path,
                                                                 capsys):
    for _ in range(2):
        make_trainer(max_epochs=1).fit(TinyRegressor(n=256))
    trainer = make_trainer(callbacks=["no:progress-bar", RefuseVersion1()])
    trainer.validate(TinyRegressor(n=256), ckpt_path="last-intact")
    stderr = capsys.readouterr().err
    refused = tmp_path / "runs" / "version_1" / "checkpoints" / "last.ckpt"
    assert f"passing over {refused}, which is not intact ({refused}: refused by the test's " \
           f"own check)" in stderr, stderr
    assert trainer.ckpt_path == str(tmp_path / "runs" / "version_0" / "checkpoints" /
                                    "last.ckpt")


def test_last_intact_under_a_launched_job_says_it_once_and_skips_what_fsdp_cant_read(tmp_path):
    """An fsdp run, then a newer single-device run: fsdp's last-intact passes over the newer
    single file (fsdp resumes only from its sharded folders) to the fsdp run's folder, and the
    job's two processes say so once."""
    common = ["--model", "tests.conftest:TinyRegressor", "--accelerator", "cpu",
              "-p", "no:progress-bar", "-p", "no:tensorboard",
              "--default-root-dir", str(tmp_path / "runs")]
    fsdp = ["--strategy", "fsdp", "--devices", "2"]
    for extra in (fsdp, []):
        first = run_cli("fit", *common, *extra, "--max-epochs", "1")
        assert first.returncode == 0, first.stderr
    single_file = tmp_path / "runs" / "version_1" / "checkpoints" / "last.ckpt"
    assert single_file.is_file()
    result = run_cli("fit", *common, *fsdp, "--max-epochs", "2", "--ckpt-path", "last-intact")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("passing over") == 1, result.stderr
    assert f"passing over {single_file}, which this run's strategy can't resume from" \
        in result.stderr, result.stderr
    sharded = tmp_path / "runs" / "version_0" / "checkpoints" / "last.ckpt"
    assert result.stderr.count(f"using {sharded}, the newest intact") == 1, result.stderr
    assert safe_load(sharded / "meta.pt")["loop"]["epoch"] == 2
