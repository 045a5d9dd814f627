"""The loop's event hooks: ``on_loop_start``/``on_loop_end``, ``on_batch_start``,
``on_before_backward``/``on_after_backward``, ``on_before_zero_grad`` and ``on_epoch_metrics``:
where each fires, in what order, and that a run without them pays nothing per step."""

from __future__ import annotations

import re

import pytest
import torch

import ptrain
from conftest import TinyRegressor
from ptrain.hook_calls import OPTIONAL_STEP_HOOKS, StepHooks
from ptrain.loading import create_plugin_manager, register

QUIET = ["no:progress-bar", "no:tensorboard", "no:checkpoint", "no:model-summary"]


class EventRecorder:
    """Records the events of the loop as compact names ("loop_start:fit", "batch_start:train")."""

    name = "event-recorder"

    def __init__(self):
        self.events: list[str] = []
        self.zeroed_grads_present: list[bool] = []

    @ptrain.hookimpl
    def on_loop_start(self, trainer, loop):
        self.events.append(f"loop_start:{loop}{'*' if trainer.sanity_checking else ''}")

    @ptrain.hookimpl
    def on_loop_end(self, trainer, loop):
        self.events.append(f"loop_end:{loop}{'*' if trainer.sanity_checking else ''}")

    @ptrain.hookimpl
    def on_batch_start(self, trainer, stage, batch, batch_idx):
        assert batch[0].device == trainer.device
        self.events.append(f"batch_start:{stage}:{batch_idx}")

    @ptrain.hookimpl
    def on_before_backward(self, loss):
        assert loss.requires_grad
        self.events.append("before_backward")

    @ptrain.hookimpl
    def on_after_backward(self, trainer):
        assert all(p.grad is not None for p in trainer.module.parameters())
        self.events.append("after_backward")

    @ptrain.hookimpl
    def on_before_optimizer_step(self):
        self.events.append("before_optimizer_step")

    @ptrain.hookimpl
    def on_before_zero_grad(self, trainer, optimizer):
        assert optimizer is trainer.optimizers[0]
        self.zeroed_grads_present.append(all(p.grad is not None
                                             for p in trainer.module.parameters()))
        self.events.append("before_zero_grad")

    @ptrain.hookimpl
    def on_train_step_end(self, batch_idx):
        self.events.append(f"train_step_end:{batch_idx}")

    @ptrain.hookimpl
    def on_train_batch_end(self, batch_idx):
        self.events.append(f"train_batch_end:{batch_idx}")

    @ptrain.hookimpl
    def on_evaluation_batch_end(self, trainer, stage, batch_idx):
        self.events.append(f"eval_batch_end:{stage}:{batch_idx}"
                           f"{'*' if trainer.sanity_checking else ''}")

    @ptrain.hookimpl
    def on_epoch_metrics(self, trainer, stage):
        if stage != "predict":  # nothing is logged in predict
            trainer.module.log(f"{stage}_marker", 1.0, on_step=False, on_epoch=True)
        self.events.append(f"epoch_metrics:{stage}")

    @ptrain.hookimpl
    def on_epoch_end(self):
        self.events.append("epoch_end")

    @ptrain.hookimpl
    def on_validation_end(self):
        self.events.append("validation_end")


def _trainer(tmp_path, recorder, **options):
    return ptrain.Trainer(accelerator="cpu", default_root_dir=str(tmp_path), seed=0,
                          callbacks=[*QUIET, recorder], **options)


def test_fit_fires_the_events_in_the_documented_order(tmp_path):
    recorder = EventRecorder()
    _trainer(tmp_path, recorder, max_epochs=1, limit_train_batches=2, limit_val_batches=1,
             num_sanity_val_steps=1).fit(TinyRegressor())
    step = ["before_backward", "after_backward", "before_optimizer_step", "before_zero_grad"]
    assert recorder.events == [
        "loop_start:fit",
        "loop_start:sanity_check*", "loop_start:validate*", "batch_start:validate:0",
        "eval_batch_end:validate:0*", "epoch_metrics:validate", "loop_end:validate*",
        "loop_end:sanity_check*",
        "loop_start:train",
        "batch_start:train:0", *step, "train_step_end:0", "train_batch_end:0",
        "batch_start:train:1", *step, "train_step_end:1",
        "loop_start:validate", "batch_start:validate:0", "eval_batch_end:validate:0",
        "epoch_metrics:validate", "validation_end", "loop_end:validate",
        "train_batch_end:1",
        "epoch_metrics:train", "epoch_end",
        "loop_end:train", "loop_end:fit",
    ]
    # gradients are cleared right after the step, so they still exist when it fires
    assert recorder.zeroed_grads_present == [True, True]


def test_values_logged_in_on_epoch_metrics_are_published_with_the_epoch(tmp_path):
    recorder = EventRecorder()
    trainer = _trainer(tmp_path, recorder, max_epochs=1, limit_train_batches=2)
    trainer.fit(TinyRegressor())
    assert float(trainer.callback_metrics["train_marker"]) == 1.0
    assert float(trainer.callback_metrics["validate_marker"]) == 1.0
    # the sanity check's is discarded with the rest of its metrics, not averaged in
    assert "sanity" not in "".join(trainer.callback_metrics)


def test_accumulation_fires_backward_events_per_batch_and_zero_grad_per_step(tmp_path):
    recorder = EventRecorder()
    _trainer(tmp_path, recorder, max_epochs=1, limit_train_batches=4, limit_val_batches=0,
             accumulate_grad_batches=2).fit(TinyRegressor())
    events = recorder.events
    assert events.count("before_backward") == events.count("after_backward") == 4
    assert events.count("before_optimizer_step") == events.count("before_zero_grad") == 2


def test_test_and_predict_loops(tmp_path):
    from tests._stage_models import StagedRegressor

    recorder = EventRecorder()
    trainer = _trainer(tmp_path, recorder, limit_test_batches=1, limit_predict_batches=1)
    trainer.test(StagedRegressor())
    trainer.predict(StagedRegressor())
    assert recorder.events == [
        "loop_start:test", "batch_start:test:0", "eval_batch_end:test:0", "epoch_metrics:test",
        "loop_end:test",
        "loop_start:predict", "batch_start:predict:0", "eval_batch_end:predict:0",
        "epoch_metrics:predict", "loop_end:predict",
    ]


def test_manual_backward_fires_the_backward_events(tmp_path):
    from ptrain.testing.models import TinyManualModule

    recorder = EventRecorder()
    _trainer(tmp_path, recorder, max_epochs=1, limit_train_batches=2,
             limit_val_batches=0).fit(TinyManualModule())
    assert recorder.events.count("before_backward") == 2
    assert recorder.events.count("after_backward") == 2


def test_a_run_without_the_optional_step_hooks_does_not_call_them():
    pm = create_plugin_manager()
    from ptrain.builtins.loop_defaults import LoopDefaults

    register(pm, LoopDefaults(), "loop-defaults")
    hooks = StepHooks(pm)
    assert not any(getattr(hooks, f"has_{name}") for name in OPTIONAL_STEP_HOOKS)
    register(pm, EventRecorder(), "event-recorder")
    assert all(getattr(StepHooks(pm), f"has_{name}") for name in OPTIONAL_STEP_HOOKS)


def test_loss_given_to_on_before_backward_is_the_one_backpropagated(tmp_path):
    seen = []

    class Keep:
        name = "keep"

        @ptrain.hookimpl
        def on_before_backward(self, loss):
            seen.append(loss.detach().clone())

    trainer = ptrain.Trainer(accelerator="cpu", default_root_dir=str(tmp_path), seed=0,
                             callbacks=[*QUIET, Keep()], max_epochs=1, limit_train_batches=2,
                             limit_val_batches=0, accumulate_grad_batches=2)
    module = TinyRegressor()
    losses = []
    original = module.training_step

    def training_step(batch, batch_idx):
        loss = original(batch, batch_idx)
        losses.append(loss.detach().clone())
        return loss

    module.training_step = training_step
    trainer.fit(module)
    torch.testing.assert_close(torch.stack(seen), torch.stack(losses) / 2)


class IdleAtBatchEnd:
    """Counts the training batches it sees; says it has nothing to do at a batch's end when
    ``idle`` (and names ``answer`` instead, when given)."""

    def __init__(self, idle: bool, answer=None):
        self.idle, self.answer, self.batches = idle, answer, 0
        self.name = "idle" if idle else "busy"

    @ptrain.hookimpl
    def unused_step_hooks(self):
        if self.answer is not None:
            return self.answer
        return ["on_train_batch_end"] if self.idle else None

    @ptrain.hookimpl
    def on_train_batch_end(self):
        self.batches += 1


def test_a_per_step_hook_named_unused_is_not_called_and_the_others_are(tmp_path):
    idle, busy = IdleAtBatchEnd(idle=True), IdleAtBatchEnd(idle=False)
    recorder = EventRecorder()
    ptrain.Trainer(accelerator="cpu", default_root_dir=str(tmp_path), max_epochs=1,
                   limit_train_batches=3, limit_val_batches=0,
                   callbacks=[*QUIET, recorder, idle, busy]).fit(TinyRegressor())
    assert (idle.batches, busy.batches) == (0, 3)
    assert recorder.events.count("before_backward") == 3  # another plugin's hooks untouched


@pytest.mark.parametrize("answer, message", [
    (["on_train_batch_ends"], "'on_train_batch_ends', which is not a per-step hook"),
    (["on_before_backward"], "'on_before_backward', which is a per-step hook it does not "
                             "implement"),
    ("on_train_batch_end", "return a list of hook names"),
])
def test_an_unused_step_hooks_answer_naming_what_it_cannot_is_refused(tmp_path, answer, message):
    trainer = ptrain.Trainer(accelerator="cpu", default_root_dir=str(tmp_path), max_epochs=1,
                             limit_train_batches=1, limit_val_batches=0,
                             callbacks=[*QUIET, IdleAtBatchEnd(idle=True, answer=answer)])
    with pytest.raises(ptrain.PluginError, match=re.escape(message)):
        trainer.fit(TinyRegressor())


def test_the_checkpoint_callback_leaves_the_batch_end_uncalled_without_step_or_time_triggers(
        tmp_path):
    from ptrain.hook_calls import unused_step_hooks

    def unused(**options):
        trainer = ptrain.Trainer(accelerator="cpu", default_root_dir=str(tmp_path),
                                 plugin_options={"checkpoint": options})
        return unused_step_hooks(trainer.pm, trainer).get("on_train_batch_end", set())

    assert "checkpoint" in unused()
    assert "checkpoint" not in unused(every_n_train_steps=5)
    assert "checkpoint" not in unused(train_time_interval=60.0)
