"""The ``early-stopping`` callback plugin, fed known metric sequences.

``tests._es_models.SequenceModule`` logs ``val_metric`` from a list (indexed by epoch, or by
validation run) on real training of a tiny linear model: 2 training batches (2 optimizer steps)
and 1 validation batch per epoch, so the epoch and step at which a run stops follow from the
sequence alone. Nothing of torch is replaced; the ddp test uses real 2-rank gloo groups.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

from ptrain import ConfigError
from ptrain_early_stopping import EarlyStopping
from tests._cli_util import assert_usage_error
from tests._es_models import SequenceModule
from tests.conftest import run_cli
from conftest import DIGITS_CONFIG

QUIET = ["no:progress-bar", "no:tensorboard"]
STEPS_PER_EPOCH = 2  # SequenceModule: 16 samples, batches of 8
NAN = float("nan")


def fit(make_trainer, module, *plugins, max_epochs: int = 10, **options):
    # the modules script one metric value per validation call: no sanity check to consume one
    options.setdefault("num_sanity_val_steps", 0)
    trainer = make_trainer(max_epochs=max_epochs, callbacks=[*plugins, *QUIET, "no:checkpoint"],
                           **options)
    trainer.fit(module)
    return trainer


def assert_stopped_at(trainer, module, epoch: int, steps: int | None = None):
    """The run ended in ``epoch`` (0-based) after running epochs 0..epoch, each to its end
    unless ``steps`` says otherwise (``current_epoch`` after fit counts the epochs run)."""
    assert trainer.current_epoch == epoch + 1
    assert module.epochs_seen == list(range(epoch + 1))
    expected = (epoch + 1) * STEPS_PER_EPOCH if steps is None else steps
    assert trainer.global_step == expected


# -- patience, min_delta, mode -----------------------------------------------------------------


def test_patience_counts_checks_without_improvement(make_trainer, caplog):
    # best 4 at epoch 1, then two checks without improvement: stop at epoch 3
    module = SequenceModule([5, 4, 4, 4, 4, 4])
    es = EarlyStopping(monitor="val_metric", patience=2)
    with caplog.at_level("INFO", logger="ptrain_early_stopping"):
        trainer = fit(make_trainer, module, es)
    assert (f"early stopping asked at epoch 3 (epochs count from 0): {es.reason}"
            in caplog.messages)
    assert_stopped_at(trainer, module, 3)
    assert (es.best, es.best_epoch, es.best_step, es.wait) == (4.0, 1, 2 * STEPS_PER_EPOCH, 2)
    assert es.stopped_epoch == 3
    assert "did not improve" in es.reason and "2 checks" in es.reason
    # the summary's epochs are indices from 0, as stopped_epoch, best_epoch and checkpoint names
    assert es.summary() == (f"Early stopping at epoch 3 (epochs count from 0): {es.reason}; best "
                            f"val_metric = 4 at epoch 1 (step 4).")


def test_patience_counts_checks_not_epochs(make_trainer):
    # val_check_interval=0.5: a validation after each of the 2 batches. Per check: best 3 at
    # check 2 (epoch 1, batch 0), no improvement at checks 3 and 4 -> stop at check 4, which is
    # after the first batch of epoch 2: the epoch is left half-way, after 5 optimizer steps.
    module = SequenceModule([5, 4, 3, 3, 3, 3, 3, 3], per_check=True)
    es = EarlyStopping(monitor="val_metric", patience=2)
    trainer = fit(make_trainer, module, es, val_check_interval=0.5)
    assert_stopped_at(trainer, module, 2, steps=5)
    assert module.validations == 5
    assert (es.best, es.best_epoch, es.best_step, es.wait) == (3.0, 1, 3, 2)


def test_an_improvement_smaller_than_min_delta_does_not_reset_the_wait(make_trainer):
    values = [5, 4, 3.9, 3.8, 3.7, 3.6, 3.5, 3.4]
    es = EarlyStopping(monitor="val_metric", patience=2, min_delta=0.5)
    module = SequenceModule(values)
    trainer = fit(make_trainer, module, es)
    # 4 -> 3.9 -> 3.8 improve by less than 0.5: best stays 4 (epoch 1), stop at epoch 3
    assert_stopped_at(trainer, module, 3)
    assert (es.best, es.best_epoch, es.wait) == (4.0, 1, 2)
    assert "more than 0.5" in es.reason
    # without min_delta every epoch improves: it runs to max_epochs
    es0 = EarlyStopping(monitor="val_metric", patience=2)
    module0 = SequenceModule(values)
    trainer0 = fit(make_trainer, module0, es0, max_epochs=len(values))
    assert_stopped_at(trainer0, module0, len(values) - 1)
    assert es0.reason is None and es0.summary() is None
    assert es0.best == pytest.approx(3.4) and es0.best_epoch == len(values) - 1


def test_mode_max(make_trainer):
    # higher is better: best 3 at epoch 2, then 3 and 2 are not improvements -> stop at epoch 4
    module = SequenceModule([1, 2, 3, 3, 2, 5, 6])
    es = EarlyStopping(monitor="val_metric", mode="max", patience=2)
    trainer = fit(make_trainer, module, es)
    assert_stopped_at(trainer, module, 4)
    assert (es.best, es.best_epoch) == (3.0, 2)


# -- thresholds and non-finite values ------------------------------------------------------------


def test_stopping_threshold(make_trainer):
    # 0.5 is the first value below 1: stop at epoch 3 although it keeps improving
    module = SequenceModule([5, 3, 2, 0.5, 0.25, 0.125])
    es = EarlyStopping(monitor="val_metric", patience=100, stopping_threshold=1.0)
    trainer = fit(make_trainer, module, es)
    assert_stopped_at(trainer, module, 3)
    assert "reached the stopping threshold 1" in es.reason and "val_metric = 0.5" in es.reason
    assert (es.best, es.best_epoch) == (0.5, 3)


def test_divergence_threshold(make_trainer):
    # mode max: 0.5 at epoch 3 is worse than the threshold 1
    module = SequenceModule([2, 3, 1.5, 0.5, 4, 5])
    es = EarlyStopping(monitor="val_metric", mode="max", patience=100, divergence_threshold=1.0)
    trainer = fit(make_trainer, module, es)
    assert_stopped_at(trainer, module, 3)
    assert "diverged past the threshold 1" in es.reason and "val_metric = 0.5" in es.reason
    assert (es.best, es.best_epoch) == (3.0, 1)


def test_check_finite_stops_on_nan(make_trainer):
    values = [5, 4, NAN, 3, 2, 1]
    module = SequenceModule(values)
    es = EarlyStopping(monitor="val_metric", patience=100)
    trainer = fit(make_trainer, module, es)
    assert_stopped_at(trainer, module, 2)
    assert es.reason == "val_metric = nan is not finite"
    assert (es.best, es.best_epoch) == (4.0, 1)  # the NaN never became the best


def test_check_finite_off_the_nan_does_not_stop(make_trainer):
    values = [5, 4, NAN, 3, 2, 1]
    module = SequenceModule(values)
    es = EarlyStopping(monitor="val_metric", patience=100, check_finite=False)
    trainer = fit(make_trainer, module, es, max_epochs=len(values))
    assert_stopped_at(trainer, module, len(values) - 1)
    assert es.reason is None
    assert (es.best, es.best_epoch, es.wait) == (1.0, len(values) - 1, 0)


# -- strict ----------------------------------------------------------------------------------------


def test_strict_missing_monitor_is_a_config_error_naming_the_logged_metrics(make_trainer):
    module = SequenceModule([5, 4, 3])
    es = EarlyStopping(monitor="val_metrc")
    with pytest.raises(ConfigError, match="val_metrc") as info:
        fit(make_trainer, module, es)
    text = str(info.value)
    assert "logged metrics:" in text
    logged = text.split("logged metrics:")[1]
    for name in ("train_loss", "val_loss", "val_metric"):
        assert name in logged, text
    assert module.epochs_seen == [0]  # raised at the first check


def test_strict_off_warns_and_runs_to_max_epochs(make_trainer):
    module = SequenceModule([5, 5, 5, 5, 5])
    es = EarlyStopping(monitor="val_metrc", patience=1, strict=False)
    with pytest.warns(UserWarning, match="val_metrc.*strict is off") as record:
        trainer = fit(make_trainer, module, es, max_epochs=5)
    assert len([w for w in record if "val_metrc" in str(w.message)]) == 1  # warned once
    assert_stopped_at(trainer, module, 4)
    assert es.reason is None and es.best is None


# -- checking at the end of training epochs --------------------------------------------------


def test_check_on_train_epoch_end_uses_the_training_epoch_metric(make_trainer):
    # the validation metric keeps improving; the training one stalls after epoch 1
    module = SequenceModule([9, 8, 7, 6, 5, 4, 3, 2], train_values=[5, 4, 4, 4, 4, 4])
    es = EarlyStopping(monitor="train_metric", patience=2, check_on="train_epoch_end")
    trainer = fit(make_trainer, module, es)
    assert_stopped_at(trainer, module, 3)
    assert (es.best, es.best_epoch) == (4.0, 1)


def test_without_validation_auto_checks_at_train_epoch_end(make_trainer):
    module = SequenceModule(train_values=[5, 4, 4, 4, 4, 4], with_val=False)
    es = EarlyStopping(monitor="train_metric", patience=2)
    trainer = fit(make_trainer, module, es)
    assert_stopped_at(trainer, module, 3)


# -- min_epochs ------------------------------------------------------------------------------------


def test_a_stop_before_min_epochs_takes_effect_once_they_are_met(make_trainer, capsys):
    # asked at epoch 1 (stopping threshold); min_epochs=4 -> epochs 0..3 run, it ends after
    # epoch 3, where "4 epochs done" is met (the core counts a finished epoch)
    module = SequenceModule([5, 0.5, 6, 7, 8, 9])
    es = EarlyStopping(monitor="val_metric", patience=100, stopping_threshold=1.0)
    trainer = fit(make_trainer, module, es, min_epochs=4)
    assert_stopped_at(trainer, module, 3)
    assert es.stopped_epoch == 1 and "stopping threshold" in es.reason
    # the printed line names both epochs by index, as the checkpoints of epochs 1 and 3
    assert ("Early stopping asked at epoch 1 (epochs count from 0; the run ended at epoch 3): "
            "val_metric = 0.5 reached the stopping threshold 1; best val_metric = 0.5 at epoch 1 "
            "(step 4).") in capsys.readouterr().out
    # min_steps works the same way: 7 steps are met in epoch 3 (after its first batch, but the
    # stop is only acted on at a check point, the validation at the epoch's end)
    module_steps = SequenceModule([5, 0.5, 6, 7, 8, 9])
    es_steps = EarlyStopping(monitor="val_metric", patience=100, stopping_threshold=1.0)
    trainer_steps = fit(make_trainer, module_steps, es_steps, min_steps=7)
    assert_stopped_at(trainer_steps, module_steps, 3)


def test_a_stop_asked_before_min_epochs_survives_a_resume(make_trainer, tmp_path):
    # asked at epoch 1, min_epochs=4; the run is cut after epoch 2 (max_steps: 2 batches per
    # epoch) and resumed: the kept reason re-asks the stop, so it ends after epoch 3 although
    # val_metric never again passes 1
    def trainer(max_steps):
        return make_trainer(max_epochs=10, max_steps=max_steps, min_epochs=4,
                            default_root_dir=str(tmp_path), callbacks=["early-stopping", *QUIET],
                            plugin_options={"early-stopping": {
                                "monitor": "val_metric", "patience": 100,
                                "stopping_threshold": 1.0}})
    values = [5, 0.5, 6, 7, 8, 9]
    first = trainer(6)
    first.fit(SequenceModule(values))
    assert first.current_epoch == 3 and first.plugins["early-stopping"].stopped_epoch == 1
    resumed, module = trainer(None), SequenceModule(values)
    resumed.fit(module, ckpt_path="last")
    assert resumed.current_epoch == 4 and module.epochs_seen == [3]
    assert resumed.plugins["early-stopping"].stopped_epoch == 1


# -- resume in the middle of a patience window --------------------------------------------------


RESUME_VALUES = [5, 4, 3, 3.5, 3.25, 3.125, 3.0, 2.0, 1.0]  # best 3 at epoch 2; patience 3 -> 5


def named_trainer(make_trainer, root: Path, max_epochs: int, **options):
    return make_trainer(max_epochs=max_epochs, default_root_dir=str(root),
                        callbacks=["early-stopping", *QUIET],
                        plugin_options={"early-stopping": {"monitor": "val_metric",
                                                           "patience": 3}}, **options)


def test_resume_in_the_middle_of_a_patience_window(make_trainer, tmp_path, capsys):
    # a run never interrupted
    whole = named_trainer(make_trainer, tmp_path / "whole", max_epochs=20)
    whole_module = SequenceModule(RESUME_VALUES)
    whole.fit(whole_module)
    es_whole = whole.plugins["early-stopping"]
    assert_stopped_at(whole, whole_module, 5)
    assert (es_whole.best, es_whole.best_epoch, es_whole.wait) == (3.0, 2, 3)
    assert es_whole.summary() in capsys.readouterr().out

    # the same run cut after epoch 3 (wait 1), then resumed from last.ckpt
    root = tmp_path / "cut"
    first = named_trainer(make_trainer, root, max_epochs=4)
    first.fit(SequenceModule(RESUME_VALUES))
    assert first.current_epoch == 4 and first.plugins["early-stopping"].reason is None
    saved = torch.load(root / "version_0" / "checkpoints" / "last.ckpt", weights_only=False)
    state = saved["plugins"]["early-stopping"]
    assert (state["best"], state["best_epoch"], state["wait"], state["reason"]) == (3.0, 2, 1,
                                                                                    None)
    resumed = named_trainer(make_trainer, root, max_epochs=20)
    module = SequenceModule(RESUME_VALUES)
    resumed.fit(module, ckpt_path="last")
    es = resumed.plugins["early-stopping"]
    assert module.epochs_seen == [4, 5]
    assert resumed.current_epoch == whole.current_epoch == 6
    assert resumed.global_step == whole.global_step
    for attr in ("best", "best_epoch", "best_step", "wait", "stopped_epoch", "reason"):
        assert getattr(es, attr) == getattr(es_whole, attr), attr
    assert es.summary() == es_whole.summary()


# -- the CLI -------------------------------------------------------------------------------------


def test_cli_stops_early_and_prints_the_reason(tmp_path):
    # every checkpoint kept, so the printed epochs can be checked against the files' names
    root = tmp_path / "runs"
    result = run_cli("fit", "--config", DIGITS_CONFIG, "-p", "early-stopping",
                     "--early-stopping-monitor", "val_loss", "--early-stopping-patience", "1",
                     "--max-epochs", "30", "--checkpoint-save-top-k", "-1",
                     "--checkpoint-monitor", "val_loss", "--no-progress-bar",
                     "-p", "no:tensorboard", "--default-root-dir", str(root))
    detail = f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, detail
    lines = [line for line in result.stdout.splitlines()
             if line.startswith("Early stopping at epoch")]
    assert len(lines) == 1, detail
    match = re.match(r"Early stopping at epoch (\d+) \(epochs count from 0\): val_loss did not "
                     r"improve by more than 0 in 1 checks; best val_loss = (\S+) at epoch (\d+) "
                     r"\(step (\d+)\)\.$", lines[0])
    assert match, lines[0]
    stopped, value, best, step = int(match[1]), float(match[2]), int(match[3]), int(match[4])
    assert stopped < 29 and best == stopped - 1  # patience 1: the epoch after the best
    folder = root / "version_0" / "checkpoints"
    # the best state is the file named by the same epoch and step, the one the checkpoint
    # callback calls best
    held = torch.load(folder / f"epoch={best}-step={step}.ckpt", weights_only=False)
    assert held["loop"]["global_step"] == step and held["loop"]["epoch"] == best + 1
    assert held["plugins"]["checkpoint"]["best_model_path"] == f"epoch={best}-step={step}.ckpt"
    assert held["plugins"]["checkpoint"]["current_score"] == pytest.approx(value, rel=1e-5)
    # the stop came in the last epoch run: its file is the last, and epochs 0..stopped ran
    last_steps = [p.name for p in folder.glob(f"epoch={stopped}-step=*.ckpt")]
    assert len(last_steps) == 1 and not list(folder.glob(f"epoch={stopped + 1}-*")), last_steps
    loop = torch.load(folder / "last.ckpt", weights_only=False)["loop"]
    assert loop["epoch"] == stopped + 1  # a count: the epochs run
    assert f"Training finished: {stopped + 1} epoch(s)" in result.stdout, detail


def test_cli_help_lists_the_options_under_the_plugin_name():
    result = run_cli("fit", "-p", "early-stopping", "--help")
    assert result.returncode == 0, result.stderr
    section = result.stdout.split("early-stopping (callback")[1].split("\n\n\n")[0]
    section = re.split(r"\n\S", section)[0]  # up to the next plugin's heading
    for flag in ("--early-stopping-monitor", "--early-stopping-mode",
                 "--early-stopping-min-delta", "--early-stopping-patience",
                 "--early-stopping-strict", "--no-early-stopping-strict",
                 "--early-stopping-check-finite", "--early-stopping-stopping-threshold",
                 "--early-stopping-divergence-threshold", "--early-stopping-check-on"):
        assert flag in section, flag


def test_cli_missing_monitor_is_a_usage_error(tmp_path):
    result = run_cli("fit", "--config", DIGITS_CONFIG, "-p", "early-stopping",
                     "--max-epochs", "1", "--default-root-dir", str(tmp_path))
    assert_usage_error(result, "monitor")


@pytest.mark.parametrize("argument, value, choices", [
    ("mode", "maximize", "min or max"),
    ("check_on", "epoch", "auto, validation, train_epoch_end"),
])
def test_a_value_outside_the_choices_is_refused_when_made(argument, value, choices):
    # in Python no option parser checks them: "maximize" had meant max, and "epoch" had meant
    # train_epoch_end
    with pytest.raises(ConfigError, match=f"`{argument}` can be {choices} .*got {value}"):
        EarlyStopping(monitor="val_loss", **{argument: value})


# -- two ddp ranks -----------------------------------------------------------------------------


def test_ddp_decides_on_the_mean_across_ranks(make_trainer, capfd):
    # mean: best 3 at epoch 5, then 3, 3 -> stop at epoch 7 (patience 2). Rank 0 alone would
    # stop at epoch 3 (stuck at 7); rank 1 alone would never stop (keeps falling).
    mean = [8, 7, 6, 5, 4, 3, 3, 3, 3, 3, 3, 3]
    offset = [0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    per_rank = [[m + o for m, o in zip(mean, offset)], [m - o for m, o in zip(mean, offset)]]
    module = SequenceModule(per_rank, per_rank=True)
    trainer = make_trainer(strategy="ddp", devices=2, accelerator="cpu", max_epochs=len(mean),
                           callbacks=[EarlyStopping(monitor="val_metric", patience=2), *QUIET,
                                      "no:checkpoint"],
                           plugin_options={"ddp": {"timeout": 120.0}})
    start = time.monotonic()
    trainer.fit(module)
    assert time.monotonic() - start < 60  # the job ended: no rank left waiting
    assert trainer.current_epoch == 8
    assert trainer.callback_metrics["val_metric"].item() == pytest.approx(3.0)
    out = capfd.readouterr().out
    assert out.count("Early stopping at epoch 7 (epochs count from 0): val_metric did not "
                     "improve") == 1, out
    assert "best val_metric = 3 at epoch 5" in out, out
