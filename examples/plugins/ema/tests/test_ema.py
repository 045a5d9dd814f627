"""Tests of the ``ema`` callback, written only with ptrain's public API and the plugin kit
(``ptrain.testing``: the ``ptrain_fit``/``hook_recorder`` fixtures and ``CallbackSuite``)."""

from __future__ import annotations

import pytest
import torch

import ptrain
from ptrain.testing import CallbackSuite, TinyModule
from ptrain_ema import EMA


class TestEMAConformance(CallbackSuite):
    plugin = "ema"
    options = {"decay": 0.9}


class WeightLog:
    """The trained weights after every optimizer step (read at the end of each batch, when any
    validation of that batch has put them back)."""

    name = "weight-log"

    def __init__(self):
        self.steps: list[dict[str, torch.Tensor]] = []

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer):
        self.steps.append({n: p.detach().clone() for n, p in trainer.module.named_parameters()})


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("warmup", [False, True])
def test_the_average_follows_its_closed_form(ptrain_fit, hook_recorder, warmup):
    module = TinyModule()
    expected = weights(module)
    ema, log = EMA(decay=0.8, warmup=warmup), WeightLog()
    trainer = ptrain_fit(ema, log, hook_recorder, module=module)
    assert ema.updates == trainer.global_step == len(log.steps) == 8
    for n, step in enumerate(log.steps):
        decay = min(0.8, (1 + n) / (10 + n)) if warmup else 0.8
        expected = {k: decay * v + (1 - decay) * step[k] for k, v in expected.items()}
    for name, value in expected.items():
        torch.testing.assert_close(ema.average[name], value, rtol=1e-5, atol=1e-6)
    # updated inside each optimizer step, by a wrapper, after the step itself
    steps = hook_recorder.calls_of("optimizer_step")
    assert len(steps) == 8
    assert all(call.plugins[0] == "ema" and call.impls[0].wrapper for call in steps)


def test_validation_runs_on_the_average_and_training_on_the_weights(ptrain_fit):
    module, ema, log = TinyModule(), EMA(decay=0.5, warmup=False), WeightLog()
    trainer = ptrain_fit(ema, log, module=module)
    averaged = TinyModule()
    averaged.load_state_dict(ema.averaged_state_dict(module))
    # the validation set is one batch, so the logged epoch value is that batch's loss
    val_loss = float(trainer.callback_metrics["val_loss"])
    assert val_loss == pytest.approx(averaged.full_loss("validate"), rel=1e-5)
    assert abs(val_loss - module.full_loss("validate")) > 1e-4, "the average equals the weights"
    for name, value in weights(module).items():  # the trained weights are back after it
        assert torch.equal(value, log.steps[-1][name])


class ValidationProbe:
    """Whether the model held the average during each validation batch, and the trained
    weights when ``on_validation_end`` came (the checkpoint callback saves there)."""

    name = "validation-probe"

    def __init__(self, ema: EMA):
        self.ema = ema
        self.trained: dict[str, torch.Tensor] = {}
        self.averaged_batches: list[bool] = []
        self.trained_at_end: list[bool] = []

    @ptrain.hookimpl
    def on_train_step_end(self, trainer):  # before the validation the batch triggers
        self.trained = weights(trainer.module)

    @ptrain.hookimpl
    def on_evaluation_batch_end(self, trainer, stage):
        if stage == "validate" and not trainer.sanity_checking:
            self.averaged_batches.append(all(
                torch.equal(p, self.ema.average[n])
                for n, p in trainer.module.named_parameters()))

    @ptrain.hookimpl
    def on_validation_end(self, trainer):
        self.trained_at_end.append(all(torch.equal(p, self.trained[n])
                                       for n, p in trainer.module.named_parameters()))


def test_the_average_is_swapped_in_by_the_loop_hooks_not_per_step(ptrain_fit, hook_recorder):
    """The average goes in when the validation loop starts (on_loop_start, first of all) and
    out at on_validation_end: model_step was a wrapper, on every step, only to find the first
    validation batch."""
    module, ema = TinyModule(), EMA(decay=0.5, warmup=False)
    probe = ValidationProbe(ema)
    ptrain_fit(ema, probe, hook_recorder, module=module)
    assert not any("ema" in call.plugins for call in hook_recorder.calls_of("model_step"))
    starts = [call for call in hook_recorder.calls_of("on_loop_start")
              if call.kwargs["loop"] == "validate"]
    assert starts and all(call.plugins[0] == "ema" for call in starts)
    assert probe.averaged_batches and all(probe.averaged_batches)
    assert probe.trained_at_end and all(probe.trained_at_end)


def test_the_checkpoint_holds_the_average_and_a_resume_continues_it(ptrain_fit):
    first = EMA(decay=0.7)
    trainer = ptrain_fit(first, max_epochs=1)
    saved = torch.load(trainer.last_checkpoint_path, weights_only=True)["plugins"]["ema"]
    assert saved["updates"] == first.updates == 4
    for name, value in first.average.items():
        assert torch.equal(saved["average"][name], value.cpu())
    resumed, unbroken = EMA(decay=0.7), EMA(decay=0.7)
    ptrain_fit(resumed, ckpt_path=trainer.last_checkpoint_path)
    ptrain_fit(unbroken)
    assert resumed.updates == unbroken.updates == 8
    for name, value in unbroken.average.items():
        assert torch.equal(resumed.average[name], value)


def test_validate_from_a_checkpoint_uses_the_saved_average(ptrain_fit, tmp_path):
    ema = EMA(decay=0.5)
    module = TinyModule()
    trainer = ptrain_fit(ema, module=module)
    averaged = TinyModule()
    averaged.load_state_dict(ema.averaged_state_dict(module))
    validator = ptrain.Trainer(accelerator="cpu", default_root_dir=str(tmp_path / "val"),
                               callbacks=[EMA(), "no:progress-bar", "no:tensorboard"])
    [metrics] = validator.validate(TinyModule(), ckpt_path=str(trainer.last_checkpoint_path))
    assert metrics["val_loss"] == pytest.approx(averaged.full_loss("validate"), rel=1e-5)


@pytest.mark.parametrize("options, message", [
    ({"decay": 1.0}, "decay must be between 0 and 1"),
    ({"decay": -0.1}, "decay must be between 0 and 1"),
    ({"every_n_steps": 0}, "every_n_steps must be at least 1"),
])
def test_bad_options_are_usage_errors(ptrain_fit, options, message):
    with pytest.raises(ptrain.ConfigError, match=message):
        ptrain_fit("ema", plugin_options={"ema": options})
