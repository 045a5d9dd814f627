"""Checkpoints and plugins that can't be used, named for what they are (issue 35): each case is a
real ``ptrain`` process that ends in one ``ptrain: error:`` paragraph (exit 2) saying what is
wrong and a fix, and the fix is followed where it is a command.

The model is written into each test's folder (``mymodels.py``) and imported from there, as a
user's own module is, so that a class can be renamed between the save and the load."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from tests._cli_util import assert_ok, assert_usage_error
from tests._campaigns import JOB_MODULES

pytestmark = [pytest.mark.slow, JOB_MODULES]

COMMON = ["--accelerator", "cpu", "-p", "no:progress-bar", "-p", "no:model-summary"]

MODELS = textwrap.dedent('''
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import ptrain


    class Net(ptrain.TrainModule):
        def __init__(self, width: int = 4):
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(nn.Linear(4, width), nn.Linear(width, 1))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self(x), y))

        def test_step(self, batch, batch_idx):
            self.validation_step(batch, batch_idx)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def _loader(self):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(16, 4, generator=g)
            return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)

        def train_dataloader(self):
            return self._loader()

        def val_dataloader(self):
            return self._loader()

        def test_dataloader(self):
            return self._loader()
''')


def _fit(folder: Path, *args: str, models: str = MODELS) -> Path:
    """Train ``mymodels:Net`` (of ``models``, the module's text) for one epoch in ``folder``;
    the run's ``last.ckpt``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mymodels.py").write_text(models)
    result = run_cli("fit", "--model", "mymodels:Net", "--max-epochs", "1",
                     "--default-root-dir", "runs", *COMMON, *args, cwd=folder)
    assert_ok(result)
    last = folder / "runs" / "version_0" / "checkpoints" / "last.ckpt"
    assert last.exists()
    return last


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A run of ``Net`` of width 8 (not the default 4); its ``last.ckpt``."""
    return _fit(tmp_path_factory.mktemp("named") / "w8", "--model.width", "8")


def test_a_checkpoint_without_its_model_entry_is_named(trained, tmp_path):
    folder = trained.parents[3]
    checkpoint = torch.load(trained, map_location="cpu", weights_only=True)
    del checkpoint["model"]
    edited = folder / "edited.ckpt"
    torch.save(checkpoint, edited)
    for stage in ("fit", "validate", "test"):
        result = run_cli(stage, "--model", "mymodels:Net", "--model.width", "8", "--ckpt-path",
                         "edited.ckpt", "--default-root-dir", str(tmp_path / "runs"), *COMMON,
                         cwd=folder)
        message = assert_usage_error(result, "'edited.ckpt' lacks 'model'", "'optimizers'",
                                     "'loop'", "a ptrain checkpoint holds",
                                     "another one of the same run folder")
        assert "KeyError" not in message
    rebuilt = run_cli("validate", "--ckpt-path", "edited.ckpt", *COMMON, cwd=folder)
    assert_usage_error(rebuilt, "'edited.ckpt' lacks 'model'")
    exported = run_cli("export", "edited.ckpt", "--output", str(tmp_path / "w.safetensors"),
                       cwd=folder)
    assert_usage_error(exported, "'edited.ckpt' lacks 'model'", "a ptrain checkpoint holds")
    assert not (tmp_path / "w.safetensors").exists()
    # the same file with its weights resumes: what the message said was missing was all of it
    checkpoint["model"] = torch.load(trained, map_location="cpu", weights_only=True)["model"]
    torch.save(checkpoint, edited)
    assert_ok(run_cli("validate", "--ckpt-path", "edited.ckpt", *COMMON, cwd=folder))


def test_resuming_fit_names_each_missing_entry(trained, tmp_path):
    folder = trained.parents[3]
    checkpoint = torch.load(trained, map_location="cpu", weights_only=True)
    del checkpoint["rng"], checkpoint["loop"]
    torch.save(checkpoint, folder / "norng.ckpt")
    result = run_cli("fit", "--model", "mymodels:Net", "--model.width", "8", "--ckpt-path",
                     "norng.ckpt", "--default-root-dir", str(tmp_path / "runs"), *COMMON,
                     cwd=folder)
    assert_usage_error(result, "'loop' (the loop counters)",
                       "'rng' (the random generators' states)", "fit can't resume from it")
    # evaluating needs only the weights
    assert_ok(run_cli("validate", "--model", "mymodels:Net", "--model.width", "8",
                      "--ckpt-path", "norng.ckpt", *COMMON, cwd=folder))


def test_a_foreign_file_says_what_a_ptrain_checkpoint_holds(tmp_path):
    torch.save({"x": 1}, tmp_path / "c.ckpt")
    (tmp_path / "mymodels.py").write_text(MODELS)
    result = run_cli("validate", "--model", "mymodels:Net", "--ckpt-path", "c.ckpt", *COMMON,
                     cwd=tmp_path)
    assert_usage_error(result, "'c.ckpt' is not a ptrain checkpoint (it holds ['x']",
                       "a ptrain checkpoint holds 'format': 'ptrain-checkpoint', 'model'")


def test_a_state_dict_mismatch_keeps_torchs_detail_and_names_the_fitting_config(trained):
    folder = trained.parents[3]
    result = run_cli("validate", "--model", "mymodels:Net", "--ckpt-path", str(trained),
                     *COMMON, cwd=folder)
    message = assert_usage_error(
        result, "does not fit this model (Net)", "size mismatch for net.0.weight",
        "torch.Size([8, 4]) from checkpoint", "torch.Size([4, 4])",
        "size mismatch for net.1.weight",
        "It was written by --model mymodels:Net --model.width 8", "hparams.toml")
    assert "\n" not in message.strip()
    # following it: those init arguments, or no --model at all
    assert_ok(run_cli("validate", "--model", "mymodels:Net", "--model.width", "8",
                      "--ckpt-path", str(trained), *COMMON, cwd=folder))
    assert_ok(run_cli("validate", "--ckpt-path", str(trained), *COMMON, cwd=folder))


def test_a_mismatch_of_a_run_with_the_models_defaults_names_the_defaults_of_then(tmp_path):
    """A run that gave no --model.KEY was said to be written "by --model mymodels:Net: give
    those init arguments", naming none. It names the defaults of then (saved with the
    checkpoint) and how this model differs, whether this command gave another width or the
    model's default changed since; and, when the hyperparameters are alike, that the code
    changed."""
    last = _fit(tmp_path / "defaults")
    folder = last.parents[3]
    model = folder / "mymodels.py"
    given = run_cli("validate", "--model", "mymodels:Net", "--model.width", "6", "--ckpt-path",
                    str(last), *COMMON, cwd=folder)
    model.write_text(MODELS.replace("width: int = 4", "width: int = 6"))
    changed = run_cli("validate", "--model", "mymodels:Net", "--ckpt-path", str(last), *COMMON,
                      cwd=folder)
    for result in (given, changed):
        message = assert_usage_error(
            result, "does not fit this model (Net)", "size mismatch for net.0.weight",
            "The checkpoint's model was built with width=4, this one with width=6.",
            "It was written by --model mymodels:Net with the model's defaults, which were then "
            "--model.width 4", "give those init arguments, or leave --model out to build "
            "the model from the checkpoint's saved hyperparameters.")
    # following it, either way (the saved width, not the default of now)
    assert_ok(run_cli("validate", "--model", "mymodels:Net", "--model.width", "4",
                      "--ckpt-path", str(last), *COMMON, cwd=folder))
    assert_ok(run_cli("validate", "--ckpt-path", str(last), *COMMON, cwd=folder))
    # the same hyperparameters, other layers: the code changed
    model.write_text(MODELS.replace("nn.Linear(width, 1))",
                                    "nn.Linear(width, 2), nn.Linear(2, 1))"))
    message = assert_usage_error(
        run_cli("validate", "--model", "mymodels:Net", "--ckpt-path", str(last), *COMMON,
                cwd=folder),
        "Missing key(s) in state_dict", "with the model's defaults; this model has the same "
        "hyperparameters (--model.width 4), so the model's code has changed since")
    assert "give those init arguments" not in message


def test_a_mismatch_of_a_model_that_saved_no_hyperparameters_blames_no_code_change(tmp_path):
    """A model without save_hyperparameters() saved ``{}``, and this model's ``{}`` was taken
    for "the same hyperparameters, so the model's code changed", also when the command gave
    another --model.width. Nothing says how either was built: the message names the run's
    init arguments, and a code change only as what is left when they were given."""
    runs = {}
    for name, args in (("defaults", ()), ("given", ("--model.width", "8"))):
        runs[name] = _fit(tmp_path / name, *args,
                          models=MODELS.replace("self.save_hyperparameters()", "pass"))
        assert not torch.load(runs[name], weights_only=True).get("hyper_parameters")

    def other_width(name):
        return run_cli("validate", "--model", "mymodels:Net", "--model.width", "6",
                       "--ckpt-path", str(runs[name]), *COMMON, cwd=tmp_path / name)

    messages = [assert_usage_error(other_width("defaults"), "size mismatch for net.0.weight",
                                   "with the model's defaults (no init arguments, and it saved "
                                   "no hyperparameters): leave out any --model.KEY you gave"),
                assert_usage_error(other_width("given"), "size mismatch for net.0.weight",
                                   "It was written by --model mymodels:Net --model.width 8, and "
                                   "it saved no hyperparameters", "give exactly those init "
                                   "arguments", "leave --model out")]
    assert not any("same hyperparameters" in message for message in messages)
    assert_ok(run_cli("validate", "--model", "mymodels:Net", "--model.width", "8",
                      "--ckpt-path", str(runs["given"]), *COMMON, cwd=tmp_path / "given"))


def test_a_mismatch_in_an_init_argument_the_model_does_not_save_blames_no_code_change(tmp_path):
    """``save_hyperparameters(ignore=["width"])`` leaves the width out of the saved ones, which
    were then alike, so a run given another width was told the model's code had changed. The
    message names the init argument the model does not save, as the run of then gave it."""
    models = MODELS.replace("def __init__(self, width: int = 4):",
                            "def __init__(self, width: int = 4, tag: str = 'a'):").replace(
        "self.save_hyperparameters()", "self.save_hyperparameters(ignore=['width'])")
    last = _fit(tmp_path, "--model.width", "8", models=models)
    assert torch.load(last, weights_only=True)["hyper_parameters"] == {"tag": "a"}
    message = assert_usage_error(
        run_cli("validate", "--model", "mymodels:Net", "--model.width", "6", "--ckpt-path",
                str(last), *COMMON, cwd=tmp_path),
        "size mismatch for net.0.weight", "It was written by --model mymodels:Net "
        "--model.width 8", "this model saved the same hyperparameters, but the model does not "
        "save --model.width 8, which that run gave: give those init arguments.")
    assert "so the model's code has changed" not in message
    assert_ok(run_cli("validate", "--model", "mymodels:Net", "--model.width", "8",
                      "--ckpt-path", str(last), *COMMON, cwd=tmp_path))


def test_a_class_renamed_since_the_save_says_the_checkpoint_named_it(trained, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(trained.parents[3], moved)
    (moved / "mymodels.py").write_text(MODELS.replace("class Net(", "class Renamed("))
    last = moved / "runs" / "version_0" / "checkpoints" / "last.ckpt"
    result = run_cli("validate", "--ckpt-path", str(last), *COMMON, cwd=moved)
    message = assert_usage_error(
        result, "names 'mymodels:Net' as the class to build its model from",
        "AttributeError", "renamed or moved", "--model MODULE:CLASS overrides the checkpoint's",
        "--model.width 8")
    assert "--model 'mymodels:Net' could not be imported" not in message
    # following it
    assert_ok(run_cli("validate", "--model", "mymodels:Renamed", "--model.width", "8",
                      "--ckpt-path", str(last), *COMMON, cwd=moved))


def _broken_distribution(site: Path) -> None:
    """An installed distribution ``ptrain-shaky`` whose strategy and precision entry points
    name a module that raises on import (a missing shared library)."""
    info = site / "ptrain_shaky-0.3.dist-info"
    info.mkdir(parents=True)
    (site / "ptrain_shaky.py").write_text(
        'raise ImportError("libshaky.so.1: cannot open shared object file")\n')
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ptrain-shaky\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(
        "[ptrain.strategies]\nshaky = ptrain_shaky:Strategy\n\n"
        "[ptrain.precision]\nshaky-16 = ptrain_shaky:Precision\n")


@pytest.mark.parametrize("kind,name", [("strategy", "shaky"), ("precision", "shaky-16")])
def test_a_broken_strategy_or_precision_gets_a_fix_for_its_kind(tmp_path, kind, name):
    site = tmp_path / "site"
    _broken_distribution(site)
    (tmp_path / "mymodels.py").write_text(MODELS)
    env = {"PYTHONPATH": str(site), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    result = run_cli("fit", "--model", "mymodels:Net", f"--{kind}", name, "--max-epochs", "1",
                     "--default-root-dir", "runs", *COMMON, cwd=tmp_path, env=env)
    message = assert_usage_error(
        result, f"{kind} {name!r} (ptrain-shaky 0.3) failed to import", "libshaky.so.1",
        "pip uninstall ptrain-shaky", f"choose another {kind} (--{kind} NAME")
    assert "-p no:" not in message
    # following it: another one of the kind, the broken distribution still installed
    other = {"strategy": "single-device", "precision": "32-true"}[kind]
    assert_ok(run_cli("fit", "--model", "mymodels:Net", f"--{kind}", other, "--max-epochs", "1",
                      "--default-root-dir", "runs", *COMMON, cwd=tmp_path, env=env))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """A 2-rank fsdp run's folder; its ``last.ckpt`` is a sharded checkpoint folder."""
    last = _fit(tmp_path_factory.mktemp("named") / "fsdp", "--strategy", "fsdp", "--devices",
                "2")
    assert (last / ".metadata").is_file() and (last / "meta.pt").is_file()
    return last.parents[3]


@pytest.mark.parametrize("missing,words", [
    ("meta.pt", ["sharded checkpoint folder without its meta.pt", "loop counters"]),
    (".metadata", ["sharded checkpoint folder without its .metadata file",
                   "2 .distcp shard file(s), meta.pt"]),
])
def test_a_sharded_folder_missing_a_file_names_it_and_last_intact_resumes(sharded, tmp_path,
                                                                          missing, words):
    """The newest run's ``last.ckpt`` lacks ``missing``; an older run of the same root is
    intact. ``--ckpt-path last`` is refused naming the file (under fsdp and single-device);
    ``--ckpt-path last-intact``, the fix the message gives, resumes from the older run."""
    folder = tmp_path / "w"
    shutil.copytree(sharded, folder)
    runs = folder / "runs"
    shutil.copytree(runs / "version_0", runs / "version_1")
    (runs / "version_1" / "checkpoints" / "last.ckpt" / missing).unlink()
    fsdp = ["--model", "mymodels:Net", "--strategy", "fsdp", "--devices", "2", "--max-epochs",
            "2", "--default-root-dir", "runs", *COMMON]
    needles = [*words, "version_1", "--ckpt-path last-intact"]
    message = assert_usage_error(run_cli("fit", *fsdp, "--ckpt-path", "last", cwd=folder),
                                 *needles)
    assert "--strategy ddp" not in message and "`last`" not in message
    single = ["--model", "mymodels:Net", "--ckpt-path", "last", "--default-root-dir", "runs",
              *COMMON]
    assert_usage_error(run_cli("validate", *single, cwd=folder), *needles)
    resumed = run_cli("fit", *fsdp, "--ckpt-path", "last-intact", cwd=folder)
    assert_ok(resumed)
    assert "passing over" in resumed.stderr and "version_1" in resumed.stderr
    assert "version_0" in resumed.stderr and "newest intact checkpoint" in resumed.stderr


def test_load_from_checkpoint_names_a_missing_model_entry(trained, tmp_path, monkeypatch):
    """The same refusal from Python, where ``load_from_checkpoint`` read ``checkpoint["model"]``."""
    from ptrain.errors import CheckpointError

    checkpoint = torch.load(trained, map_location="cpu", weights_only=True)
    del checkpoint["model"]
    torch.save(checkpoint, tmp_path / "edited.ckpt")
    monkeypatch.syspath_prepend(str(trained.parents[3]))
    import mymodels

    try:
        with pytest.raises(CheckpointError, match=r"edited.ckpt' lacks 'model'.*it holds \["):
            mymodels.Net.load_from_checkpoint(tmp_path / "edited.ckpt")
        assert mymodels.Net.load_from_checkpoint(trained).net[0].out_features == 8
    finally:
        sys.modules.pop("mymodels", None)  # not left imported for the tests that follow
