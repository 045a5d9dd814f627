"""A value changed on resume that the restored state overrides is reported, never applied or
recorded silently (issue 21): a learning rate (the checkpoint's goes on, and the run's
checkpoints record the one given as not applied), the training batch size mid-epoch (the
epoch goes on after the samples already trained, not after as many batches of the new size),
the training data's length mid-epoch."""

from __future__ import annotations

import warnings

import pytest
import torch

from conftest import TinyRegressor
from ptrain import hookimpl
from ptrain.checkpoint_io import safe_load


class SampleRecorder(TinyRegressor):
    """Records which samples each epoch trained on, by their first feature."""

    def __init__(self, **kwargs):
        super().__init__(shuffle=True, with_val=False, **kwargs)
        self.trained: dict[int, list[float]] = {}

    def training_step(self, batch, batch_idx):
        self.trained.setdefault(self.current_epoch, []).extend(batch[0][:, 0].tolist())
        return super().training_step(batch, batch_idx)


def test_a_learning_rate_changed_on_resume_is_reported_and_recorded_as_not_applied(
        make_trainer):
    first = make_trainer(max_epochs=1)
    first.fit(TinyRegressor(lr=0.1))
    trainer = make_trainer(max_epochs=2)
    with pytest.warns(UserWarning, match=r"continues with the checkpoint's lr=0\.1 "
                                         r"\(configured now: 0\.5\)"):
        trainer.fit(TinyRegressor(lr=0.5), ckpt_path="last")
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1)
    saved = safe_load(trainer.last_checkpoint_path)
    assert saved["config"]["overridden_on_resume"] == {
        "optimizer 0 lr": {"configured": 0.5, "applied": pytest.approx(0.1)}}


def test_an_unchanged_resume_with_a_scheduler_reports_nothing(make_trainer, recwarn):
    scheduler = {"gamma": 0.5, "interval": "step"}
    make_trainer(max_epochs=1).fit(TinyRegressor(lr=0.1, scheduler=scheduler))
    trainer = make_trainer(max_epochs=2)
    trainer.fit(TinyRegressor(lr=0.1, scheduler=scheduler), ckpt_path="last")
    assert not [w for w in recwarn if "continues with the checkpoint's" in str(w.message)]
    assert "overridden_on_resume" not in safe_load(trainer.last_checkpoint_path)["config"]


class HalvesTheLearningRate:
    """Trains with half the configured learning rate; with ``says_so``, it tells a resume."""

    name = "halves-the-lr"

    def __init__(self, says_so: bool = True):
        self.says_so = says_so

    @hookimpl
    def setup(self, trainer, stage):
        if stage == "fit" and trainer.ckpt_path is None:  # a resumed optimizer has it halved
            for group in trainer.optimizers[0].param_groups:
                group["lr"] /= 2

    @hookimpl
    def applied_optimizer_settings(self, trainer, settings):
        if self.says_so:
            for group in settings[0]:
                group["lr"] /= 2


def test_a_setting_a_plugin_applies_is_what_a_resume_compares_with(make_trainer):
    """applied_optimizer_settings: a plugin that sets the learning rate itself says so, and an
    unchanged resume says nothing (the lr-finder's case); a plugin that does not say so leaves
    the configured value as the one compared."""

    def resume(plugin, epochs):
        trainer = make_trainer(max_epochs=epochs, callbacks=["no:progress-bar", plugin])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(TinyRegressor(lr=0.1), ckpt_path="last")
        assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05)
        return [str(w.message) for w in caught if "continues with the checkpoint's" in
                str(w.message)], safe_load(trainer.last_checkpoint_path)["config"]

    make_trainer(max_epochs=1, callbacks=["no:progress-bar", HalvesTheLearningRate()]).fit(
        TinyRegressor(lr=0.1))
    said, config = resume(HalvesTheLearningRate(), epochs=2)
    assert said == [] and "overridden_on_resume" not in config
    said, config = resume(HalvesTheLearningRate(says_so=False), epochs=3)
    assert len(said) == 1 and "lr=0.05 (configured now: 0.1)" in said[0], said
    assert config["overridden_on_resume"] == {
        "optimizer 0 lr": {"configured": 0.1, "applied": 0.05}}


def trained_in_epoch_0(make_trainer, first_batch_size, second_batch_size, n=64):
    """Epoch 0's samples trained by a run cut after 3 batches and by its resume."""
    torch.manual_seed(7)
    first = SampleRecorder(batch_size=first_batch_size, n=n)
    make_trainer(max_steps=3).fit(first)
    second = SampleRecorder(batch_size=second_batch_size, n=n)
    make_trainer(max_epochs=1).fit(second, ckpt_path="last")
    return first.trained[0], second.trained[0]


def test_a_batch_size_changed_mid_epoch_goes_on_after_the_samples_already_trained(
        make_trainer, tmp_path):
    torch.manual_seed(7)
    unbroken = SampleRecorder(batch_size=4)
    make_trainer(max_epochs=1, default_root_dir=str(tmp_path / "unbroken")).fit(unbroken)
    order = unbroken.trained[0]
    with pytest.warns(UserWarning) as said:
        before, after = trained_in_epoch_0(make_trainer, 4, 8)
    assert before == order[:12]
    assert after == order[8:]  # 12 samples trained: on after the first batch of 8, 4 again
    message = " ".join(str(w.message) for w in said)
    assert ("saved after batch 3 of epoch 0 with batches of 4 (12 samples)" in message
            and "after its first 1 batches of 8, training the 4 samples before that point "
                "again" in message), message


def test_a_batch_size_that_divides_what_was_trained_loses_and_repeats_nothing(make_trainer):
    with pytest.warns(UserWarning, match="at the same sample"):
        before, after = trained_in_epoch_0(make_trainer, 8, 4)
    assert not set(before) & set(after) and len(before) + len(after) == 64


def test_an_unchanged_mid_epoch_resume_says_nothing(make_trainer, recwarn):
    before, after = trained_in_epoch_0(make_trainer, 4, 4)
    assert not [w for w in recwarn if "resuming mid-epoch" in str(w.message)]
    assert not set(before) & set(after) and len(before) + len(after) == 64


def test_training_data_of_another_length_mid_epoch_is_reported(make_trainer):
    torch.manual_seed(7)
    make_trainer(max_steps=3).fit(SampleRecorder(batch_size=4))
    with pytest.warns(UserWarning, match=r"the training loader had 16 batches; it has 12 now"):
        make_trainer(max_epochs=1).fit(SampleRecorder(batch_size=4, n=48), ckpt_path="last")


class Counts:
    """A stateful callback: the optimizer steps it has seen, checkpointed."""

    name = "counts"

    def __init__(self):
        self.steps = 0

    @hookimpl
    def on_before_zero_grad(self):
        self.steps += 1

    @hookimpl
    def state_dict(self):
        return {"steps": self.steps}

    @hookimpl
    def load_state_dict(self, state):
        self.steps = state["steps"]


def test_a_plugins_state_left_behind_on_resume_is_reported(make_trainer, recwarn):
    """Resuming without a plugin whose state the checkpoint holds drops that state (the run's
    own checkpoints no longer hold it): said, where it was silent. With the plugin, nothing is
    said and its state comes back."""
    make_trainer(max_epochs=1, callbacks=["no:progress-bar", Counts()]).fit(TinyRegressor())
    trainer = make_trainer(max_epochs=2)
    with pytest.warns(UserWarning, match=r"holds the state of plugin\(s\) 'counts', which this "
                                         r"run does not have: it is not restored"):
        trainer.fit(TinyRegressor(), ckpt_path="last")
    assert "counts" not in safe_load(trainer.last_checkpoint_path)["plugins"]
    make_trainer(max_epochs=1, callbacks=["no:progress-bar", Counts()]).fit(TinyRegressor())
    recwarn.clear()
    counts = Counts()
    make_trainer(max_epochs=2, callbacks=["no:progress-bar", counts]).fit(
        TinyRegressor(), ckpt_path="last")
    assert not [w for w in recwarn if "holds the state of plugin" in str(w.message)]
    assert counts.steps == 16
