"""The ``lr-finder`` and ``batch-size-finder`` callbacks (distribution ``ptrain-finders``), on real
trainings: the bundled digits example, small regressors, a model whose activations grow with the
batch run in a subprocess whose address space is capped (a real allocation failure, nothing
simulated), and real 2-rank gloo process groups. Nothing of torch is replaced.

Torch runs on one thread here: this machine's two cores are shared with other jobs, and two
OpenMP threads that wait on each other made the tiny steps 10-100x slower; results do not
depend on it.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import ptrain
from ptrain.examples.digits import DigitsClassifier
from ptrain import ConfigError
from ptrain_finders import BatchSizeFinder, LRFinder, TrainingSnapshot
from ptrain_finders.lr_finder import smooth
from ptrain_finders.steps import StepRunner, cycle
from tests._campaigns import TWO_PROCESS_RUNS
from tests._cli_util import CLIRuns, assert_ok, assert_usage_error
from tests._finder_models import (BatchSizeRecorder, CapAddressSpace, FinderProbe, FlatLoss,
                                  GroupLRRecorder, ManualNoLoss, ManualRegressor,
                                  ManualScheduledRegressor, MemoryHungry, OwnGeneratorRegressor,
                                  SizeRecordingRegressor, StateProbe, TwoGroupRegressor,
                                  differences, read_probes, training_state)
from tests.conftest import REPO, TinyRegressor
from conftest import DIGITS_CONFIG

QUIET = ["no:progress-bar", "no:tensorboard", "no:checkpoint"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
#: digits: 1,797 images, 20% held out for validation
DIGITS_TRAIN = 1797 - int(1797 * 0.2)
#: what a collective may wait before a broken 2-rank job fails instead of hanging
SAFETY_TIMEOUT_S = 120.0


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def fit(make_trainer, module, *plugins, quiet=QUIET, **options):
    options.setdefault("max_epochs", 1)
    options.setdefault("seed", 0)
    trainer = make_trainer(callbacks=[*plugins, *quiet], **options)
    trainer.fit(module)
    return trainer


@pytest.fixture(scope="module")
def cli_runs(request, tmp_path_factory):
    """The module's CLI runs, started before its first test, two at a time."""
    pool = CLIRuns(request)
    root = pool.dirs["stop"] = tmp_path_factory.mktemp("cli-stop")
    pool.start("stop", "fit", "--config", DIGITS_CONFIG, "-p", "lr-finder",
               "--lr-finder-then", "stop", "--no-progress-bar", "-p", "no:tensorboard",
               "--default-root-dir", str(root), env=ONE_THREAD,
               used_by=("test_cli_then_stop_prints_the_suggestion_and_trains_nothing",))
    for key, args in CLI_USAGE_ERRORS.items():
        folder = pool.dirs[key] = tmp_path_factory.mktemp(key)
        pool.start(key, "fit", *args[0], "--max-epochs", "1", "--no-progress-bar",
                   "--default-root-dir", str(folder), env=ONE_THREAD,
                   used_by=("test_cli_usage_errors",))
    yield pool
    pool.close()


# -- lr-finder on the digits example ----------------------------------------------------------


def test_lr_finder_on_digits_suggests_an_lr_that_trains_as_well_as_the_configured_one(
        make_trainer, tmp_path, capsys):
    from matplotlib.image import imread

    epochs = 3
    configured = fit(make_trainer, DigitsClassifier(), max_epochs=epochs)
    configured_acc = float(configured.callback_metrics["val_acc"])
    finder, probe = LRFinder(), StateProbe()
    trainer = fit(make_trainer, DigitsClassifier(), finder, probe, max_epochs=epochs)
    acc = float(trainer.callback_metrics["val_acc"])

    # measured (seeds 0-5): 0.024-0.10, against the example's configured 0.003
    assert 1e-3 <= finder.suggestion <= 0.3, finder.suggestion
    # measured after 3 epochs (seeds 0-5): configured 0.933-0.955, suggested 0.952-0.982
    assert acc >= 0.92 and acc >= configured_acc - 0.03, (acc, configured_acc)
    # training started at the suggestion: the group's lr and the cosine schedule's base
    assert probe.after["opt0.outer.group0.lr"] == pytest.approx(finder.suggestion, rel=1e-12)
    assert probe.after["sched0.base_lrs"] == pytest.approx([finder.suggestion], rel=1e-12)
    assert probe.before["opt0.outer.group0.lr"] == finder.configured_lr == 0.003

    # the curve: the LRs rise geometrically from min_lr; the suggestion is the steepest fall of
    # the smoothed loss before its minimum
    lrs = np.array(finder.lrs)
    assert 20 <= len(lrs) <= 100 and lrs[0] == pytest.approx(1e-7)
    assert np.allclose(lrs[1:] / lrs[:-1], (1.0 / 1e-7) ** (1 / 99))
    assert finder.smoothed == pytest.approx(smooth(finder.losses, 0.9))
    skip = 10  # the moving average's time constant at smoothing 0.9
    lowest = skip + int(np.argmin(finder.smoothed[skip:]))
    at = finder.lrs.index(finder.suggestion)
    slopes = np.gradient(finder.smoothed[skip:lowest + 1], np.log10(lrs[skip:lowest + 1]))
    assert skip <= at < lowest and slopes[at - skip] == slopes.min() < 0

    run = trainer.log_dir
    data = json.loads((run / "lr_finder.json").read_text())
    assert data["suggestion"] == finder.suggestion and data["lrs"] == finder.lrs
    assert data["losses"] == finder.losses and data["smoothed"] == finder.smoothed
    image = imread(run / "lr_finder.png")
    assert image.shape[:2] == (450, 700) and image.shape[2] in (3, 4)
    assert image[..., :3].std() > 0.05  # drawn on, not a blank canvas
    out = capsys.readouterr().out
    assert (f"lr-finder: suggested lr {finder.suggestion:.3g}, configured lr 0.003; training "
            f"with the suggestion") in out
    assert f"plot: {run / 'lr_finder.png'}" in out


def test_lr_finder_puts_the_training_state_back_bit_for_bit(make_trainer):
    """Weights, AdamW state, param groups, the cosine schedule, the generators (dropout and
    shuffling draw from them), counters, metrics and the checkpoint plugin's state are as they
    were before the search when the first epoch starts; only the learning rates differ."""
    finder, probe = LRFinder(num_steps=40), StateProbe()
    trainer = fit(make_trainer, DigitsClassifier(), finder, probe, quiet=QUIET[:2],
                  max_steps=1)
    assert len(finder.lrs) == 40  # the search ran (and moved everything it then put back)
    assert differences(probe.before, probe.after, skip_lr=True) == []
    assert set(differences(probe.before, probe.after)) == {
        "opt0.outer.group0.lr", "opt0.outer.group0.initial_lr", "sched0.base_lrs",
        "sched0._last_lr"}
    assert trainer.global_step == 1


class SampleCount:
    """A metric object (what the core takes for a torchmetrics.Metric): the samples seen."""

    def __init__(self):
        self.total = torch.tensor(0.0)

    def update(self, batch_size: int) -> None:
        self.total = self.total + batch_size

    def __call__(self, batch_size: int) -> torch.Tensor:
        self.update(batch_size)
        return torch.tensor(float(batch_size))

    def compute(self) -> torch.Tensor:
        return self.total

    def reset(self) -> None:
        self.total = torch.tensor(0.0)


class CountsSamples(TinyRegressor):
    def __init__(self):
        super().__init__(n=64, batch_size=8)
        self.samples = SampleCount()

    def training_step(self, batch, batch_idx):
        self.samples(len(batch[0]))
        self.log("samples", self.samples, on_step=False, on_epoch=True)
        return super().training_step(batch, batch_idx)


def test_a_metric_object_the_search_logged_counts_the_first_epochs_batches_only(make_trainer):
    """The search's steps log into the module's metric object too; the first epoch's value is
    of its own 64 samples, not of the search's 12 batches as well."""
    trainer = fit(make_trainer, CountsSamples(), LRFinder(num_steps=12))
    assert float(trainer.callback_metrics["samples"]) == 64.0


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_snapshot_restores_what_real_steps_changed(make_trainer, precision):
    """A snapshot taken in ``setup``, then real steps at a learning rate that wrecks the model:
    everything moved (the test would see it), and ``restore`` puts it all back. Under 16-mixed
    the steps also run the precision plugin's per-batch scale update (else its second step
    would be refused as a second step in one batch), and the scaler's state comes back."""
    seen = {}

    class Wrecker:
        name = "wrecker"

        @ptrain.hookimpl
        def setup(self, trainer):
            before = training_state(trainer)
            snapshot = TrainingSnapshot(trainer)
            for group in trainer.optimizers[0].param_groups:
                group["lr"] = 50.0
            runner, source = StepRunner(trainer), cycle(trainer.train_dataloader)
            for _ in range(5):
                runner.step(source)
            source.close()
            seen["moved"] = differences(before, training_state(trainer))
            snapshot.restore()
            seen["left"] = differences(before, training_state(trainer))

    module = OwnGeneratorRegressor(optimizer="adam", dropout=0.2,
                                   scheduler={"gamma": 0.5, "interval": "epoch"})
    trainer = fit(make_trainer, module, Wrecker(), precision=precision)
    moved = set(seen["moved"])
    assert {"module.net.1.weight", "opt0.outer.state.0.exp_avg", "opt0.outer.group0.lr",
            "rng.torch", "rng.loader", "trainer.global_step", "metrics.step"} <= moved
    assert seen["left"] == []
    assert trainer.global_step == 8  # the epoch's own 8 steps; the 5 above were put back


def test_then_stop_trains_nothing_and_leaves_a_resumed_runs_checkpoint_alone(make_trainer,
                                                                             capsys):
    module = DigitsClassifier()
    first = fit(make_trainer, copy.deepcopy(module), quiet=QUIET[:2], max_epochs=1)
    checkpoint = first.last_checkpoint_path
    written = (checkpoint.read_bytes(), checkpoint.stat().st_mtime_ns)
    steps = first.global_step

    finder = LRFinder(then="stop")
    resumed = make_trainer(callbacks=[finder, *QUIET[:2]], max_epochs=3, seed=0)
    resumed.fit(copy.deepcopy(module), ckpt_path="last")
    assert resumed.log_dir == first.log_dir  # the resumed run's folder
    assert (checkpoint.read_bytes(), checkpoint.stat().st_mtime_ns) == written
    assert resumed.global_step == steps and resumed.max_epochs == 3
    assert (resumed.log_dir / "lr_finder.png").is_file()
    out = capsys.readouterr().out
    assert "lr-finder: suggested lr" in out and "training with" not in out

    fresh = copy.deepcopy(module)
    weights = {k: v.clone() for k, v in fresh.state_dict().items()}
    trainer = fit(make_trainer, fresh, LRFinder(then="stop"), quiet=QUIET[:2], max_epochs=3)
    assert trainer.global_step == 0 and not (trainer.log_dir / "checkpoints").exists()
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in weights.items())


def test_several_param_groups_are_swept_and_set_together_keeping_their_ratio(make_trainer,
                                                                            capsys):
    finder, recorder = LRFinder(num_steps=20, max_lr=1e-2), GroupLRRecorder()
    fit(make_trainer, TwoGroupRegressor(lr=0.05), finder, recorder)
    search, training = recorder.steps[:20], recorder.steps[20:]
    assert [lr0 for lr0, _ in search] == pytest.approx(finder.lrs, rel=1e-12)
    assert [lr1 / lr0 for lr0, lr1 in search] == pytest.approx([0.1] * 20, rel=1e-12)
    assert len(training) == 8
    assert training[0] == pytest.approx([finder.suggestion, finder.suggestion / 10], rel=1e-12)
    assert "(2 param groups, scaled together)" in capsys.readouterr().out


def test_a_loss_that_never_falls_gives_no_suggestion_and_keeps_the_lr(make_trainer, capsys):
    finder, probe = LRFinder(num_steps=30), StateProbe()
    fit(make_trainer, FlatLoss(lr=0.2), finder, probe)
    assert finder.suggestion is None and len(finder.lrs) == 30
    assert probe.after["opt0.outer.group0.lr"] == 0.2
    assert ("lr-finder: no suggestion: the smoothed loss did not go down (by 1% or more, after "
            "its first 10 points) in 30 steps") in capsys.readouterr().out


def test_a_diverging_loss_ends_the_test_early_and_leaves_no_trace(make_trainer):
    finder, probe = LRFinder(max_lr=1e4), StateProbe()
    trainer = fit(make_trainer, TinyRegressor(lr=0.1), finder, probe, max_epochs=2)
    assert finder.diverged and len(finder.lrs) < 100
    assert finder.suggestion < finder.lrs[-1]
    assert differences(probe.before, probe.after, skip_lr=True) == []
    assert trainer.global_step == 16  # the loop trained on (no NaN left in its loss window)
    assert all(torch.isfinite(p).all() for p in trainer.module.parameters())


@pytest.mark.parametrize("options, needle", [
    ({"min_lr": 1.0, "max_lr": 0.1}, "must be below max_lr"),
    ({"min_lr": 0.0}, "must be positive"),
    ({"num_steps": 1}, "num_steps=1 is too few; use at least 12"),
    ({"num_steps": 11}, "first 10 points (the moving average's time constant at smoothing 0.9)"),
    ({"num_steps": 2, "smoothing": 0.0}, "use at least 3"),
    ({"diverge_factor": 1.0}, "must be above 1"),
    ({"smoothing": 1.0}, "must be in [0, 1)"),
    ({"then": "later"}, "is not one of fit, stop"),
])
def test_lr_finder_refuses_bad_options(options, needle):
    with pytest.raises(ConfigError) as info:
        LRFinder(**options)
    assert needle in str(info.value)


def test_lr_finder_tests_a_manually_optimizing_module_as_an_automatic_one(make_trainer):
    """The same regression, stepped by the loop or by its own training_step, gives the same
    curve; a module that steps its own scheduler before its optimizer step (halving the rate
    each time) too: the run's schedulers are held during the test, then put back."""
    curves = {}
    for kind in (TinyRegressor, ManualRegressor, ManualScheduledRegressor):
        torch.manual_seed(0)
        module, finder = kind(), LRFinder(num_steps=30, then="stop")
        before = {k: v.clone() for k, v in module.state_dict().items()}
        trainer = fit(make_trainer, module, finder)
        curves[type(module).__name__] = (finder.lrs, finder.losses, finder.suggestion)
        assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert len(curves["TinyRegressor"][0]) == 30 and curves["TinyRegressor"][2] is not None
    assert curves["ManualRegressor"] == curves["TinyRegressor"]
    assert curves["ManualScheduledRegressor"] == curves["TinyRegressor"]
    scheduler = trainer.lr_schedulers[0]["scheduler"]
    assert "step" not in vars(scheduler) and scheduler.last_epoch == 0  # put back, unstepped

    module = ManualScheduledRegressor()  # then="fit": the run trains, its scheduler stepping
    finder = LRFinder(num_steps=20)
    trainer = fit(make_trainer, module, finder)
    assert finder.suggestion is not None and trainer.global_step == 8
    assert trainer.lr_schedulers[0]["scheduler"].last_epoch == 8


def test_lr_finder_refusals_under_manual_optimization(make_trainer):
    class TwoOptimizers(ManualRegressor):
        def configure_optimizers(self):
            return [torch.optim.SGD(self.net.parameters(), lr=0.1),
                    torch.optim.SGD(self.net.parameters(), lr=0.1)]

    with pytest.raises(ConfigError, match="optimizes manually with 2 optimizers") as info:
        fit(make_trainer, TwoOptimizers(), LRFinder())
    assert "needs one optimizer under manual optimization" in str(info.value)
    with pytest.raises(ConfigError, match="training_step returned no loss in 12 steps"):
        fit(make_trainer, ManualNoLoss(), LRFinder(num_steps=12))


def test_lr_finder_refuses_own_lr_schedulers(make_trainer):
    class OneCycle(TinyRegressor):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.01)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.
                                                       OneCycleLR(opt, 0.1, total_steps=100),
                                                       "interval": "step"}}

    with pytest.raises(ConfigError, match="OneCycleLR computes its learning rates"):
        fit(make_trainer, OneCycle(), LRFinder(num_steps=12))
    finder = LRFinder(num_steps=12, then="stop")  # a test alone is fine
    fit(make_trainer, OneCycle(), finder)
    assert len(finder.lrs) == 12


# -- batch-size-finder --------------------------------------------------------------------------


def test_batch_size_finder_on_digits_reaches_the_dataset_and_scales_the_lr(make_trainer,
                                                                          capsys):
    finder, recorder, probe = BatchSizeFinder(scale_lr="sqrt"), BatchSizeRecorder(), \
        StateProbe()
    module = DigitsClassifier()
    assert len(module.train_set) == DIGITS_TRAIN
    trainer = fit(make_trainer, module, finder, recorder, probe, max_epochs=2)
    assert [t["batch_size"] for t in finder.trials] == [32, 64, 128, 256, 512, 1024,
                                                        DIGITS_TRAIN]
    assert all(t["fits"] for t in finder.trials)
    assert finder.found == finder.batch_size == DIGITS_TRAIN
    assert recorder.sizes == [DIGITS_TRAIN, DIGITS_TRAIN]  # one batch per epoch
    factor = math.sqrt(DIGITS_TRAIN / 32)
    assert probe.after["opt0.outer.group0.lr"] == pytest.approx(0.003 * factor, rel=1e-12)
    assert differences(probe.before, probe.after, skip_lr=True) == []
    out = capsys.readouterr().out
    assert (f"largest batch size that fits: {DIGITS_TRAIN} (max_batch_size {DIGITS_TRAIN}: "
            f"larger sizes not tried)") in out
    assert "(AdamW is adaptive): sqrt rule: lr 0.003 x" in out and "applied the sqrt rule" in out
    data = json.loads((trainer.log_dir / "batch_size_finder.json").read_text())
    assert data["found"] == DIGITS_TRAIN and data["trials"] == finder.trials


def test_max_batch_size_init_and_margin(make_trainer):
    finder, recorder = BatchSizeFinder(max_batch_size=20, margin=0.5), BatchSizeRecorder()
    fit(make_trainer, TinyRegressor(n=64, batch_size=8), finder, recorder)
    assert [t["batch_size"] for t in finder.trials] == [8, 16, 20]
    assert (finder.found, finder.batch_size) == (20, 10)
    assert recorder.sizes == [10] * 6 + [4]

    finder = BatchSizeFinder(max_batch_size=1000, then="stop")  # capped by the 64 samples
    fit(make_trainer, TinyRegressor(n=64, batch_size=8), finder)
    assert [t["batch_size"] for t in finder.trials] == [8, 16, 32, 64]

    finder = BatchSizeFinder(init=3, max_batch_size=10, then="stop")
    trainer = fit(make_trainer, TinyRegressor(n=64, batch_size=8), finder)
    assert [t["batch_size"] for t in finder.trials] == [3, 6, 10]
    assert trainer.global_step == 0


def test_the_lr_finder_runs_after_the_batch_size_finder_at_the_found_size(make_trainer):
    """With accumulation over 2 batches: a trial step is one batch (a window's peak memory is
    its last batch's), an LR-test step is a whole window (the loss of one optimizer step)."""
    module = SizeRecordingRegressor(n=64, batch_size=8)
    lr_finder, recorder = LRFinder(num_steps=12, max_lr=1e-2), GroupLRRecorder()
    # listed in the "wrong" order: the batch-size search still comes first
    trainer = fit(make_trainer, module, lr_finder, BatchSizeFinder(max_batch_size=32), recorder,
                  accumulate_grad_batches=2)
    assert module.sizes == [8] * 3 + [16] * 3 + [32] * 3 + [32] * 24 + [32] * 2
    assert len(recorder.steps) == 3 * 3 + 12 + 1 and trainer.global_step == 1


def test_a_resumed_run_keeps_what_the_finders_found_without_searching_again(make_trainer,
                                                                            capsys):
    module = SizeRecordingRegressor(n=64, batch_size=8)
    first = fit(make_trainer, copy.deepcopy(module), LRFinder(num_steps=20, max_lr=1e-2),
                BatchSizeFinder(max_batch_size=16), quiet=QUIET[:2])
    capsys.readouterr()
    lr_finder, resumed_module = LRFinder(num_steps=20, max_lr=1e-2), copy.deepcopy(module)
    trainer = make_trainer(callbacks=[lr_finder, BatchSizeFinder(max_batch_size=16),
                                      *QUIET[:2]], max_epochs=2, seed=0)
    trainer.fit(resumed_module, ckpt_path="last")
    out = capsys.readouterr().out
    assert "batch-size-finder: resumed a run that trains with batch size 16; no new search." \
        in out
    suggestion = first.plugins["lr-finder"].suggestion
    assert (f"lr-finder: resumed a run that trains with the suggested lr {suggestion:.3g}; no "
            f"new search.") in out
    assert lr_finder.lrs == [] and resumed_module.sizes == [16] * 4
    assert trainer.optimizers[0].param_groups[0]["lr"] == suggestion
    assert trainer.global_step == first.global_step + 4


@pytest.mark.parametrize("first_finder", [False, True], ids=["first-without", "no-suggestion"])
def test_a_resume_from_a_checkpoint_without_a_suggestion_keeps_its_lr_and_does_not_search(
        make_trainer, tmp_path, capsys, first_finder):
    """A resume continues the run: with -p lr-finder and a checkpoint that holds no suggestion
    (its run had no lr-finder, or a search without a suggestion), the lr-finder searched on the
    restored weights and trained the rest of the run at another lr, saying only "suggested lr".
    It now trains exactly as the same resume without it, and says why in one line."""
    plugins = [LRFinder(num_steps=30)] if first_finder else []
    first = fit(make_trainer, (FlatLoss if first_finder else TinyRegressor)(lr=0.2), *plugins,
                quiet=QUIET[:2])
    assert "lr-finder" not in torch.load(first.last_checkpoint_path, weights_only=True).get(
        "plugins", {})
    start = tmp_path / "start.ckpt"
    start.write_bytes(first.last_checkpoint_path.read_bytes())
    capsys.readouterr()

    def resume(*plugins):
        recorder = GroupLRRecorder()
        module = (FlatLoss if first_finder else TinyRegressor)(lr=0.2)
        trainer = make_trainer(callbacks=[*plugins, recorder, *QUIET[:2]], max_epochs=2, seed=0)
        trainer.fit(module, ckpt_path=str(start))
        return recorder.steps, trainer

    finder = LRFinder(num_steps=30)
    with_finder, trainer = resume(finder)
    out = capsys.readouterr().out
    without, _ = resume()
    assert finder.lrs == [] and finder.suggestion is None  # no search
    assert with_finder == without and len(with_finder) == 8  # the same lr at every step
    assert ("lr-finder: no search: this run resumes from a checkpoint without an lr-finder "
            "suggestion, and continues with its lr 0.2; to search, start a fresh run (without "
            "--ckpt-path), or see the curve with --lr-finder-then stop.") in out
    assert "suggested lr" not in out
    assert "lr-finder" not in torch.load(trainer.last_checkpoint_path, weights_only=True).get(
        "plugins", {})  # a later resume is the same


class BatchRecorder:
    """The targets of every training batch of the run (the loop's, not a finder's trials)."""

    name = "batch-recorder"

    def __init__(self):
        self.batches: list[list[float]] = []

    @ptrain.hookimpl
    def on_train_batch_end(self, batch):
        self.batches.append(batch[1].flatten().tolist())


def test_a_resume_from_a_checkpoint_without_a_batch_size_keeps_its_batches_and_does_not_search(
        make_trainer, tmp_path, capsys):
    """A resume continues the run: with -p batch-size-finder and a checkpoint of a run without
    it, the finder searched on the restored weights and trained the rest of the run at another
    batch size, so the resumed epoch did not replay the batches it would have. It now trains
    exactly as the same resume without it, and says why in one line; then=stop still searches
    (and trains nothing)."""
    first = fit(make_trainer, TinyRegressor(shuffle=True), quiet=QUIET[:2])
    start = tmp_path / "start.ckpt"
    start.write_bytes(first.last_checkpoint_path.read_bytes())
    capsys.readouterr()

    def resume(*plugins):
        recorder = BatchRecorder()
        trainer = make_trainer(callbacks=[*plugins, recorder, *QUIET[:2]], max_epochs=2, seed=0)
        trainer.fit(TinyRegressor(shuffle=True), ckpt_path=str(start))
        return recorder.batches, trainer

    finder = BatchSizeFinder(max_batch_size=32)
    with_finder, trainer = resume(finder)
    out = capsys.readouterr().out
    without, _ = resume()
    assert with_finder == without and [len(b) for b in with_finder] == [8] * 8
    assert finder.trials == [] and finder.found is None  # no search
    assert ("batch-size-finder: no search: this run resumes from a checkpoint without a "
            "batch-size-finder result, and continues with its batch size 8; to search, start a "
            "fresh run (without --ckpt-path), or see the sizes that fit with "
            "--batch-size-finder-then stop.") in out
    assert "largest batch size" not in out
    assert "batch-size-finder" not in torch.load(trainer.last_checkpoint_path,
                                                 weights_only=True).get("plugins", {})

    finder = BatchSizeFinder(max_batch_size=32, then="stop")
    stopped, trainer = resume(finder)
    assert [t["batch_size"] for t in finder.trials] == [8, 16, 32] and finder.found == 32
    assert stopped == [] and trainer.global_step == first.global_step


def test_resuming_an_lr_finder_run_compares_the_learning_rate_with_the_suggestion(
        make_trainer):
    """docs/reliability.md: an unchanged resume says nothing. The lr-finder applies its
    suggestion (applied_optimizer_settings), so a resume with it is compared with that, not
    with the configured lr, which the suggestion replaces (also when it is changed); without
    it, the configured lr is what the run asks for, and its change is said."""
    torch.manual_seed(0)
    first = fit(make_trainer, TinyRegressor(), LRFinder(num_steps=30), quiet=QUIET[:2])
    suggestion = first.plugins["lr-finder"].suggestion
    assert suggestion is not None and suggestion != 0.1

    def resume(module, *plugins, epochs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = make_trainer(callbacks=[*plugins, *QUIET[:2]], max_epochs=epochs, seed=0)
            trainer.fit(module, ckpt_path="last")
        assert trainer.current_epoch == epochs
        return [str(w.message) for w in caught if "continues with the checkpoint's" in
                str(w.message)]

    assert resume(TinyRegressor(), LRFinder(num_steps=30), epochs=2) == []
    assert resume(TinyRegressor(lr=0.05), LRFinder(num_steps=30), epochs=3) == []
    [said] = resume(TinyRegressor(), epochs=4)
    assert f"lr={suggestion!r} (configured now: 0.1)" in said, said


def test_a_stopped_run_is_not_reported_as_one_epoch(make_trainer, capsys):
    fit(make_trainer, TinyRegressor(), LRFinder(num_steps=12, then="stop"), quiet=QUIET[1:])
    out = capsys.readouterr().out
    assert "Training finished: 0 epoch(s), 0 steps" in out


def test_batch_size_finder_with_manual_optimization(make_trainer):
    finder, recorder = BatchSizeFinder(max_batch_size=32), BatchSizeRecorder()
    trainer = fit(make_trainer, ManualRegressor(n=64, batch_size=8), finder, recorder)
    assert finder.found == 32 and recorder.sizes == [32, 32]
    assert trainer.global_step == 2


def test_batch_size_finder_refusals(make_trainer):
    from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

    class OwnBatches(BatchSampler):
        pass

    class OwnBatchSampler(TinyRegressor):
        def train_dataloader(self):
            return DataLoader(self.train_set, batch_sampler=OwnBatches(
                SequentialSampler(self.train_set), batch_size=8, drop_last=False))

    with pytest.raises(ConfigError, match="batches with its own batch sampler"):
        fit(make_trainer, OwnBatchSampler(), BatchSizeFinder())

    class Stream(IterableDataset):
        def __iter__(self):
            g = torch.Generator().manual_seed(0)
            for _ in range(64):
                yield torch.randn(4, generator=g), torch.randn(1, generator=g)

    class Streaming(TinyRegressor):
        def train_dataloader(self):
            return DataLoader(Stream(), batch_size=8)

    with pytest.raises(ConfigError, match="set --batch-size-finder-max-batch-size"):
        fit(make_trainer, Streaming(), BatchSizeFinder())
    finder = BatchSizeFinder(max_batch_size=16)  # with a cap it searches a stream too
    fit(make_trainer, Streaming(), finder)
    assert finder.found == 16

    for options, needle in [({"margin": 1.5}, "must be in (0, 1]"), ({"init": 0}, "at least 1"),
                            ({"init": 8, "max_batch_size": 4}, "is above max_batch_size"),
                            ({"steps_per_trial": 0}, "at least 1"),
                            ({"scale_lr": "cube"}, "none, linear, sqrt")]:
        with pytest.raises(ConfigError) as info:
            BatchSizeFinder(**options)
        assert needle in str(info.value)


@pytest.mark.slow
def test_a_real_out_of_memory_bounds_the_search_and_training_runs_at_the_answer(tmp_path):
    """``MemoryHungry`` in a subprocess whose address space is capped at its use plus 40 MiB:
    the CPU allocator's real failure ends the doubling, the bisection closes in on it, and the
    run then trains at the answer. ``MALLOC_MMAP_THRESHOLD_`` fixes glibc's threshold for
    giving a large block its own mapping (by default it rises up to 32 MiB as blocks are freed,
    after which freed tensors stay in the heap and the address space in use depends on the
    history of allocations: measured, a size found at the boundary then failed in training)."""
    env = {**os.environ, **ONE_THREAD, "MALLOC_MMAP_THRESHOLD_": "65536"}
    proc = subprocess.run([sys.executable, "-m", "tests._finder_models", "oom", str(tmp_path),
                           "40", json.dumps({"width": 1024})],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    trials = {t["batch_size"]: t["fits"] for t in result["trials"]}
    found = result["found"]
    assert not all(trials.values()), trials  # memory, not the dataset, ended the search
    assert trials[found] and trials[found + 1] is False  # the next size did not fit
    assert max(size for size, fits in trials.items() if fits) == found
    assert all(not fits for size, fits in trials.items() if size > found)
    errors = [t["error"] for t in result["trials"] if not t["fits"]]
    assert all("DefaultCPUAllocator: can't allocate memory" in e for e in errors)
    assert result["trained_sizes"] == [found] * 3 and result["global_step"] == 3
    assert 64 <= found < 4096  # measured: 211


# -- the CLI ----------------------------------------------------------------------------------

CLI_USAGE_ERRORS = {
    "then": ((("--config", DIGITS_CONFIG, "-p", "lr-finder", "--lr-finder-then",
               "later")), ("--lr-finder-then", "valid choices: fit, stop")),
    "range": ((("--config", DIGITS_CONFIG, "-p", "lr-finder", "--lr-finder-min-lr",
                "1", "--lr-finder-max-lr", "0.5")), ("min_lr (1) must be below max_lr (0.5)",)),
    "steps": ((("--config", DIGITS_CONFIG, "-p", "lr-finder", "--lr-finder-num-steps",
                "1")), ("num_steps=1 is too few; use at least 12",)),
    "manual": ((("--model", "tests._finder_models:ManualNoLoss", "--accelerator", "cpu",
                 "-p", "lr-finder")), ("ManualNoLoss.training_step returned no loss",)),
    "margin": ((("--config", DIGITS_CONFIG, "-p", "batch-size-finder",
                 "--batch-size-finder-margin", "2")), ("margin=2.0 must be in (0, 1]",)),
}


@pytest.mark.slow
def test_cli_then_stop_prints_the_suggestion_and_trains_nothing(cli_runs):
    result = cli_runs["stop"]
    assert_ok(result)
    run = cli_runs.dirs["stop"] / "version_0"
    assert "lr-finder: suggested lr" in result.stdout
    assert f"plot: {run / 'lr_finder.png'}" in result.stdout
    assert (run / "lr_finder.png").is_file() and not (run / "checkpoints").exists()
    data = json.loads((run / "lr_finder.json").read_text())
    assert f"suggested lr {data['suggestion']:.3g}, configured lr 0.003 (" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(CLI_USAGE_ERRORS))
def test_cli_usage_errors(cli_runs, key):
    assert_usage_error(cli_runs[key], *CLI_USAGE_ERRORS[key][1])


# -- 2 ranks ------------------------------------------------------------------------------------


@pytest.mark.slow
@TWO_PROCESS_RUNS
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "zero1"])
def test_two_ranks_agree_on_the_suggestion_and_restore_their_state(tmp_path, strategy):
    """Each rank trains on its half of the data, so its own losses differ from the other's;
    reduced every step, the curves are identical, bit for bit, and so is the suggestion both
    then train with. Each rank's state (its shard, under fsdp; its optimizer partition, under
    zero1) is restored exactly."""
    trainer = ptrain.Trainer(
        strategy=strategy, devices=2, accelerator="cpu", max_steps=1, seed=0,
        callbacks=[LRFinder(num_steps=30), StateProbe(str(tmp_path)), *QUIET],
        default_root_dir=str(tmp_path / "runs"),
        plugin_options={strategy: {"timeout": SAFETY_TIMEOUT_S}})
    trainer.fit(DigitsClassifier())
    probes = read_probes(tmp_path)
    assert sorted(probes) == [0, 1] and probes[0]["world_size"] == 2
    for rank, probe in probes.items():
        assert probe["differences"] == [], (rank, probe["differences"])
        assert probe["lr_after"] == pytest.approx(probe["suggestion"], rel=1e-12)
    assert probes[0]["smoothed"] == probes[1]["smoothed"] and len(probes[0]["lrs"]) >= 20
    assert probes[0]["suggestion"] == probes[1]["suggestion"]


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_two_ranks_agree_when_only_one_runs_out_of_memory(tmp_path, monkeypatch):
    """Rank 1 alone has its address space capped: it runs out of memory at sizes rank 0 could
    take, without stranding rank 0 in a collective, and both train at the same size.

    Training uses a margin below the size found: at the exact boundary, whether rank 1's first
    training step fits depends on what gloo's threads hold at that moment (measured: 89 fit in
    the search, then its backward ran out in training). The subprocess test above trains at the
    exact answer on one process."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")  # see the subprocess test above
    trainer = ptrain.Trainer(
        strategy="ddp", devices=2, accelerator="cpu", max_steps=2, seed=0,
        callbacks=[BatchSizeFinder(margin=0.75), CapAddressSpace(rank=1, budget_mib=40),
                   FinderProbe(str(tmp_path)), *QUIET],
        default_root_dir=str(tmp_path / "runs"),
        plugin_options={"ddp": {"timeout": SAFETY_TIMEOUT_S}})
    trainer.fit(MemoryHungry(width=1024))
    probes = read_probes(tmp_path)
    outcomes = {rank: [(t["batch_size"], t["fits"]) for t in probe["trials"]]
                for rank, probe in probes.items()}
    assert outcomes[0] == outcomes[1]
    found = probes[0]["found"]
    assert found == probes[1]["found"] and 16 <= found < 2048
    rank0_told = [t for t in probes[0]["trials"] if not t["fits"]]
    assert rank0_told and all(t["error"] == "another rank ran out of memory" for t in rank0_told)
    assert all("DefaultCPUAllocator" in t["error"] for t in probes[1]["trials"] if not t["fits"])
    assert probes[0]["batch_size"] == probes[1]["batch_size"] == math.floor(found * 0.75)
    assert probes[0]["first_batch_size"] == probes[1]["first_batch_size"] == \
        probes[0]["batch_size"]


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_batch_size_finder_refuses_sharded_strategies(tmp_path):
    trainer = ptrain.Trainer(
        strategy="fsdp", devices=2, accelerator="cpu", max_steps=1,
        callbacks=[BatchSizeFinder(), *QUIET], default_root_dir=str(tmp_path),
        plugin_options={"fsdp": {"timeout": SAFETY_TIMEOUT_S}})
    with pytest.raises(ConfigError, match="under --strategy fsdp the forward pass"):
        trainer.fit(DigitsClassifier())
