"""Selecting plugins and data by name, in-process through ``ptrain.cli.main`` and ``Trainer``."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import ptrain
from ptrain.cli import main
from tests.conftest import TinyRegressor, make_regression_data


class RegressionData(ptrain.DataModule):
    """Data kept apart from the model; ``setup`` is called once before the loaders."""

    def __init__(self, n: int = 32, batch_size: int = 8):
        self.n, self.batch_size = n, batch_size
        self.stages: list[str] = []

    def setup(self, stage):
        self.stages.append(stage)
        self.train_set = make_regression_data(self.n, seed=0)
        self.val_set = make_regression_data(8, seed=1)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=8)


def test_a_datamodule_replaces_the_module_s_own_data(make_trainer):
    data = RegressionData(n=48, batch_size=12)
    trainer = make_trainer(max_epochs=1)
    trainer.fit(TinyRegressor(n=8, batch_size=8), datamodule=data)
    assert data.stages == ["fit"] and trainer.global_step == 4
    trainer.validate(TinyRegressor(), datamodule=data)
    assert data.stages == ["fit", "validate"]


def test_data_and_init_arguments_from_the_command_line(tmp_path, capsys):
    code = main(["fit", "--model", "tests.conftest:TinyRegressor", "--model.lr", "0.05",
                 "--data", "tests.test_selection:RegressionData", "--data.n", "40",
                 "--data.batch_size", "20", "--max-epochs", "2", "--no-progress-bar",
                 "--default-root-dir", str(tmp_path)])
    assert code == 0
    checkpoint = torch.load(tmp_path / "version_0" / "checkpoints" / "last.ckpt",
                            weights_only=True)
    assert checkpoint["loop"]["global_step"] == 4  # 40 samples / 20 per batch, 2 epochs
    assert checkpoint["config"]["data"]["init_args"] == {"n": 40, "batch_size": 20}
    assert checkpoint["config"]["model"]["init_args"] == {"lr": 0.05}


def test_two_plugins_of_an_exclusive_kind_is_a_usage_error(capsys):
    assert main(["fit", "--model", "tests.conftest:TinyRegressor", "--precision", "32-true",
                 "--precision", "64-true"]) == 2
    err = capsys.readouterr().err
    assert "one precision at a time" in err and "32-true, 64-true" in err


def test_a_plugin_of_another_kind_is_named_with_the_right_flag(capsys):
    assert main(["fit", "--model", "tests.conftest:TinyRegressor", "-p", "32-true"]) == 2
    assert "'32-true' is a precision plugin, not a callback; select it with --precision " \
           "32-true" in capsys.readouterr().err
    with pytest.raises(ptrain.PluginError, match="is a callback plugin, not a strategy"):
        ptrain.Trainer(strategy="checkpoint")


def test_auto_accelerator_falls_back_to_cpu():
    trainer = ptrain.Trainer(accelerator="auto", callbacks=["no:progress-bar"])
    assert type(trainer.plugins["cpu"]).__name__ == "CPUAccelerator"


def test_validate_command_restores_a_checkpoint_and_reports(tmp_path, capsys):
    common = ["--model", "tests.conftest:TinyRegressor", "--default-root-dir", str(tmp_path)]
    assert main(["fit", *common, "--max-epochs", "1", "--no-progress-bar"]) == 0
    capsys.readouterr()
    assert main(["validate", *common, "--ckpt-path", "last"]) == 0
    out = capsys.readouterr().out
    assert "Validation finished in " in out and "val_loss=" in out
    module = TinyRegressor()
    state = torch.load(tmp_path / "version_0" / "checkpoints" / "last.ckpt",
                       weights_only=True)["model"]
    module.load_state_dict(state)
    x, y = module.val_set.tensors
    expected = torch.nn.functional.mse_loss(module(x), y).item()
    reported = float(out.split("val_loss=")[1].split()[0])
    assert reported == pytest.approx(expected, rel=1e-3)


def test_single_device_refuses_more_than_one_device(make_trainer):
    with pytest.raises(ptrain.ConfigError, match="single-device strategy trains on one device"):
        make_trainer(devices=2, max_epochs=1).fit(TinyRegressor())
    make_trainer(devices=1, max_epochs=1).fit(TinyRegressor(n=8))
    # as Lightning: the CPU has no device indices (a GPU's [0] is one device)
    with pytest.raises(ptrain.ConfigError, match=r"--devices \[0\] names device indices"):
        make_trainer(devices=[0], max_epochs=1).fit(TinyRegressor(n=8))


@pytest.mark.parametrize("given, selected", [
    (16, "16-mixed"), ("16", "16-mixed"), ("bf16", "bf16-mixed"), (32, "32-true"),
    ("32", "32-true"), (64, "64-true"), ("bf16-mixed", "bf16-mixed"),
])
def test_lightning_precision_values_select_their_plugin(tmp_path, given, selected):
    trainer = ptrain.Trainer(accelerator="cpu", precision=given, default_root_dir=str(tmp_path))
    assert trainer.options["precision"] == selected and selected in trainer.plugins


def test_lightning_precision_value_from_the_cli(cli, tmp_path):
    result = cli("fit", "--model", "tests.conftest:TinyRegressor", "--accelerator", "cpu",
                 "--precision", "bf16", "--max-epochs", "1", "--print-config",
                 "--default-root-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert 'precision = "bf16-mixed"' in result.stdout


def test_options_for_a_plugin_outside_the_run_name_a_fix_that_works():
    """Options (a config's [plugins.NAME] table, plugin_options) for a plugin the run lacks: a
    name no plugin has is a typo (the closest installed name, no advice to enable it); another
    strategy than the run's, or a callback not enabled, is named with the flag that selects it
    and the way to set the options aside, and that way works."""
    from ptrain.catalog import Catalog

    with pytest.raises(ptrain.ConfigError) as info:
        ptrain.Trainer(callbacks=["early-stopping"],
                       plugin_options={"early-stoping": {"monitor": "val_loss"}})
    message = str(info.value)
    assert "no installed plugin is called 'early-stoping'. Did you mean 'early-stopping'?" \
        in message, message
    assert "-p early-stoping" not in message and "--strategy" not in message, message
    # a strategy table left in a config whose strategy was overridden (--strategy single-device)
    options = {"model-parallel": {"tensor_parallel_size": 1}}
    with pytest.raises(ptrain.ConfigError) as info:
        ptrain.Trainer(strategy="single-device", plugin_options=options)
    message = str(info.value)
    assert "'model-parallel', a strategy, but this run's strategy is 'single-device'" in message
    assert "--strategy model-parallel" in message and "-p no:model-parallel" in message, message
    ptrain.Trainer(strategy="single-device", callbacks=["no:model-parallel"],
                   plugin_options=options)
    # a callback not enabled
    options = {"early-stopping": {"monitor": "val_loss"}}
    with pytest.raises(ptrain.ConfigError, match="a callback that is not part of this run. "
                                                 "Enable it with -p early-stopping"):
        ptrain.Trainer(plugin_options=options)
    ptrain.Trainer(callbacks=["early-stopping"], plugin_options=options)
    # a first-party plugin whose distribution is not installed
    catalog = Catalog([i for i in Catalog.discover().infos if i.name != "wandb"])
    with pytest.raises(ptrain.ConfigError, match="'wandb', which comes with the distribution "
                                                 "ptrain-wandb, not installed here: pip install"):
        ptrain.Trainer(catalog=catalog, plugin_options={"wandb": {"project": "x"}})


def test_a_block_of_a_plugin_no_one_installed_is_said_with_the_closest_name(recwarn):
    """``no:NAME`` of a name no plugin has blocks nothing; a typo would leave on what it meant
    to turn off (and hide its options table). Said, not refused: a configuration may block a
    plugin another machine has."""
    ptrain.Trainer(accelerator="cpu", callbacks=["no:early-stopping", "no:progress-bar"])
    assert not [w for w in recwarn if "blocks nothing" in str(w.message)]
    with pytest.warns(UserWarning, match=r"-p no:progres-bar blocks nothing: no installed "
                                         r"plugin is called 'progres-bar'\. Did you mean "
                                         r"'progress-bar'\?"):
        trainer = ptrain.Trainer(accelerator="cpu", callbacks=["no:progres-bar"])
    assert "progress-bar" in trainer.plugins  # what the typo meant to turn off is still on
