"""``ptrain export`` / ``ptrain.export.export_safetensors``: a checkpoint's module weights as a
safetensors file. Real fits on one device, with 2-rank ddp and with 2-rank fsdp (its sharded
folder read directly and consolidated with ``ptrain-consolidate``); the files are read back with
``safetensors.torch.load_file`` and a model rebuilt from them is run."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import ptrain
from ptrain.checkpoint_io import (FOLDER_CHECKSUMS, FORMAT, FORMAT_VERSION, atomic_save,
                                  file_crc32, safe_load)
from ptrain.errors import CheckpointError, ConfigError
from ptrain.export import DCP_INDEX, SHARDED_META, export_safetensors, read_metadata, untie
from tests._cli_util import assert_ok, assert_usage_error
from tests._export_models import TiedLM, token_data
from tests.conftest import REPO, run_cli

QUIET = ["no:progress-bar", "no:tensorboard", "no:model-summary"]
MODEL = "tests._export_models:TiedLM"


def fit(root: Path, **options) -> tuple[ptrain.Trainer, TiedLM]:
    module = TiedLM(width=12)
    trainer = ptrain.Trainer(accelerator="cpu", default_root_dir=str(root), callbacks=QUIET,
                             max_epochs=1, seed=0, **options)
    trainer.fit(module)
    return trainer, module


def assert_same_tensors(exported: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]):
    assert exported.keys() == expected.keys()
    for name, tensor in expected.items():
        assert exported[name].dtype == tensor.dtype, name
        assert torch.equal(exported[name], tensor.detach().cpu()), name


def rebuilt_outputs(path: Path) -> torch.Tensor:
    """Build the model from the file's metadata alone and run it on fixed tokens."""
    info = read_metadata(path)
    module_path, _, cls_name = info["module_class"].partition(":")
    cls = getattr(__import__(module_path, fromlist=[cls_name]), cls_name)
    model = cls(**info["hyper_parameters"])
    model.load_state_dict(load_file(path), strict=True)
    assert model.head.weight is model.embed.weight  # the model's own tying holds after loading
    return model.eval()(token_data(4, seed=5).tensors[0])


def outputs(module: torch.nn.Module) -> torch.Tensor:
    return module.eval()(token_data(4, seed=5).tensors[0])


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    root = tmp_path_factory.mktemp("export-single")
    trainer, module = fit(root / "runs")
    return trainer.last_checkpoint_path, module, root


# ---------------------------------------------------------------------------------------------
# Single device


def test_exported_tensors_equal_the_checkpoints(single):
    checkpoint, module, root = single
    out = root / "py.safetensors"
    info = export_safetensors(checkpoint, out)
    saved = safe_load(checkpoint)
    exported = load_file(out)
    assert_same_tensors(exported, saved["model"])
    assert {"embed.weight", "head.weight", "scale", "frozen.weight"} <= exported.keys()
    assert info["tied"] == {"head.weight": "embed.weight"}
    assert info["tensors"] == len(saved["model"])
    with safe_open(str(out), framework="pt") as f:
        header = f.metadata()
    assert header["format"] == "pt"
    meta = json.loads(header["ptrain"])
    assert meta["module_class"] == "tests._export_models:TiedLM"
    assert meta["hyper_parameters"] == {"width": 12, "lr": 0.05, "batch_size": 8}
    assert meta["tied"] == {"head.weight": "embed.weight"}


def test_a_model_rebuilt_from_the_file_gives_the_same_outputs(single):
    checkpoint, module, root = single
    out = root / "rebuilt.safetensors"
    export_safetensors(checkpoint, out)
    torch.testing.assert_close(rebuilt_outputs(out), outputs(module), rtol=0, atol=0)


def test_untie_clones_shared_and_strided_storage():
    base = torch.arange(12.0)
    state = {"a": base.view(3, 4), "b": base.view(3, 4), "c": base[4:8], "t": base.view(3, 4).t(),
             "lone": torch.ones(2), "empty": torch.empty(0), "extra": {"not": "a tensor"}}
    tensors, tied, skipped = untie(state)
    assert tied == {"b": "a"} and skipped == ["extra"]
    pointers = [t.untyped_storage().data_ptr() for t in tensors.values() if t.numel()]
    assert len(pointers) == len(set(pointers))  # nothing shares storage any more
    for name in ("a", "b", "c", "t", "lone"):
        assert torch.equal(tensors[name], state[name]) and tensors[name].is_contiguous()


@pytest.mark.slow
def test_cli_exports_and_refuses_bad_input(single, tmp_path):
    checkpoint, module, root = single
    out = tmp_path / "model.safetensors"
    ok = run_cli("export", str(checkpoint), "--output", str(out), cwd=REPO)
    assert_ok(ok)
    assert f"wrote {out}" in ok.stdout and "1 tied" in ok.stdout
    assert_same_tensors(load_file(out), safe_load(checkpoint)["model"])

    again = run_cli("export", str(checkpoint), "--output", str(out), cwd=REPO)
    assert_usage_error(again, "exists already", "--force")
    forced = run_cli("export", str(checkpoint), "--output", str(out), "--force", cwd=REPO)
    assert_ok(forced)

    missing = run_cli("export", str(tmp_path / "nope.ckpt"), "--output",
                      str(tmp_path / "x.safetensors"), cwd=REPO)
    assert_usage_error(missing, "does not exist", "nope.ckpt")
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.ones(2)}, foreign)
    assert_usage_error(run_cli("export", str(foreign), "--output", str(tmp_path / "f.safetensors"),
                               cwd=REPO), "is not a ptrain checkpoint")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert_usage_error(run_cli("export", str(text), "--output", str(tmp_path / "t.safetensors"),
                               cwd=REPO), "notes.txt", "not a torch.save file")
    no_folder = tmp_path / "absent" / "model.safetensors"
    assert_usage_error(run_cli("export", str(checkpoint), "--output", str(no_folder), cwd=REPO),
                       "does not exist", "mkdir -p")
    assert not no_folder.parent.exists()
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    assert_usage_error(run_cli("export", str(plain_dir), "--output", str(tmp_path / "p.st"),
                               cwd=REPO), "not a sharded ptrain checkpoint")
    assert_usage_error(run_cli("export", str(checkpoint), cwd=REPO), "--output")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["model.safetensors", "foreign.pt", "notes.txt", "plain"])  # nothing half-written


def test_refusals_from_python(single, tmp_path):
    checkpoint, _, _ = single
    out = tmp_path / "m.safetensors"
    out.write_bytes(b"keep me")
    with pytest.raises(ConfigError, match="exists already"):
        export_safetensors(checkpoint, out)
    assert out.read_bytes() == b"keep me"
    with pytest.raises(ConfigError, match="is the checkpoint being exported"):
        export_safetensors(checkpoint, checkpoint, force=True)
    with pytest.raises(ConfigError, match="is a folder"):
        export_safetensors(checkpoint, tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        export_safetensors(tmp_path / "missing.ckpt", tmp_path / "n.safetensors")


# ---------------------------------------------------------------------------------------------
# Multi-process runs (2 gloo ranks on the CPU)


@pytest.mark.slow
def test_export_from_a_ddp_checkpoint(tmp_path):
    trainer, module = fit(tmp_path / "runs", strategy="ddp", devices=2)
    checkpoint = trainer.last_checkpoint_path
    assert checkpoint.is_file()
    out = tmp_path / "ddp.safetensors"
    info = export_safetensors(checkpoint, out)
    assert info["tied"] == {"head.weight": "embed.weight"}
    assert_same_tensors(load_file(out), safe_load(checkpoint)["model"])
    assert_same_tensors(load_file(out), module.state_dict())  # what the launcher adopted
    torch.testing.assert_close(rebuilt_outputs(out), outputs(module), rtol=0, atol=0)


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    pytest.importorskip("ptrain_fsdp")
    root = tmp_path_factory.mktemp("export-fsdp")
    trainer, module = fit(root / "runs", strategy="fsdp", devices=2)
    return trainer.last_checkpoint_path, module, root


@pytest.mark.slow
def test_export_directly_from_a_sharded_fsdp_folder(fsdp_run):
    folder, module, root = fsdp_run
    assert folder.is_dir() and (folder / DCP_INDEX).is_file() and (folder / SHARDED_META).is_file()
    out = root / "sharded.safetensors"
    result = run_cli("export", str(folder), "--output", str(out), cwd=REPO)
    assert_ok(result)
    assert_same_tensors(load_file(out), module.state_dict())
    assert read_metadata(out)["module_class"] == "tests._export_models:TiedLM"
    torch.testing.assert_close(rebuilt_outputs(out), outputs(module), rtol=0, atol=0)


@pytest.mark.slow
def test_export_from_a_consolidated_fsdp_checkpoint(fsdp_run):
    from ptrain_fsdp import checkpoint as fsdp_checkpoint

    assert fsdp_checkpoint.META == SHARDED_META  # the layout export reads without the plugin
    folder, module, root = fsdp_run
    consolidated = root / "consolidated.ckpt"
    fsdp_checkpoint.consolidate(folder, consolidated)
    out = root / "consolidated.safetensors"
    export_safetensors(consolidated, out)
    assert_same_tensors(load_file(out), safe_load(consolidated)["model"])
    assert_same_tensors(load_file(out), module.state_dict())
    torch.testing.assert_close(rebuilt_outputs(out), outputs(module), rtol=0, atol=0)


def test_a_folder_that_dcp_cannot_read_says_to_consolidate(tmp_path):
    folder = tmp_path / "last.ckpt"
    folder.mkdir()
    (folder / DCP_INDEX).write_bytes(b"not a dcp index")
    atomic_save({"format": FORMAT, "format_version": FORMAT_VERSION,
                 FOLDER_CHECKSUMS: {DCP_INDEX: file_crc32(folder / DCP_INDEX)}},
                folder / SHARDED_META)
    with pytest.raises(CheckpointError) as caught:
        export_safetensors(folder, tmp_path / "out.safetensors")
    message = str(caught.value)
    assert "could not be read" in message
    assert f"ptrain-consolidate {folder} " in message and "ptrain export" in message
    assert "\n" not in message


@pytest.mark.slow
def test_a_sharded_folder_with_changed_bytes_is_refused_and_nothing_written(fsdp_run, tmp_path):
    folder, _, _ = fsdp_run
    damaged = tmp_path / "damaged.ckpt"
    shutil.copytree(folder, damaged)
    shard = next(p for p in sorted(damaged.iterdir()) if p.name.startswith("__0_"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    out = tmp_path / "m.safetensors"
    result = run_cli("export", str(damaged), "--output", str(out), cwd=REPO)
    assert_usage_error(result, "failed its integrity check", shard.name, "Nothing was exported")
    assert not out.exists()


@pytest.mark.slow
def test_a_sharded_folder_without_its_checksums_is_refused_and_nothing_written(fsdp_run,
                                                                               tmp_path):
    folder, _, _ = fsdp_run
    cut = tmp_path / "cut.ckpt"
    shutil.copytree(folder, cut)
    (cut / SHARDED_META).unlink()
    out = tmp_path / "m.safetensors"
    result = run_cli("export", str(cut), "--output", str(out), cwd=REPO)
    assert_usage_error(result, f"has no {SHARDED_META}", "can't be checked",
                       "Nothing was exported")
    assert not out.exists()


def test_force_refuses_to_replace_what_is_not_a_regular_file(single, tmp_path):
    checkpoint, _, _ = single
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file.*nothing was written"):
        export_safetensors(checkpoint, fifo, force=True)
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_written_files_take_the_umask_not_0600(single, tmp_path):
    checkpoint, _, _ = single
    previous = os.umask(0o027)
    try:
        out = tmp_path / "m.safetensors"
        export_safetensors(checkpoint, out)
        saved = tmp_path / "copy.ckpt"
        atomic_save(safe_load(checkpoint), saved)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert stat.S_IMODE(saved.stat().st_mode) == 0o640
