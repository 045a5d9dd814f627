"""The loop's semantics, one at a time, each checked against an independent computation.

Where the outcome is a set of parameters, the reference is a hand-written torch loop over the same
data from the same initial weights; where it is a count or an order, the expectation is derived
from the loop documented in ``ptrain/hookspecs.py``. Plugins are real objects with
``@ptrain.hookimpl`` methods, given to ``Trainer(callbacks=[...])``.
"""

from __future__ import annotations

import copy
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

import ptrain
from conftest import TinyRegressor

QUIET = ["no:progress-bar", "no:tensorboard", "no:checkpoint"]


def fit(make_trainer, module, *plugins, **options):
    # these tests count validation batches; the sanity check before training has its own tests
    options.setdefault("num_sanity_val_steps", 0)
    trainer = make_trainer(callbacks=[*QUIET, *plugins], **options)
    trainer.fit(module)
    return trainer


def fresh(seed: int = 0, **kwargs) -> tuple[TinyRegressor, TinyRegressor]:
    """A module and an identical copy (same initial weights) for the hand-written loop."""
    torch.manual_seed(seed)
    module = TinyRegressor(**kwargs)
    return module, copy.deepcopy(module)


def hand_fit(model: TinyRegressor, epochs: int | None = None, *, k: int = 1,
             limit: int | None = None, clip: tuple[str, float] | None = None,
             scheduler: tuple[str, int, float] | None = None, max_steps: int | None = None,
             skip=lambda epoch, i: False) -> tuple[int, torch.optim.Optimizer]:
    """Plain torch: SGD over the module's (unshuffled) training set, the loss divided by ``k``, a
    step every ``k`` batches and at the end of the epoch, optional clipping and StepLR."""
    opt = torch.optim.SGD(model.parameters(), lr=model.lr)
    sched = None
    if scheduler is not None:
        interval, frequency, gamma = scheduler
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=gamma)
    loader = DataLoader(model.train_set, batch_size=model.batch_size)
    n = len(loader) if limit is None else min(len(loader), limit)
    model.train()
    steps, epoch = 0, 0
    while epochs is None or epoch < epochs:
        for i, (x, y) in enumerate(loader):
            if i >= n:
                break
            if skip(epoch, i):
                continue
            loss = nn.functional.mse_loss(model(x), y)
            (loss / k).backward()
            if (i + 1) % k == 0 or i + 1 == n:
                if clip is not None:
                    params = [p for p in model.parameters() if p.grad is not None]
                    if clip[0] == "norm":
                        torch.nn.utils.clip_grad_norm_(params, clip[1])
                    else:
                        torch.nn.utils.clip_grad_value_(params, clip[1])
                opt.step()
                opt.zero_grad(set_to_none=True)
                steps += 1
                if sched is not None and interval == "step" and steps % frequency == 0:
                    sched.step()
                if max_steps is not None and steps >= max_steps:
                    return steps, opt
        epoch += 1
        if sched is not None and interval == "epoch" and epoch % frequency == 0:
            sched.step()
    return steps, opt


def assert_same_params(a: nn.Module, b: nn.Module) -> None:
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), f"{name} differs: {pa} vs {pb}"


def params_differ(a: nn.Module, b: nn.Module) -> bool:
    return any(not torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters()))


# -------------------------------------------------------------------------------------------
# Recorder plugins


class Recorder:
    """Records where training and validation happen."""

    name = "recorder"

    def __init__(self):
        self.epochs_started: list[int] = []
        self.epochs_ended: list[int] = []
        self.validations: list[tuple[int, int, int]] = []  # (epoch, batch_idx, global_step)
        self.val_batches: list[int] = []  # validation batches seen per validation
        self.train_batches: list[tuple[int, int]] = []  # (epoch, batch_idx) per model_step
        self._val_count = 0

    @ptrain.hookimpl
    def on_epoch_start(self, trainer):
        self.epochs_started.append(trainer.current_epoch)

    @ptrain.hookimpl
    def model_step(self, trainer, stage, batch_idx):
        if stage == "validate":
            self._val_count += 1
        else:
            self.train_batches.append((trainer.current_epoch, batch_idx))

    @ptrain.hookimpl
    def on_validation_end(self, trainer):
        self.validations.append((trainer.current_epoch, trainer.batch_idx, trainer.global_step))
        self.val_batches.append(self._val_count)
        self._val_count = 0

    @ptrain.hookimpl
    def on_epoch_end(self, trainer):
        self.epochs_ended.append(trainer.current_epoch)


# -------------------------------------------------------------------------------------------
# Gradient accumulation, clipping, schedulers, zero_grad


@pytest.mark.parametrize("k", [2, 4])
def test_accumulation_matches_hand_loop(make_trainer, k):
    # 10 batches per epoch: k=4 leaves an incomplete last window (3 steps per epoch).
    module, reference = fresh(n=80, batch_size=8)
    trainer = fit(make_trainer, module, max_epochs=2, accumulate_grad_batches=k)
    hand_steps, _ = hand_fit(reference, 2, k=k)
    assert trainer.global_step == hand_steps == 2 * -(-10 // k)
    assert_same_params(module, reference)
    # the comparison can fail: accumulating is not the same as stepping every batch
    _, per_batch = fresh(n=80, batch_size=8)
    hand_fit(per_batch, 2, k=1)
    assert params_differ(module, per_batch)


def test_incomplete_last_window_still_steps(make_trainer):
    module, _ = fresh(n=80, batch_size=8)
    events = []

    class StepWatcher:
        @ptrain.hookimpl
        def optimizer_step(self, trainer):
            events.append(("step", trainer.current_epoch, trainer.batch_idx))

        @ptrain.hookimpl
        def on_train_batch_end(self, trainer, batch_idx):
            events.append(("batch_end", trainer.current_epoch, batch_idx, trainer.sync_gradients))

    trainer = fit(make_trainer, module, StepWatcher(), max_epochs=2, accumulate_grad_batches=4)
    steps = [e[1:] for e in events if e[0] == "step"]
    assert steps == [(0, 3), (0, 7), (0, 9), (1, 3), (1, 7), (1, 9)]
    assert trainer.global_step == 6
    # each step belongs to its batch: it comes before that batch's on_train_batch_end, which
    # sees sync_gradients=True (also for the short window at the end of the epoch)
    for i, event in enumerate(events):
        if event[0] == "step":
            assert events[i + 1] == ("batch_end", event[1], event[2], True)
    synced = [e[1:3] for e in events if e[0] == "batch_end" and e[3]]
    assert synced == steps


@pytest.mark.parametrize("algorithm,value,k", [("norm", 0.05, 1), ("value", 0.01, 1),
                                               ("norm", 0.05, 3)])
def test_gradient_clipping_matches_hand_loop(make_trainer, algorithm, value, k):
    module, reference = fresh(lr=0.05)
    fit(make_trainer, module, max_epochs=2, gradient_clip_val=value,
        gradient_clip_algorithm=algorithm, accumulate_grad_batches=k)
    hand_fit(reference, 2, k=k, clip=(algorithm, value))  # clipped once per window
    for pa, pb in zip(module.parameters(), reference.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-7)
    _, unclipped = fresh(lr=0.05)
    hand_fit(unclipped, 2, k=k)
    assert any(not torch.allclose(pa, pb, rtol=1e-4, atol=1e-5)
               for pa, pb in zip(module.parameters(), unclipped.parameters()))


class FrequencyScheduled(TinyRegressor):
    def __init__(self, interval: str, frequency: int, gamma: float, **kwargs):
        super().__init__(**kwargs)
        self.sched_args = (interval, frequency, gamma)

    def configure_optimizers(self):
        interval, frequency, gamma = self.sched_args
        opt = torch.optim.SGD(self.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=gamma)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": interval,
                                                   "frequency": frequency}}


@pytest.mark.parametrize("interval,frequency,k", [
    ("step", 1, 1), ("step", 3, 1), ("step", 1, 2), ("epoch", 1, 1), ("epoch", 2, 1)])
def test_lr_scheduler_intervals(make_trainer, interval, frequency, k):
    epochs, batches, lr, gamma = 3, 8, 0.1, 0.5
    torch.manual_seed(0)
    if frequency == 1:
        module = TinyRegressor(lr=lr, scheduler={"gamma": gamma, "interval": interval})
    else:
        module = FrequencyScheduled(interval, frequency, gamma, lr=lr)
    reference = copy.deepcopy(module)
    trainer = fit(make_trainer, module, max_epochs=epochs, accumulate_grad_batches=k)
    steps = epochs * batches // k
    scheduler_steps = (steps if interval == "step" else epochs) // frequency
    expected_lr = lr * gamma ** scheduler_steps
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(expected_lr, rel=1e-12)
    assert trainer.lr_schedulers[0]["scheduler"].get_last_lr()[0] == pytest.approx(expected_lr)
    _, hand_opt = hand_fit(reference, epochs, k=k, scheduler=(interval, frequency, gamma))
    assert hand_opt.param_groups[0]["lr"] == pytest.approx(expected_lr, rel=1e-12)
    assert_same_params(module, reference)


class GradProbe:
    """Reads every parameter's ``.grad`` at the end of each training batch."""

    def __init__(self):
        self.seen: list[tuple[int, bool, bool]] = []  # (batch_idx, synced, all grads None)

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer, batch_idx):
        grads_none = all(p.grad is None for p in trainer.module.parameters())
        self.seen.append((batch_idx, trainer.sync_gradients, grads_none))


@pytest.mark.parametrize("k", [1, 2])
def test_grads_are_none_after_each_optimizer_step(make_trainer, k):
    probe = GradProbe()
    torch.manual_seed(0)
    fit(make_trainer, TinyRegressor(n=32), probe, max_epochs=1, accumulate_grad_batches=k)
    assert [b for b, _, _ in probe.seen] == [0, 1, 2, 3]
    for batch_idx, synced, grads_none in probe.seen:
        stepped = (batch_idx + 1) % k == 0
        assert synced == stepped
        # after a step the gradients are freed (set_to_none=True), mid-window they accumulate
        assert grads_none == stepped, (batch_idx, grads_none)


# -------------------------------------------------------------------------------------------
# Validation: frequency, mode, limits


@pytest.mark.parametrize("options,epochs,expected", [
    # 8 batches per epoch; expected (epoch, batch_idx) of each validation
    ({"val_check_interval": 0.25}, 1, [(0, 1), (0, 3), (0, 5), (0, 7)]),
    ({"val_check_interval": 4}, 2, [(0, 3), (0, 7), (1, 3), (1, 7)]),
    ({"val_check_interval": 1.0}, 2, [(0, 7), (1, 7)]),
    ({"check_val_every_n_epoch": 2}, 4, [(1, 7), (3, 7)]),
    ({"check_val_every_n_epoch": 2, "val_check_interval": 0.5}, 2, [(1, 3), (1, 7)]),
])
def test_validation_frequency(make_trainer, options, epochs, expected):
    recorder = Recorder()
    torch.manual_seed(0)
    trainer = fit(make_trainer, TinyRegressor(), recorder, max_epochs=epochs, **options)
    assert [(e, b) for e, b, _ in recorder.validations] == expected
    # each validation ran over the whole validation set (16 samples, batches of 8), after the
    # optimizer step of the batch that triggered it
    assert recorder.val_batches == [2] * len(expected)
    assert [s for _, _, s in recorder.validations] == [8 * e + b + 1 for e, b in expected]
    assert trainer.global_step == 8 * epochs


class Stream(IterableDataset):
    """A finite stream without ``__len__``: the loop learns the epoch's end when it runs dry."""

    def __init__(self, data):
        self.data = data

    def __iter__(self):
        return iter(self.data)


class StreamRegressor(TinyRegressor):
    def train_dataloader(self):
        return DataLoader(Stream(self.train_set), batch_size=self.batch_size)


def test_accumulation_over_a_stream_steps_at_its_end(make_trainer):
    recorder = Recorder()
    torch.manual_seed(0)
    module = StreamRegressor()
    reference = copy.deepcopy(module)
    trainer = fit(make_trainer, module, recorder, max_epochs=2, accumulate_grad_batches=3,
                  limit_val_batches=0)
    hand_fit(reference, 2, k=3)  # 8 batches: windows of 3, 3 and 2
    assert trainer.global_step == 6
    assert recorder.epochs_ended == [0, 1]
    assert_same_params(module, reference)


class BatchEnds:
    """At each on_train_batch_end: (batch_idx, trainer.is_last_batch, global_step, the
    validations run so far)."""

    name = "batch-ends"

    def __init__(self, recorder: Recorder):
        self.recorder, self.seen = recorder, []

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer, batch_idx):
        self.seen.append((batch_idx, trainer.is_last_batch, trainer.global_step,
                          len(self.recorder.validations)))


@pytest.mark.parametrize("loader", ["sized", "stream"])
def test_a_streams_last_batch_is_known_while_it_runs_as_a_sized_loaders_is(make_trainer,
                                                                          loader):
    """Read one batch ahead, a stream's last batch (the 8th: a window of 3, 3 and 2) takes its
    optimizer step and is followed by the epoch's validation before its on_train_batch_end,
    as the last batch of a loader with a length is."""
    recorder = Recorder()
    ends = BatchEnds(recorder)
    torch.manual_seed(0)
    module = StreamRegressor() if loader == "stream" else TinyRegressor()
    fit(make_trainer, module, recorder, ends, max_epochs=1, accumulate_grad_batches=3)
    assert ends.seen == [(0, False, 0, 0), (1, False, 0, 0), (2, False, 1, 0),
                         (3, False, 1, 0), (4, False, 1, 0), (5, False, 2, 0),
                         (6, False, 2, 0), (7, True, 3, 1)]


def test_validation_at_the_end_of_an_epoch_of_a_stream(make_trainer):
    recorder = Recorder()
    torch.manual_seed(0)
    trainer = fit(make_trainer, StreamRegressor(), recorder, max_epochs=2)
    assert trainer.global_step == 16
    assert [(e, s) for e, _, s in recorder.validations] == [(0, 8), (1, 16)]
    assert "val_loss" in trainer.callback_metrics


def test_val_check_interval_longer_than_an_epoch_is_a_config_error(make_trainer):
    torch.manual_seed(0)
    with pytest.raises(ptrain.ConfigError, match="val_check_interval"):
        fit(make_trainer, TinyRegressor(), max_epochs=1, val_check_interval=9)


@pytest.mark.parametrize("limit,expected_batches", [(0, None), (1, 1), (0.5, 2), (3, 3)])
def test_limit_val_batches(make_trainer, limit, expected_batches):
    recorder = Recorder()
    torch.manual_seed(0)
    fit(make_trainer, TinyRegressor(val_n=40), recorder, max_epochs=2, limit_val_batches=limit)
    # val set: 40 samples in batches of 8 -> 5 batches
    if expected_batches is None:
        assert recorder.validations == [] and recorder.val_batches == []
    else:
        assert recorder.val_batches == [expected_batches] * 2


class CountsFetches(TinyRegressor):
    """Counts the items each stage's loader fetched (its dataset's ``__getitem__`` calls)."""

    def __init__(self):
        super().__init__(n=64, val_n=40)
        self.fetched = {}

    def _counted(self, dataset, stage):
        fetched = self.fetched

        class Counted(torch.utils.data.Dataset):
            def __len__(self):
                return len(dataset)

            def __getitem__(self, index):
                fetched[stage] = fetched.get(stage, 0) + 1
                return dataset[index]

        return DataLoader(Counted(), batch_size=self.batch_size)

    def train_dataloader(self):
        return self._counted(self.train_set, "train")

    def val_dataloader(self):
        return self._counted(self.val_set, "validate")

    def test_dataloader(self):
        return self._counted(self.val_set, "test")

    def predict_dataloader(self):
        return self._counted(self.val_set, "predict")

    def test_step(self, batch, batch_idx):
        self.validation_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx):
        return self(batch[0])


def test_a_limit_fetches_no_batch_past_it(make_trainer):
    """A batch fetched past a limit and dropped would load data and draw random numbers (a
    transform's crops) for nothing, changing every draw after it."""
    module = CountsFetches()
    trainer = make_trainer(callbacks=QUIET, max_epochs=2, limit_train_batches=3,
                           limit_val_batches=2, limit_test_batches=2, limit_predict_batches=1,
                           num_sanity_val_steps=1)
    trainer.fit(module)
    trainer.test(module)
    trainer.predict(module)
    batch = module.batch_size
    # two epochs of 3 training batches; the sanity check's one and two passes of 2 validation
    assert module.fetched == {"train": 2 * 3 * batch, "validate": (1 + 2 * 2) * batch,
                              "test": 2 * batch, "predict": 1 * batch}


@pytest.mark.parametrize("limit,batches", [(3, 3), (0.5, 4), (0.3, 2)])
def test_limit_train_batches(make_trainer, limit, batches):
    recorder = Recorder()
    module, reference = fresh()
    trainer = fit(make_trainer, module, recorder, max_epochs=2, limit_train_batches=limit)
    assert recorder.train_batches == [(e, i) for e in range(2) for i in range(batches)]
    assert trainer.global_step == 2 * batches
    # validation still runs at the end of each (shortened) epoch
    assert [(e, b) for e, b, _ in recorder.validations] == [(0, batches - 1), (1, batches - 1)]
    hand_fit(reference, 2, limit=batches)
    assert_same_params(module, reference)


class ModeProbe(TinyRegressor):
    """Records the train/eval mode and grad mode its steps see. The user puts ``aux`` in eval
    mode during the first training step and expects it to stay there."""

    def __init__(self):
        super().__init__(n=32)
        self.aux = nn.BatchNorm1d(4)  # a submodule the user keeps in eval mode (not in forward)
        self.train_seen, self.val_seen = [], []

    def modes(self):
        return (self.training, self.net.training, self.net[0].training, self.aux.training,
                torch.is_grad_enabled())

    def training_step(self, batch, batch_idx):
        self.train_seen.append(self.modes())
        if self.trainer.current_epoch == 0 and batch_idx == 0:
            self.aux.eval()
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.val_seen.append(self.modes() + (self.trainer.model.training,))
        return super().validation_step(batch, batch_idx)


def test_validation_runs_in_eval_mode_without_grad_and_restores_modes(make_trainer):
    after_validation = []

    class AfterValidation:
        @ptrain.hookimpl
        def on_validation_end(self, trainer):
            m = trainer.module
            after_validation.append((trainer.model.training, m.training, m.net.training,
                                     m.aux.training))

    torch.manual_seed(0)
    module = ModeProbe()
    fit(make_trainer, module, AfterValidation(), max_epochs=2, val_check_interval=0.5)
    assert len(module.val_seen) == 2 * 2 * 2  # 2 epochs x 2 validations x 2 batches
    assert all(seen == (False,) * 6 for seen in module.val_seen), module.val_seen
    # training: everything in train mode and under autograd, except what the user put in eval
    assert module.train_seen[0] == (True, True, True, True, True)
    assert all(seen == (True, True, True, False, True) for seen in module.train_seen[1:]), \
        module.train_seen
    assert after_validation == [(True, True, True, False)] * 4


# -------------------------------------------------------------------------------------------
# Stopping: max/min epochs and steps, max_time


class StopAtEpochEnd:
    def __init__(self, epoch: int = 0):
        self.epoch = epoch

    @ptrain.hookimpl
    def on_epoch_end(self, trainer):
        if trainer.current_epoch == self.epoch:
            trainer.should_stop = True


def test_max_epochs(make_trainer):
    recorder = Recorder()
    module, reference = fresh()
    trainer = fit(make_trainer, module, recorder, max_epochs=3)
    assert recorder.epochs_started == recorder.epochs_ended == [0, 1, 2]
    assert trainer.current_epoch == 3 and trainer.global_step == 24  # epochs run
    hand_fit(reference, 3)
    assert_same_params(module, reference)


def test_max_steps_stops_mid_epoch(make_trainer):
    recorder = Recorder()
    module, reference = fresh()
    trainer = fit(make_trainer, module, recorder, max_steps=13)
    assert trainer.global_step == 13
    assert recorder.train_batches == [(0, i) for i in range(8)] + [(1, i) for i in range(5)]
    assert recorder.epochs_started == [0, 1]
    hand_fit(reference, max_steps=13)
    assert_same_params(module, reference)


def test_max_steps_with_accumulation_counts_optimizer_steps(make_trainer):
    recorder = Recorder()
    module, reference = fresh()
    trainer = fit(make_trainer, module, recorder, max_steps=3, accumulate_grad_batches=2)
    assert trainer.global_step == 3
    assert recorder.train_batches == [(0, i) for i in range(6)]
    hand_fit(reference, k=2, max_steps=3)
    assert_same_params(module, reference)


def test_should_stop_in_on_epoch_end_stops_after_that_epoch(make_trainer):
    recorder = Recorder()
    torch.manual_seed(0)
    trainer = fit(make_trainer, TinyRegressor(), recorder, StopAtEpochEnd(0), max_epochs=10)
    assert recorder.epochs_started == [0] and trainer.global_step == 8


def test_min_epochs_defers_a_stop(make_trainer):
    recorder = Recorder()
    torch.manual_seed(0)
    trainer = fit(make_trainer, TinyRegressor(), recorder, StopAtEpochEnd(0), max_epochs=10,
                  min_epochs=3)
    assert recorder.epochs_started == [0, 1, 2]
    assert trainer.global_step == 24


class StopAtEveryValidation:
    @ptrain.hookimpl
    def on_validation_end(self, trainer):
        trainer.should_stop = True


def test_min_epochs_counts_whole_epochs(make_trainer):
    recorder = Recorder()
    torch.manual_seed(0)
    # a stop is asked for at every validation, twice per epoch; min_epochs=2 means two whole
    # epochs: not the mid-epoch validation of the second one
    trainer = fit(make_trainer, TinyRegressor(), recorder, StopAtEveryValidation(),
                  max_epochs=10, min_epochs=2, val_check_interval=0.5)
    assert recorder.epochs_started == [0, 1]
    assert trainer.global_step == 16
    # without min_epochs the first validation stops the run, mid-epoch
    recorder = Recorder()
    trainer = fit(make_trainer, TinyRegressor(), recorder, StopAtEveryValidation(),
                  max_epochs=10, val_check_interval=0.5)
    assert recorder.epochs_started == [0] and trainer.global_step == 4


def test_min_steps_defers_a_stop_until_a_check_point(make_trainer):
    torch.manual_seed(0)
    # a check point after every step: the stop takes effect as soon as min_steps is reached
    trainer = fit(make_trainer, TinyRegressor(), StopAtEpochEnd(0), max_epochs=10, min_steps=20,
                  log_every_n_steps=1)
    assert trainer.global_step == 20
    # check points only at epoch ends: the stop waits for the first one past min_steps
    torch.manual_seed(0)
    trainer = fit(make_trainer, TinyRegressor(with_val=False), StopAtEpochEnd(0), max_epochs=10,
                  min_steps=20)
    assert trainer.global_step == 24


class Sleeper:
    def __init__(self, seconds: float):
        self.seconds = seconds

    @ptrain.hookimpl
    def on_train_batch_end(self):
        time.sleep(self.seconds)


def test_max_time_stops_at_a_check_point(make_trainer):
    torch.manual_seed(0)
    # check points after every step: stops in the first epoch, soon after max_time
    start = time.monotonic()
    trainer = fit(make_trainer, TinyRegressor(with_val=False), Sleeper(0.2), max_epochs=100,
                  max_time=0.7, log_every_n_steps=1)
    took = time.monotonic() - start
    assert 1 <= trainer.global_step <= 5, trainer.global_step  # 0.7 s / 0.2 s per batch, + 1
    assert trainer.current_epoch == 1  # the one epoch begun
    assert took < 0.7 + 10.0  # not the 160 s of 100 epochs

    # check points only at the end of each epoch: the stop waits for the first one
    torch.manual_seed(0)
    trainer = fit(make_trainer, TinyRegressor(with_val=False), Sleeper(0.05), max_epochs=100,
                  max_time=0.1)
    assert trainer.global_step == 8 and trainer.current_epoch == 1


class SlowSanityCheck(TinyRegressor):
    """Its sanity check lasts until ``seconds`` have passed since the fit began."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def on_fit_start(self):
        self.fit_started = time.monotonic()

    def validation_step(self, batch, batch_idx):
        while self.trainer.sanity_checking and \
                time.monotonic() - self.fit_started < self.seconds:
            time.sleep(0.01)
        super().validation_step(batch, batch_idx)


class TrainingClock:
    """When the training loop started and ended (the set-up and sanity check come before)."""

    @ptrain.hookimpl
    def on_loop_start(self, loop):
        if loop == "train":
            self.started = time.monotonic()

    @ptrain.hookimpl
    def on_loop_end(self, loop):
        if loop == "train":
            self.ended = time.monotonic()


def test_max_time_counts_training_from_after_the_sanity_check(make_trainer):
    """As Lightning's Timer (started at on_train_start): the set-up and the sanity check do not
    use up max_time. The sanity check here outlasts max_time; training still gets max_time
    (counted from the stage's start, the run stopped at the first check point after one
    step)."""
    limit = 0.5
    clock = TrainingClock()
    trainer = fit(make_trainer, SlowSanityCheck(seconds=2 * limit), clock, max_epochs=1000,
                  max_time=limit, log_every_n_steps=1, num_sanity_val_steps=1)
    # the stop comes at the first check point once max_time of training has passed; the
    # clock's start is read a moment after the loop's own, hence the margin
    assert clock.ended - clock.started >= limit / 2, (clock.ended - clock.started,
                                                      trainer.global_step)
    assert trainer.global_step > 1


# -------------------------------------------------------------------------------------------
# The order of hook calls


class HookRecorder:
    """Implements every loop hook plainly (firstresult ones return None so the defaults run)
    and records each call."""

    name = "hook-recorder"

    def __init__(self):
        self.calls: list[str] = []

    def _add(self, entry: str) -> None:
        self.calls.append(entry)

    @ptrain.hookimpl
    def launch(self, trainer, function):
        self._add("launch")

    @ptrain.hookimpl
    def setup_device(self, trainer):
        self._add("setup_device")

    @ptrain.hookimpl
    def precision_policy(self, trainer):
        self._add("precision_policy")

    @ptrain.hookimpl
    def wrap_model(self, trainer, model):
        self._add("wrap_model")

    @ptrain.hookimpl
    def wrap_optimizer(self, trainer, optimizer):
        self._add("wrap_optimizer")

    @ptrain.hookimpl
    def prepare_dataloader(self, trainer, dataloader, stage):
        self._add(f"prepare_dataloader:{stage}")

    @ptrain.hookimpl
    def setup(self, trainer, stage):
        self._add(f"setup:{stage}")

    @ptrain.hookimpl
    def teardown(self, trainer, stage):
        self._add(f"teardown:{stage}")

    @ptrain.hookimpl
    def transfer_batch(self, trainer, batch):
        self._add("transfer_batch")

    @ptrain.hookimpl
    def model_step(self, trainer, stage, batch, batch_idx):
        self._add(f"model_step:{stage}:{batch_idx}")

    @ptrain.hookimpl
    def backward(self, trainer, loss):
        self._add("backward")

    @ptrain.hookimpl
    def on_before_optimizer_step(self, trainer, optimizer):
        self._add("on_before_optimizer_step")

    @ptrain.hookimpl
    def clip_gradients(self, trainer, optimizer):
        self._add("clip_gradients")

    @ptrain.hookimpl
    def optimizer_step(self, trainer, optimizer):
        self._add("optimizer_step")

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer, batch, batch_idx, loss):
        self._add(f"on_train_batch_end:{batch_idx}")

    @ptrain.hookimpl
    def on_epoch_start(self, trainer):
        self._add(f"on_epoch_start:{trainer.current_epoch}")

    @ptrain.hookimpl
    def on_epoch_end(self, trainer):
        self._add(f"on_epoch_end:{trainer.current_epoch}")

    @ptrain.hookimpl
    def on_validation_end(self, trainer):
        self._add("on_validation_end")

    @ptrain.hookimpl
    def reduce_metrics(self, trainer, metrics, op):
        self._add(f"reduce_metrics:{op}")

    @ptrain.hookimpl
    def log_metrics(self, trainer, metrics, step):
        self._add(f"log_metrics:{','.join(sorted(metrics))}@{step}")

    @ptrain.hookimpl
    def state_dict(self, trainer):
        self._add("state_dict")
        return {"calls": len(self.calls)}

    @ptrain.hookimpl
    def load_state_dict(self, trainer, state):
        self._add("load_state_dict")

    @ptrain.hookimpl
    def save_checkpoint(self, trainer, checkpoint, path):
        self._add("save_checkpoint")

    @ptrain.hookimpl
    def load_checkpoint(self, trainer, path):
        self._add("load_checkpoint")


class QuietRegressor(TinyRegressor):
    """Logs nothing in training, so the only publish points are the validations."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)


# without a sanity check (as here) the training loader is asked for first, as in Lightning
START = ["launch", "setup_device", "precision_policy", "wrap_model", "wrap_optimizer",
         "prepare_dataloader:train", "prepare_dataloader:validate", "setup:fit"]


def expected_fit(epochs: int, batches: int, clip: bool, publish_every_step: bool) -> list[str]:
    """The documented loop for ``epochs`` x ``batches``, accumulate 1, one validation (2 batches)
    at the end of each epoch; without the stop-agreement reductions (op="max")."""
    calls = list(START)
    step = 0
    for epoch in range(epochs):
        calls.append(f"on_epoch_start:{epoch}")
        for i in range(batches):
            step += 1
            calls += ["transfer_batch", f"model_step:train:{i}", "backward",
                      "on_before_optimizer_step", *(["clip_gradients"] if clip else []),
                      "optimizer_step"]
            if publish_every_step:
                calls += ["reduce_metrics:mean", f"log_metrics:train_loss@{step}"]
            if i == batches - 1:
                calls += ["transfer_batch", "model_step:validate:0",
                          "transfer_batch", "model_step:validate:1",
                          "reduce_metrics:mean", f"log_metrics:val_loss@{step}",
                          "on_validation_end"]
            calls.append(f"on_train_batch_end:{i}")
        calls.append(f"on_epoch_end:{epoch}")
    calls.append("teardown:fit")
    return calls


@pytest.mark.parametrize("clip", [False, True])
def test_hook_order_of_a_small_fit(make_trainer, clip):
    recorder = HookRecorder()
    torch.manual_seed(0)
    options = {"gradient_clip_val": 1.0} if clip else {}
    trainer = fit(make_trainer, QuietRegressor(n=16), recorder, max_epochs=2, **options)
    assert trainer.global_step == 4
    calls = [c for c in recorder.calls if c != "reduce_metrics:max"]
    assert calls == expected_fit(2, 2, clip=clip, publish_every_step=False)
    assert ("clip_gradients" in recorder.calls) == clip
    # the processes agree on stopping after on_epoch_end (where a plugin may set should_stop)
    for epoch in range(2):
        after = recorder.calls[recorder.calls.index(f"on_epoch_end:{epoch}") + 1:]
        assert after[0] == "reduce_metrics:max"


def test_hook_order_with_publishing_every_step(make_trainer):
    recorder = HookRecorder()
    torch.manual_seed(0)
    fit(make_trainer, TinyRegressor(n=16), recorder, max_epochs=2, log_every_n_steps=1)
    calls = [c for c in recorder.calls if c != "reduce_metrics:max"]
    assert calls == expected_fit(2, 2, clip=False, publish_every_step=True)


class FailsAtBatch(TinyRegressor):
    def training_step(self, batch, batch_idx):
        if self.trainer.current_epoch == 1 and batch_idx == 2:
            raise RuntimeError("boom")
        return super().training_step(batch, batch_idx)


def test_teardown_runs_after_an_error(make_trainer):
    seen = []

    class Teardown:
        @ptrain.hookimpl
        def teardown(self, trainer, stage):
            seen.append((stage, trainer.exception, trainer.global_step))

    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="boom") as info:
        fit(make_trainer, FailsAtBatch(), Teardown(), max_epochs=3)
    assert seen == [("fit", info.value, 10)]


# -------------------------------------------------------------------------------------------
# Manual optimization


class TwoParts(ptrain.TrainModule):
    """Two Linear parts, each with its own optimizer, stepped by hand."""

    automatic_optimization = False

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(3, 1)
        self.data = TinyRegressor(n=48).train_set

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt_a, opt_b = self.optimizers()
        loss = nn.functional.mse_loss(self(x), y)
        self.manual_backward(loss)
        opt_a.step()
        if batch_idx % 2 == 0:  # b learns on every other batch only
            opt_b.step()
            opt_b.zero_grad()
        opt_a.zero_grad()
        return loss

    def configure_optimizers(self):
        return [torch.optim.SGD(self.a.parameters(), lr=0.1),
                torch.optim.Adam(self.b.parameters(), lr=0.01)]

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=8)


@pytest.mark.parametrize("clip", [None, 0.1])
def test_manual_optimization_matches_hand_loop(make_trainer, clip):
    torch.manual_seed(0)
    module = TwoParts()
    reference = copy.deepcopy(module)
    options = {} if clip is None else {"gradient_clip_val": clip}
    trainer = fit(make_trainer, module, max_epochs=2, **options)
    # hand loop: the same steps, in plain torch; opt.step() of a manual module runs the
    # trainer's clipping of that optimizer's parameters first
    opt_a, opt_b = reference.configure_optimizers()

    def step(opt):
        if clip is not None:
            params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()

    for _ in range(2):
        for i, (x, y) in enumerate(DataLoader(reference.data, batch_size=8)):
            loss = nn.functional.mse_loss(reference(x), y)
            loss.backward()
            step(opt_a)
            if i % 2 == 0:
                step(opt_b)
                opt_b.zero_grad()
            opt_a.zero_grad()
    for pa, pb in zip(module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-7)
    # global_step counts every optimizer.step(): 6 batches x 2 epochs for a, half for b
    assert trainer.global_step == 12 + 6


class TwoOptimizersAutomatic(TwoParts):
    automatic_optimization = True

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)


def test_automatic_optimization_with_two_optimizers_is_a_model_error(make_trainer):
    torch.manual_seed(0)
    with pytest.raises(ptrain.ModelError, match="automatic_optimization"):
        fit(make_trainer, TwoOptimizersAutomatic(), max_epochs=1)


# -------------------------------------------------------------------------------------------
# Seeding


def test_seed_makes_shuffle_and_dropout_reproducible(make_trainer):
    torch.manual_seed(123)
    first = TinyRegressor(shuffle=True, dropout=0.5)
    second, other_seed = copy.deepcopy(first), copy.deepcopy(first)
    torch.manual_seed(1)  # the global state before fit differs between the runs ...
    fit(make_trainer, first, max_epochs=2, seed=0)
    torch.rand(100)
    fit(make_trainer, second, max_epochs=2, seed=0)  # ... the seed makes them equal
    fit(make_trainer, other_seed, max_epochs=2, seed=1)
    assert_same_params(first, second)
    assert params_differ(first, other_seed)


def test_seed_is_applied_once_when_the_trainer_is_made_and_the_cli_agrees(tmp_path):
    from tests.conftest import run_cli

    runs = tmp_path / "runs"
    torch.manual_seed(99)  # whatever the state before: the trainer's seed decides
    trainer = ptrain.Trainer(accelerator="cpu", seed=3, max_epochs=2, default_root_dir=str(runs),
                             callbacks=["no:progress-bar", "no:tensorboard"])
    module = TinyRegressor(shuffle=True, dropout=0.5)  # built after: seeded weights
    torch.manual_seed(3)
    assert_same_params(module, TinyRegressor(shuffle=True, dropout=0.5))
    trainer.fit(module)
    result = run_cli("fit", "--model", "tests.conftest:TinyRegressor", "--model.shuffle", "true",
                     "--model.dropout", "0.5", "--accelerator", "cpu", "--seed", "3",
                     "--max-epochs", "2", "--default-root-dir", str(tmp_path / "cli"),
                     "-p", "no:progress-bar", "-p", "no:tensorboard")
    assert result.returncode == 0, result.stderr
    saved = torch.load(tmp_path / "cli" / "version_0" / "checkpoints" / "last.ckpt",
                       weights_only=True)["model"]
    for name, value in module.state_dict().items():
        assert torch.equal(saved[name], value), name  # data order, dropout and init alike


# -------------------------------------------------------------------------------------------
# self.log


class LogProbe(TinyRegressor):
    def training_step(self, batch, batch_idx):
        x, _ = batch
        value = x[:, 0].mean() + 10 * self.trainer.current_epoch
        self.log("a", value)  # default in training: on_step only
        self.log("b", value, on_step=True, on_epoch=True)
        self.log("c", value, on_step=False, on_epoch=True)
        self.log("f", float(batch_idx))  # a Python number
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        x, _ = batch
        self.log("v", x.sum())  # default in validation: on_epoch only (mean over the run)
        self.log("w", x.sum(), on_step=True, on_epoch=True)
        return super().validation_step(batch, batch_idx)


def test_log_step_and_epoch_semantics(make_trainer):
    torch.manual_seed(0)
    module = LogProbe()
    trainer = fit(make_trainer, module, max_epochs=2)
    metrics = trainer.callback_metrics
    train_values = [float(x[:, 0].mean()) + 10 for x, _ in
                    DataLoader(module.train_set, batch_size=8)]  # epoch 1
    val_sums = [float(x.sum()) for x, _ in DataLoader(module.val_set, batch_size=8)]

    def close(name, expected):
        assert float(metrics[name]) == pytest.approx(expected, rel=1e-5, abs=1e-5), name

    # Lightning's names: a forked name is also in callback_metrics under its own name (the
    # epoch value once the epoch ended), and an evaluation pass keeps no NAME_step there
    assert {"a", "b", "b_step", "b_epoch", "c", "f", "v", "w", "w_epoch"} <= set(metrics)
    assert not {"a_step", "a_epoch", "c_step", "c_epoch", "v_step", "v_epoch", "w_step"} \
        & set(metrics)
    close("a", train_values[-1])
    close("b_step", train_values[-1])
    close("b_epoch", sum(train_values) / len(train_values))  # the mean of the last epoch only
    close("b", sum(train_values) / len(train_values))
    close("c", sum(train_values) / len(train_values))
    close("f", 7.0)
    close("v", sum(val_sums) / len(val_sums))
    close("w", sum(val_sums) / len(val_sums))
    close("w_epoch", sum(val_sums) / len(val_sums))
    # what the loggers received: the step and epoch names of forked metrics, never both forms
    logged = trainer.metrics.logged_metrics
    assert {"a", "b_step", "b_epoch", "c", "f", "v", "w_step", "w_epoch"} <= set(logged)
    assert not {"b", "w"} & set(logged)
    assert logged["w_step"] == pytest.approx(val_sums[-1], rel=1e-5)


# -------------------------------------------------------------------------------------------
# What training_step may return


class DictStep(TinyRegressor):
    def training_step(self, batch, batch_idx):
        return {"loss": super().training_step(batch, batch_idx), "extra": batch_idx}


def test_training_step_may_return_a_dict(make_trainer):
    torch.manual_seed(0)
    module = DictStep()
    reference = copy.deepcopy(module)
    trainer = fit(make_trainer, module, max_epochs=2)
    hand_fit(reference, 2)
    assert trainer.global_step == 16
    assert_same_params(module, reference)


class SkipOdd(TinyRegressor):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return None if batch_idx % 2 else loss


def test_training_step_returning_none_skips_the_batch(make_trainer):
    torch.manual_seed(0)
    module = SkipOdd()
    reference = copy.deepcopy(module)
    trainer = fit(make_trainer, module, max_epochs=2)
    hand_fit(reference, 2, skip=lambda epoch, i: i % 2 == 1)
    assert trainer.global_step == 8
    assert_same_params(module, reference)


def test_a_limit_that_keeps_no_training_batch_is_a_config_error(make_trainer):
    with pytest.raises(ptrain.ConfigError, match="no training batches"):
        make_trainer(max_epochs=1, limit_train_batches=0.1).fit(TinyRegressor(n=16, batch_size=8))


def test_fit_leaves_the_train_or_eval_mode_the_user_set(make_trainer):
    module = TinyRegressor(n=16, dropout=0.5)
    module.net[0].eval()  # e.g. a frozen part the user keeps in eval mode
    modes = []

    class ModeProbe:
        @ptrain.hookimpl
        def on_train_batch_end(self):
            modes.append((module.training, module.net[0].training))

    make_trainer(max_epochs=2, callbacks=["no:progress-bar", ModeProbe()]).fit(module)
    assert set(modes) == {(True, False)}
