"""The ``fused-optimizer`` callback (distribution ``ptrain-fused-optimizer``): real fits on the CPU
(torch has fused Adam, AdamW, SGD and Adagrad kernels there). Which kernel an optimizer's step
runs is read from ``torch.profiler``'s operator names (``aten::_fused_adam_``,
``aten::_foreach_*``), not from the settings the plugin wrote."""

from __future__ import annotations

import pytest
import torch

import ptrain
from ptrain import ConfigError
from ptrain_fused_optimizer import FusedOptimizer
from tests._cli_util import assert_ok, assert_usage_error
from tests.conftest import TinyRegressor, run_cli
from conftest import DIGITS_CONFIG

QUIET = ["no:progress-bar", "no:tensorboard", "no:checkpoint", "no:model-summary"]


class RMSpropRegressor(TinyRegressor):
    """An optimizer torch has no fused kernel for (it has a foreach one)."""

    def configure_optimizers(self):
        return torch.optim.RMSprop(self.parameters(), lr=0.01)


def fit(tmp_path, module, *callbacks, **options):
    trainer = ptrain.Trainer(max_epochs=2, seed=0, default_root_dir=str(tmp_path),
                             callbacks=[*QUIET, *callbacks], **options)
    trainer.fit(module)
    return trainer


def step_operators(optimizer: torch.optim.Optimizer) -> set[str]:
    """The operators one more step of ``optimizer`` runs (its gradients set to ones)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = torch.ones_like(param)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        optimizer.step()
    return {event.key for event in prof.key_averages()}


def seeded_adam_regressor() -> TinyRegressor:
    ptrain.seed_everything(0)  # the same initial weights for both runs
    return TinyRegressor(optimizer="adam")


def test_adam_steps_with_the_fused_kernel_and_trains_as_before(tmp_path):
    plain = fit(tmp_path / "plain", seeded_adam_regressor())
    plugin = FusedOptimizer()
    fused = fit(tmp_path / "fused", seeded_adam_regressor(), plugin)
    assert plugin.switched == [("Adam", "default")]
    for a, b in zip(plain.module.parameters(), fused.module.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the same update, rounded
    assert fused.optimizers[0].state_dict()["state"]  # a state a resume can load
    assert "aten::_fused_adam_" in step_operators(fused.optimizers[0])
    assert "aten::_fused_adam_" not in step_operators(plain.optimizers[0])


def test_foreach_by_name_with_its_option(tmp_path):
    trainer = fit(tmp_path, TinyRegressor(), "fused-optimizer",
                  plugin_options={"fused-optimizer": {"implementation": "foreach"}})
    operators = step_operators(trainer.optimizers[0])
    assert any(op.startswith("aten::_foreach_") for op in operators), sorted(operators)
    assert trainer.plugins.get("fused-optimizer").switched == [("SGD", "default")]


def test_an_optimizer_without_the_implementation_is_refused_before_training(tmp_path):
    with pytest.raises(ConfigError) as info:
        fit(tmp_path, RMSpropRegressor(), FusedOptimizer())
    message = str(info.value)
    assert "RMSprop has no fused implementation" in message
    assert "Adam, AdamW" in message and "--fused-optimizer-implementation foreach" in message
    assert not list(tmp_path.rglob("*.ckpt"))
    foreach = fit(tmp_path / "foreach", RMSpropRegressor(), FusedOptimizer("foreach"))
    assert foreach.global_step == 16


def test_a_bad_implementation_is_a_usage_error(tmp_path):
    with pytest.raises(ConfigError, match="'bogus' is not one of fused, foreach"):
        FusedOptimizer("bogus")
    result = run_cli("fit", "--config", DIGITS_CONFIG, "-p", "fused-optimizer",
                     "--fused-optimizer-implementation", "bogus",
                     "--default-root-dir", str(tmp_path / "runs"))
    assert_usage_error(result, "--fused-optimizer-implementation", "'bogus'", "fused", "foreach")
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_the_digits_example_trains_with_it_from_the_cli(tmp_path):
    result = run_cli("fit", "--config", DIGITS_CONFIG, "-p", "fused-optimizer",
                     "--max-epochs", "1", "--no-progress-bar",
                     "--default-root-dir", str(tmp_path / "runs"))
    assert_ok(result)
    assert (tmp_path / "runs" / "version_0" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_a_strategy_that_replaces_the_optimizer_is_refused_with_what_to_do(tmp_path):
    result = run_cli("fit", "--config", DIGITS_CONFIG, "-p", "fused-optimizer",
                     "--strategy", "zero1", "--devices", "2", "--accelerator", "cpu",
                     "--max-epochs", "1", "--default-root-dir", str(tmp_path / "runs"),
                     timeout=300)
    assert_usage_error(result, "--strategy zero1 replaced the optimizer",
                       "ZeroRedundancyOptimizer", "fused=True")
    assert not list(tmp_path.rglob("*.ckpt"))
