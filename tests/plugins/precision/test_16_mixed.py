"""``16-mixed``: float16 autocast with a gradient scaler, on the CPU (torch's CPU autocast
supports float16 and ``torch.amp.GradScaler("cpu")`` exists, so nothing here needs a GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import ptrain
from tests.conftest import TinyRegressor

SCRIPT = Path(__file__).resolve().parents[2] / "_resume_script.py"
#: A starting scale this small model's float16 activations can carry: with the default 2**16 its
#: first steps overflow and are skipped (correctly), which would blur the step-by-step checks.
FITTING_SCALE = {"16-mixed": {"init_scale": 1024.0}}


class PoisonedGradient(TinyRegressor):
    """At ``bad_batch`` an autograd hook turns the last layer's weight gradient to inf (the loss
    itself stays finite, as in a real fp16 overflow)."""

    def __init__(self, bad_batch: int, **kwargs):
        super().__init__(**kwargs)
        self.bad_batch = bad_batch

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if batch_idx == self.bad_batch:
            handle = None

            def poison(grad):
                handle.remove()
                return torch.full_like(grad, float("inf"))

            handle = self.net[1].weight.register_hook(poison)
        return loss


class StepWatcher:
    """Parameters and scale just before each step (after unscaling) and after the batch."""

    name = "step-watcher"

    def __init__(self):
        self.before, self.after = {}, {}

    @ptrain.hookimpl
    def on_before_optimizer_step(self, trainer):
        scaler = trainer.plugins["16-mixed"].scaler
        self.before[trainer.batch_idx] = (self._params(trainer), scaler.get_scale())

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer, batch_idx):
        scaler = trainer.plugins["16-mixed"].scaler
        self.after[batch_idx] = (self._params(trainer), scaler.get_scale())

    @staticmethod
    def _params(trainer):
        return [p.detach().clone() for p in trainer.module.parameters()]


def test_an_overflowing_step_is_skipped_and_the_scale_lowered(make_trainer):
    watcher = StepWatcher()
    trainer = make_trainer(precision="16-mixed", callbacks=["no:progress-bar", watcher],
                           max_epochs=1, plugin_options=FITTING_SCALE)
    trainer.fit(PoisonedGradient(bad_batch=2, n=48, batch_size=8))
    (params_before, scale_before), (params_after, scale_after) = watcher.before[2], watcher.after[2]
    assert all(torch.equal(a, b) for a, b in zip(params_before, params_after))
    assert scale_after == scale_before * 0.5
    good_before, good_scale = watcher.before[3]
    good_after, good_scale_after = watcher.after[3]
    assert not all(torch.equal(a, b) for a, b in zip(good_before, good_after))
    assert good_scale_after == good_scale  # no growth before growth_interval good steps
    assert trainer.global_step == 6  # a skipped step still counts as a step taken


def _hand_16_mixed(module, steps_per_epoch_batches, clip):
    """float16 autocast forward and loss, float32 gradients without any scaling, clipped."""
    optimizer = torch.optim.SGD(module.parameters(), lr=module.lr)
    for x, y in steps_per_epoch_batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(module(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("clip", [0.05, None])
def test_clipping_acts_on_unscaled_gradients(make_trainer, clip):
    torch.manual_seed(0)
    module = TinyRegressor(n=32, batch_size=8, lr=0.5, with_val=False)
    reference = TinyRegressor(n=32, batch_size=8, lr=0.5, with_val=False)
    reference.load_state_dict(module.state_dict())
    make_trainer(precision="16-mixed", max_epochs=1, gradient_clip_val=clip,
                 plugin_options=FITTING_SCALE).fit(module)
    _hand_16_mixed(reference, list(reference.train_dataloader()), clip)
    for ours, theirs in zip(module.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-4)


def test_clipping_changes_the_result_so_the_comparison_above_means_something(make_trainer):
    torch.manual_seed(0)
    clipped = TinyRegressor(n=32, batch_size=8, lr=0.5, with_val=False)
    unclipped = TinyRegressor(n=32, batch_size=8, lr=0.5, with_val=False)
    unclipped.load_state_dict(clipped.state_dict())
    make_trainer(precision="16-mixed", max_epochs=1, gradient_clip_val=0.05,
                 plugin_options=FITTING_SCALE).fit(clipped)
    make_trainer(precision="16-mixed", max_epochs=1, plugin_options=FITTING_SCALE).fit(unclipped)
    diff = max((a - b).abs().max().item()
               for a, b in zip(clipped.parameters(), unclipped.parameters()))
    assert diff > 1e-2


class TwoParts(ptrain.TrainModule):
    automatic_optimization = False

    def __init__(self):
        super().__init__()
        self.inner = TinyRegressor(n=32, batch_size=8, with_val=False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        first, second = self.optimizers()
        for optimizer in (first, second):
            loss = nn.functional.mse_loss(self.inner(x), y)
            self.manual_backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        return loss

    def configure_optimizers(self):
        net = self.inner.net[1]
        return [torch.optim.SGD([net.weight], lr=0.1), torch.optim.SGD([net.bias], lr=0.1)]

    def train_dataloader(self):
        return self.inner.train_dataloader()


def test_one_scaler_for_several_optimizers_updates_once_per_batch(make_trainer):
    trainer = make_trainer(precision="16-mixed", max_epochs=1, plugin_options=FITTING_SCALE)
    trainer.fit(TwoParts())
    assert trainer.global_step == 8  # 4 batches, 2 optimizer steps each
    assert trainer.plugins["16-mixed"].scaler.state_dict()["_growth_tracker"] == 4


def test_accumulation_updates_the_scale_only_when_stepping(make_trainer):
    trainer = make_trainer(precision="16-mixed", max_epochs=1, accumulate_grad_batches=2,
                           plugin_options=FITTING_SCALE)
    trainer.fit(TinyRegressor(n=64, batch_size=8))
    assert trainer.global_step == 4
    assert trainer.plugins["16-mixed"].scaler.state_dict()["_growth_tracker"] == 4


class MetaAccelerator:
    name = "meta-device"

    @ptrain.hookimpl
    def setup_device(self):
        return torch.device("meta")


def test_a_device_without_float16_autocast_is_refused_at_start_up(make_trainer):
    with pytest.raises(ptrain.PluginError, match="use --precision bf16-mixed"):
        make_trainer(precision="16-mixed", accelerator=MetaAccelerator(),
                     max_epochs=1).fit(TinyRegressor())


def _script(tmp_path, out, *extra):
    cmd = [sys.executable, str(SCRIPT), "--root", str(tmp_path / "runs"), "--out", str(out),
           "--precision", "16-mixed", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_resume_after_sigkill_restores_the_scaler_exactly(tmp_path):
    whole = _script(tmp_path / "whole", tmp_path / "whole.pt")
    assert whole.returncode == 0, whole.stderr
    killed = _script(tmp_path / "cut", tmp_path / "unused.pt", "--kill-step", "11")
    assert killed.returncode == -9, killed.stderr
    resumed = _script(tmp_path / "cut", tmp_path / "resumed.pt", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    a = torch.load(tmp_path / "whole.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert a["precision_state"] == b["precision_state"] and "scale" in a["precision_state"]
    for name in a["params"]:
        assert torch.equal(a["params"][name], b["params"][name]), name


class Stream(torch.utils.data.IterableDataset):
    """Five batches of 8 with no length: the last accumulation window (of 2) is incomplete and
    is stepped after the epoch's last on_train_batch_end."""

    def __iter__(self):
        data = TinyRegressor(n=40, with_val=False).train_set
        return iter(data[i] for i in range(len(data)))


class StreamRegressor(TinyRegressor):
    def train_dataloader(self):
        return torch.utils.data.DataLoader(Stream(), batch_size=8)


def test_the_scale_is_updated_for_a_step_taken_after_the_last_batch_of_a_stream(tmp_path,
                                                                                make_trainer):
    trainer = make_trainer(precision="16-mixed", max_epochs=1, accumulate_grad_batches=2,
                           plugin_options=FITTING_SCALE, limit_val_batches=0)
    trainer.fit(StreamRegressor(with_val=False))
    assert trainer.global_step == 3  # batches 2 and 4 complete a window; batch 5 alone
    assert trainer.plugins["16-mixed"].scaler.state_dict()["_growth_tracker"] == 3
    saved = torch.load(trainer.last_checkpoint_path, weights_only=True)
    assert saved["plugins"]["16-mixed"]["_growth_tracker"] == 3  # the epoch-end checkpoint
