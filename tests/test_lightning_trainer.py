"""``ptrain.lightning.Trainer``'s attributes and arguments, each checked against Lightning 2.6.6
running the same program: the state (``fn``, ``stage``, ``status``), the folders
(``log_dir``, ``default_root_dir``), the limits as Lightning shows them, the stages' dataloaders
and their batch counts, ``estimated_stepping_batches``, and the arguments ptrain took over from
Lightning (``reload_dataloaders_every_n_epochs``, ``check_val_every_n_epoch=None``,
``limit_train_batches=0``, ``use_distributed_sampler``, ``sync_batchnorm``, ``barebones``,
``PL_TRAINER_*`` defaults)."""

from __future__ import annotations

import importlib
import math
import os
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import ptrain
import ptrain.lightning

from tests._lightning_pair import FRAMEWORKS, QUIET, Numbers


def model_class(pl):
    """A small regression module written against ``pl`` (Lightning or ptrain.lightning) that
    records what the trainer says in its hooks."""

    class Model(pl.LightningModule):
        def __init__(self, n_train=16, n_val=8, batch_size=4):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.n_train, self.n_val, self.batch_size = n_train, n_val, batch_size
            self.seen: list = []
            self.asked: list = []

        def training_step(self, batch, batch_idx):
            state = self.trainer.state
            self.seen.append(("train", str(state.fn), str(state.stage), str(state.status),
                              self.trainer.is_last_batch))
            return self.layer(batch).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            state = self.trainer.state
            self.seen.append(("val", str(state.fn), str(state.stage), self.global_step))
            self.log("val_loss", self.layer(batch).pow(2).mean())

        def test_step(self, batch, batch_idx):
            self.seen.append(("test", str(self.trainer.state.fn),
                              str(self.trainer.state.stage)))

        def train_dataloader(self):
            self.asked.append(("train", self.current_epoch, self.trainer.sanity_checking))
            return DataLoader(Numbers(self.n_train), batch_size=self.batch_size)

        def val_dataloader(self):
            self.asked.append(("val", self.current_epoch, self.trainer.sanity_checking))
            return DataLoader(Numbers(self.n_val, seed=1), batch_size=self.batch_size)

        def test_dataloader(self):
            return DataLoader(Numbers(self.n_val, seed=2), batch_size=self.batch_size)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Model


def both(function):
    """``function(pl)`` run under Lightning, then under ptrain.lightning: their results."""
    results = []
    for name in FRAMEWORKS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results.append(function(importlib.import_module(name)))
    return results


# -- state ------------------------------------------------------------------------------------

def test_state_follows_the_stages_as_lightnings_does(tmp_path):
    def run(pl):
        model = model_class(pl)()
        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=1,
                             num_sanity_val_steps=1, logger=False, **QUIET)
        before = (trainer.state.fn, trainer.state.stage, trainer.state.status.value)
        trainer.fit(model)
        after_fit = (str(trainer.state.fn), trainer.state.stage, str(trainer.state.status),
                     trainer.state.finished, trainer.interrupted)
        trainer.test(model)
        after_test = (str(trainer.state.fn), trainer.state.stage, trainer.state.finished)
        return before, after_fit, after_test, model.seen

    lightning, ours = both(run)
    assert ours == lightning
    # the sanity check is a stage of its own
    assert ("val", "TrainerFn.FITTING", "RunningStage.SANITY_CHECKING", 0) in ours[3]


def test_an_error_in_a_stage_leaves_the_trainer_interrupted(tmp_path):
    def run(pl):
        class Fails(model_class(pl)):
            def training_step(self, batch, batch_idx):
                raise RuntimeError("stop here")

        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=1,
                             logger=False, enable_checkpointing=False, **QUIET)
        with pytest.raises(RuntimeError, match="stop here"):
            trainer.fit(Fails())
        return trainer.state.status.value, trainer.interrupted, trainer.state.stage

    lightning, ours = both(run)
    assert ours == lightning == ("interrupted", True, None)


@pytest.mark.parametrize("where", ["training_step", "on_train_epoch_end", "validation"])
def test_an_epoch_that_fails_is_not_counted_as_in_lightning(tmp_path, where):
    # gluonts' estimator goes on after a failed fit and reads the trainer: current_epoch is the
    # epoch that failed (it was one more), and a next fit of the same trainer runs it again
    def run(pl):
        class Fails(model_class(pl)):
            fails_in = where

            def training_step(self, batch, batch_idx):
                if self.fails_in == "training_step" and self.current_epoch == 1 and batch_idx:
                    raise RuntimeError("stop here")
                return super().training_step(batch, batch_idx)

            def on_train_epoch_end(self):
                if self.fails_in == "on_train_epoch_end" and self.current_epoch == 1:
                    raise RuntimeError("stop here")

            def on_validation_epoch_end(self):
                if self.fails_in == "validation" and self.current_epoch == 1:
                    raise RuntimeError("stop here")

        model = Fails()
        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=3,
                             num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                             **QUIET)
        with pytest.raises(RuntimeError, match="stop here"):
            trainer.fit(model)
        failed = (trainer.current_epoch, trainer.global_step)
        model.fails_in = None
        trainer.fit(model)  # the same trainer again: it runs the failed epoch again
        return failed, trainer.current_epoch, trainer.global_step

    lightning, ours = both(run)
    assert ours == lightning
    assert ours[0][0] == 1


def test_setting_the_state_sets_the_trainers_fields():
    from ptrain.lightning.trainer.states import RunningStage, TrainerFn

    trainer = ptrain.lightning.Trainer(logger=False, **QUIET)
    trainer.state.fn = TrainerFn.TESTING
    trainer.state.stage = RunningStage.SANITY_CHECKING
    assert trainer.stage_call == "test" and trainer.sanity_checking
    assert trainer.state.stage is RunningStage.SANITY_CHECKING and trainer.validating is False


def test_a_stage_without_a_module_is_a_type_error_as_in_lightning():
    trainer = ptrain.lightning.Trainer(logger=False, **QUIET)
    for stage in ("validate", "test", "predict"):
        with pytest.raises(TypeError, match="LightningModule"):
            getattr(trainer, stage)()
    with pytest.raises(TypeError, match="must be a LightningModule"):
        trainer.fit(torch.nn.Linear(2, 2))
    with pytest.raises(ptrain.ModelError):  # and still ptrain's own kind of error
        trainer.fit(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("inference_mode", [True, False])
def test_validation_inside_fit_runs_without_inference_mode_as_lightnings_does(tmp_path,
                                                                              inference_mode):
    """Lightning validates inside fit (the sanity check too) under no_grad whatever
    inference_mode says, so a validation_step may turn gradients back on (the UvA course's
    ProtoMAML adapts a copy of its network there); validate/test follow inference_mode."""
    def run(pl):
        class Model(model_class(pl)):
            def validation_step(self, batch, batch_idx):
                with torch.enable_grad():
                    grads = self.layer(batch).sum().requires_grad
                self.modes.append((self.trainer.state.fn.value, self.trainer.sanity_checking,
                                   torch.is_inference_mode_enabled(), grads))

            def test_step(self, batch, batch_idx):
                self.validation_step(batch, batch_idx)

            def test_dataloader(self):
                return self.val_dataloader()

        model = Model()
        model.modes = []
        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=1,
                             num_sanity_val_steps=1, logger=False, enable_checkpointing=False,
                             inference_mode=inference_mode, **QUIET)
        trainer.fit(model)
        trainer.validate(model, verbose=False)
        trainer.test(model, verbose=False)
        return sorted(set(model.modes))

    lightning, ours = both(run)
    assert ours == lightning
    assert ("fit", True, False, True) in ours  # the sanity check, with gradients


@pytest.mark.parametrize("summary", ["default", "callback"])
def test_the_summary_runs_the_example_input_as_lightnings_does(tmp_path, capsys, summary):
    """Lightning's model summary runs the module's example_input_array through it (its In/Out
    sizes), drawing what the forward draws: the UvA course's normalizing flows dequantize with
    random noise in forward, and trained to other weights under ptrain, whose summary ran no
    forward."""
    def run(pl):
        class Noisy(model_class(pl)):
            def __init__(self):
                super().__init__()
                self.example_input_array = torch.zeros(2, 4)

            def forward(self, x):
                return self.layer(x + torch.rand_like(x))

            def training_step(self, batch, batch_idx):
                return self(batch).pow(2).mean()

        given = dict(QUIET, enable_model_summary=True)
        if summary == "callback":
            given["callbacks"] = [pl.callbacks.ModelSummary(max_depth=2)]
        pl.seed_everything(0)
        model = Noisy()
        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=1,
                             logger=False, enable_checkpointing=False, **given)
        trainer.fit(model)
        return [p.detach().clone() for p in model.parameters()]

    capsys.readouterr()
    lightning, ours = both(run)
    assert all(torch.equal(a, b) for a, b in zip(lightning, ours))
    assert "In sizes" in capsys.readouterr().out.split("Trainable params")[-2]  # ptrain's table


# -- folders ------------------------------------------------------------------------------------

@pytest.mark.parametrize("logger", ["default", "none", "tensorboard", "csv"])
def test_log_dir_is_lightnings_before_during_and_after_fit(tmp_path, logger):
    def run(pl):
        root = tmp_path / pl.__name__
        loggers = importlib.import_module(f"{pl.__name__}.loggers")
        loggers = {"default": None, "none": False,
                   "tensorboard": loggers.TensorBoardLogger(root, name="custom"),
                   "csv": loggers.CSVLogger(root / "csv")}
        seen = []

        class Model(model_class(pl)):
            def on_train_start(self):
                seen.append(self.trainer.log_dir)

        trainer = pl.Trainer(default_root_dir=root, max_steps=1, logger=loggers[logger],
                             enable_checkpointing=False, **QUIET)
        before = trainer.log_dir
        trainer.fit(Model())
        relative = [os.path.relpath(p, root) for p in (before, seen[0], trainer.log_dir)]
        return relative, type(before).__name__, trainer.default_root_dir == str(root)

    lightning, ours = both(run)
    assert ours == lightning


@pytest.mark.parametrize("logger", ["tensorboard", "csv"])
@pytest.mark.parametrize("second_stage", ["fit", "validate", "predict"])
def test_a_logger_given_to_a_second_trainer_keeps_its_folder_as_lightnings(tmp_path, logger,
                                                                           second_stage):
    """neuralforecast makes a trainer for each fit and predict with the logger its model was
    given; before, each trainer opened a new version_N where Lightning's logger keeps its
    version."""
    def run(pl):
        root = tmp_path / pl.__name__
        loggers = importlib.import_module(f"{pl.__name__}.loggers")
        given = {"tensorboard": loggers.TensorBoardLogger(root, name="tb"),
                 "csv": loggers.CSVLogger(root, name="csv")}[logger]
        class Model(model_class(pl)):
            def training_step(self, batch, batch_idx):
                loss = super().training_step(batch, batch_idx)
                self.log("train_loss", loss)
                return loss

            def predict_step(self, batch, batch_idx):
                return self.layer(batch)

            def predict_dataloader(self):
                return self.test_dataloader()

        model = Model()
        options = dict(logger=given, log_every_n_steps=1, enable_checkpointing=False, **QUIET)
        pl.Trainer(max_steps=2, **options).fit(model)
        first = given.log_dir
        trainer = pl.Trainer(max_steps=4, **options)
        before = trainer.log_dir
        getattr(trainer, second_stage)(model)
        folders = sorted(os.path.relpath(p, root) for p in root.glob("*/*") if p.is_dir())
        metrics = Path(given.log_dir) / "metrics.csv"
        rows = len(metrics.read_text().splitlines()) if metrics.is_file() else None
        return ([os.path.relpath(p, root) for p in (first, before, trainer.log_dir,
                                                     given.log_dir)],
                given.version, folders, rows)

    lightning, ours = both(run)
    assert ours == lightning
    assert ours[2] == [f"{'tb' if logger == 'tensorboard' else 'csv'}/version_0"]


def test_file_loggers_with_their_own_folders_each_write_there_as_lightnings(tmp_path):
    """A second file logger with another save_dir or name wrote into the first's run folder
    (every metrics.csv row twice in one file) and named that folder as its log_dir."""
    def run(pl):
        root = tmp_path / pl.__name__
        loggers = importlib.import_module(f"{pl.__name__}.loggers")
        given = [loggers.CSVLogger(root / "a"), loggers.CSVLogger(root / "b", name="other"),
                 loggers.TensorBoardLogger(root / "c", name="tb"),
                 loggers.CSVLogger(root / "a", name="lightning_logs")]

        class Model(model_class(pl)):
            def training_step(self, batch, batch_idx):
                loss = super().training_step(batch, batch_idx)
                self.log("train_loss", loss)
                return loss

        model = Model()
        options = dict(logger=given, log_every_n_steps=1, enable_checkpointing=False, **QUIET)
        before = [os.path.relpath(g.log_dir, root) for g in given]
        trainer = pl.Trainer(max_steps=2, **options)
        trainer.fit(model)
        trainer.validate(model)
        csvs = {os.path.relpath(p, root): len(p.read_text().splitlines())
                for p in sorted(root.rglob("metrics.csv"))}
        events = sorted(os.path.relpath(p.parent, root) for p in root.rglob("events.out.*"))
        return (before, [os.path.relpath(g.log_dir, root) for g in given],
                [g.version for g in given], csvs, events)

    lightning, ours = both(run)
    assert ours == lightning
    assert ours[1][:3] == ["a/lightning_logs/version_0", "b/other/version_0", "c/tb/version_0"]


@pytest.mark.parametrize("version", ["exp", 3])
def test_a_loggers_version_names_the_run_folder_for_every_run_as_lightnings(tmp_path, version):
    """darts' log_tensorboard gives TensorBoardLogger(version="logs"): refused before. Each
    run writes into the folder named, the second one's checkpoint next to the first's (-v1),
    and ckpt_path="last" resumes from the folder's last.ckpt."""
    def run(pl):
        root = tmp_path / pl.__name__
        loggers = importlib.import_module(f"{pl.__name__}.loggers")
        callbacks = importlib.import_module(f"{pl.__name__}.callbacks")
        seen = []

        class Counted(model_class(pl)):
            batches = 0

            def on_train_batch_start(self, batch, batch_idx):
                Counted.batches += 1

        for n in range(3):
            Counted.batches = 0
            given = [loggers.TensorBoardLogger(root, name="tb", version=version),
                     loggers.CSVLogger(root, name="csv", version=version)]
            trainer = pl.Trainer(logger=given, max_epochs=2 + (n == 2), log_every_n_steps=1,
                                 callbacks=[callbacks.ModelCheckpoint(save_last=n > 0)],
                                 **QUIET)
            seen.append([os.path.relpath(p, root) for p in (trainer.log_dir, given[0].log_dir,
                                                            given[1].log_dir)])
            trainer.fit(Counted(), ckpt_path="last" if n == 2 else None)
            seen.append((given[0].version, given[1].version, Counted.batches,
                         os.path.relpath(trainer.checkpoint_callback.best_model_path, root)))
        files = sorted(os.path.relpath(p, root) for p in root.rglob("*.ckpt"))
        events = len(list(root.rglob("events.out.*")))
        return seen, files, events

    lightning, ours = both(run)
    assert ours == lightning
    folder = "exp" if version == "exp" else "version_3"
    # the first run's file is kept; the resumed third run replaced the second run's newest
    assert ours[1] == [f"tb/{folder}/checkpoints/{name}.ckpt" for name in (
        "epoch=1-step=8", "epoch=2-step=12", "last")]
    assert ours[0][-1][2] == 4  # resumed at step 8: one epoch more


def test_default_root_dir_expands_the_home_folder_as_lightnings_does(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    trainer = ptrain.lightning.Trainer(default_root_dir="~/runs", logger=False, **QUIET)
    assert trainer.default_root_dir == str(tmp_path / "runs")
    assert trainer.run_root == str(tmp_path / "runs" / "lightning_logs")  # no "~" folder made


# -- limits -------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_epochs, max_steps", [(None, -1), (-1, -1), (3, -1), (None, 2),
                                                   (-1, 5)])
def test_the_limits_read_as_lightnings_before_and_after_fit(tmp_path, max_epochs, max_steps):
    def run(pl):
        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=max_epochs,
                             max_steps=max_steps, limit_train_batches=2, limit_val_batches=1,
                             logger=False, enable_checkpointing=False, **QUIET)
        before = (trainer.max_epochs, trainer.max_steps)
        if max_epochs not in (None, 3) or max_steps == -1 and max_epochs is None:
            return before, None  # a fit without an end (or 1000 epochs): not run here
        trainer.fit(model_class(pl)())
        return before, (trainer.max_epochs, trainer.max_steps, trainer.global_step)

    lightning, ours = both(run)
    assert ours == lightning


def test_limit_train_batches_zero_trains_nothing_as_in_lightning(tmp_path):
    def run(pl):
        model = model_class(pl)()
        before = [p.detach().clone() for p in model.parameters()]
        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=2,
                             limit_train_batches=0.0, logger=False, **QUIET)
        trainer.fit(model)
        unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        return unchanged, trainer.current_epoch, [s[0] for s in model.seen]

    lightning, ours = both(run)
    assert ours == lightning == (True, 0, ["val", "val"])  # the sanity check only
    trainer = ptrain.lightning.Trainer(limit_train_batches=0, logger=False, **QUIET)
    with pytest.warns(UserWarning, match="limit_train_batches=0: fit trains nothing"):
        trainer.fit(model_class(ptrain.lightning)())


def test_a_whole_float_limit_counts_batches_and_zero_turns_a_stage_off():
    trainer = ptrain.Trainer(limit_val_batches=3.0, limit_test_batches=0.0)
    assert trainer.limit_val_batches == 3 and type(trainer.limit_val_batches) is int
    with pytest.raises(ptrain.ConfigError, match="fraction must be in"):
        ptrain.Trainer(limit_val_batches=2.5)


# -- the stages' data ---------------------------------------------------------------------------

def test_dataloaders_and_their_batch_counts_read_as_lightnings(tmp_path):
    def run(pl):
        model = model_class(pl)()
        train = DataLoader(Numbers(18), batch_size=4)
        val = DataLoader(Numbers(10), batch_size=4)
        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=1,
                             limit_val_batches=2, num_sanity_val_steps=1, logger=False,
                             enable_checkpointing=False, **QUIET)
        trainer.fit(model, train, val)
        fitted = (trainer.val_dataloaders is val, trainer.num_training_batches,
                  trainer.num_val_batches, trainer.num_sanity_val_batches)
        test = DataLoader(Numbers(3), batch_size=2)
        trainer.test(model, test)
        return fitted, trainer.test_dataloaders is test, trainer.num_test_batches

    lightning, ours = both(run)
    assert ours == lightning
    assert ours[0] == (True, 5, [2], [1])


def test_an_empty_validation_loader_is_skipped_by_fit_with_a_warning_as_in_lightning(tmp_path):
    # darts' models give an empty validation loader whenever fit has no validation series
    def run(pl):
        torch.manual_seed(0)
        model = model_class(pl)(n_val=0)
        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=2,
                             logger=False, enable_checkpointing=False, **QUIET)
        trainer.fit(model)
        return ([s[0] for s in model.seen], trainer.current_epoch, trainer.global_step,
                [p.detach().tolist() for p in model.parameters()])

    lightning, ours = both(run)
    assert ours == lightning
    assert ours[0] == ["train"] * 8
    trainer = ptrain.lightning.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                                       **QUIET)
    with pytest.warns(UserWarning, match="gives no batches .* so fit runs no validation"):
        trainer.fit(model_class(ptrain.lightning)(n_val=0))
    # validate and test of an empty loader run nothing and return [], as Lightning's
    def evaluate(pl):
        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, logger=False, **QUIET)
        empty = DataLoader(Numbers(0), batch_size=2)
        model = model_class(pl)()
        return trainer.validate(model, empty), trainer.test(model, empty)

    evaluated_lightning, evaluated_ours = both(evaluate)
    assert evaluated_ours == evaluated_lightning == ([], [])
    with pytest.warns(UserWarning, match="gives no batches .* so test runs nothing"):
        evaluate(ptrain.lightning)
    # ptrain's own Trainer still names the empty loader and stops
    # (in the names of the caller's API and of the CLI, the Trainer's being the one called)
    with pytest.raises(ptrain.ModelError, match="gives no batches.* limit_val_batches=0 "
                                                r"\(--limit-val-batches 0\)"):
        ptrain.Trainer(max_epochs=1, callbacks=["no:progress-bar"]).fit(
            model_class(ptrain.lightning)(n_val=0))


def test_an_infinite_sanity_check_reads_as_lightnings():
    trainer = ptrain.lightning.Trainer(num_sanity_val_steps=-1, logger=False, **QUIET)
    assert trainer.num_sanity_val_steps == math.inf


@pytest.mark.parametrize("arguments", [
    dict(max_epochs=3), dict(max_epochs=3, accumulate_grad_batches=2),
    dict(max_epochs=3, max_steps=4), dict(max_epochs=-1, max_steps=7),
    dict(max_epochs=2, limit_train_batches=0.5), dict(max_epochs=-1),
])
def test_estimated_stepping_batches_are_lightnings(tmp_path, arguments):
    def run(pl):
        estimates = []

        class Model(model_class(pl)):
            def configure_optimizers(self):
                # the count also sets num_training_batches, before the loop (chemprop sizes
                # its warmup with it there)
                estimates.append((self.trainer.estimated_stepping_batches,
                                  self.trainer.num_training_batches))
                return super().configure_optimizers()

        model = Model(n_train=20, batch_size=4)
        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, logger=False,
                             enable_checkpointing=False, **QUIET, **arguments)
        if arguments.get("max_epochs") == -1 and "max_steps" not in arguments:
            return trainer.estimated_stepping_batches
        trainer.fit(model)
        return estimates[0], [asked for asked in model.asked if asked[0] == "train"]

    lightning, ours = both(run)
    assert ours == lightning  # the training loader is asked for once, as by Lightning


def test_lr_scheduler_configs_are_lightnings_config_objects(tmp_path):
    from ptrain.lightning.utilities.types import LRSchedulerConfig

    class Model(model_class(ptrain.lightning)):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    trainer = ptrain.lightning.Trainer(default_root_dir=tmp_path, max_steps=1, logger=False,
                                       enable_checkpointing=False, **QUIET)
    trainer.fit(Model())
    [config] = trainer.lr_scheduler_configs
    assert isinstance(config, LRSchedulerConfig)
    assert (config.interval, config.frequency, config.monitor) == ("step", 1, None)
    assert config.scheduler is trainer.lr_schedulers[0]["scheduler"]


@pytest.mark.parametrize("interval", ["epoch", "step"])
def test_a_monitor_beside_a_scheduler_not_on_plateau_is_not_read_as_in_lightning(tmp_path,
                                                                                interval):
    # pytorch-tabular names a monitor beside every scheduler it configures: Lightning reads it
    # for ReduceLROnPlateau only, and steps any other scheduler with no value
    def run(pl):
        class Model(model_class(pl)):
            def configure_optimizers(self):
                optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
                scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
                return {"optimizer": optimizer,
                        "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss",
                                         "interval": interval}}

        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=2,
                             logger=False, enable_checkpointing=False, **QUIET)
        trainer.fit(Model())
        [config] = trainer.lr_scheduler_configs
        return (trainer.optimizers[0].param_groups[0]["lr"], config.monitor,
                config.scheduler.last_epoch)

    lightning, ours = both(run)
    assert ours == lightning


# -- arguments ptrain takes over from Lightning ------------------------------------------------

@pytest.mark.parametrize("check_val_every_n_epoch, reload", [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_reload_dataloaders_every_n_epochs_asks_again_as_lightning(tmp_path,
                                                                  check_val_every_n_epoch,
                                                                  reload):
    def run(pl):
        model = model_class(pl)()
        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=5,
                             limit_train_batches=1, limit_val_batches=1,
                             num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                             check_val_every_n_epoch=check_val_every_n_epoch,
                             reload_dataloaders_every_n_epochs=reload, **QUIET)
        trainer.fit(model)
        return ([epoch for kind, epoch, _ in model.asked if kind == "train"],
                [seen[3] for seen in model.seen if seen[0] == "val"])

    lightning, ours = both(run)
    assert ours[0] == lightning[0]  # the training loader: the same epochs
    assert ours[1] == lightning[1]  # validation at the same steps


def test_a_reloaded_shuffling_loader_gives_lightnings_batches(tmp_path):
    """Lightning makes an iterator of a training loader it asked for again, and the epoch
    makes another: the first one's draw of the global generator moves what the shuffle draws
    (pykeen's sLCWA loader, whose negatives are sampled from it too, trained otherwise)."""

    def run(pl):
        pl.seed_everything(3)

        class Shuffled(model_class(pl)):
            def train_dataloader(self):
                return DataLoader(Numbers(16), batch_size=4, shuffle=True)

            def training_step(self, batch, batch_idx):
                self.order.append(batch[:, 0].tolist())
                return self.layer(batch).pow(2).mean()

        model = Shuffled()
        model.order = []
        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=3,
                             limit_val_batches=0, logger=False, enable_checkpointing=False,
                             reload_dataloaders_every_n_epochs=1, **QUIET)
        trainer.fit(model)
        return model.order, [p.detach().clone() for p in model.parameters()]

    lightning, ours = both(run)
    assert ours[0] == lightning[0]  # every epoch's batches, in Lightning's order
    assert all(torch.equal(a, b) for a, b in zip(ours[1], lightning[1]))


def test_reloaded_validation_data_is_what_validation_reads(tmp_path):
    sizes = iter([8, 12, 16, 20, 24])

    class Growing(model_class(ptrain.lightning)):
        def val_dataloader(self):
            return DataLoader(Numbers(next(sizes)), batch_size=4)

    model = Growing()
    trainer = ptrain.lightning.Trainer(default_root_dir=tmp_path, max_epochs=3,
                                       num_sanity_val_steps=0, logger=False,
                                       enable_checkpointing=False,
                                       reload_dataloaders_every_n_epochs=1, **QUIET)
    trainer.fit(model)
    per_epoch = [sum(1 for s in model.seen if s[0] == "val" and s[3] == 4 * (e + 1))
                 for e in range(3)]
    assert per_epoch == [2, 3, 4]  # each epoch's validation read the loader asked for then


def test_check_val_every_n_epoch_none_counts_batches_across_epochs_as_lightning(tmp_path):
    def run(pl):
        model = model_class(pl)(n_train=12, batch_size=4)  # 3 batches per epoch
        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=4,
                             check_val_every_n_epoch=None, val_check_interval=5,
                             limit_val_batches=1, num_sanity_val_steps=0, logger=False,
                             enable_checkpointing=False, **QUIET)
        trainer.fit(model)
        return [seen[3] for seen in model.seen if seen[0] == "val"]

    lightning, ours = both(run)
    assert ours == lightning == [5, 10]
    with pytest.raises(ptrain.ConfigError, match="whole number of batches"):
        ptrain.lightning.Trainer(check_val_every_n_epoch=None, val_check_interval=0.5)


def test_the_training_shard_shuffles_as_in_lightning_unless_the_user_says_otherwise():
    # Lightning's inserted training sampler shuffles even a DataLoader that does not
    assert ptrain.lightning.Trainer(strategy="ddp", devices=2, **QUIET
                                    ).plugins["ddp"].train_shuffle == "always"
    assert ptrain.Trainer(strategy="ddp", devices=2).plugins["ddp"].train_shuffle == "loader"
    told = ptrain.lightning.Trainer(strategy="ddp", devices=2, **QUIET,
                                    plugin_options={"ddp": {"train_shuffle": "loader"}})
    assert told.plugins["ddp"].train_shuffle == "loader"
    assert told.config["plugins"]["ddp"]["train_shuffle"] == "loader"


def _set_up_device(trainer, world_size: int) -> None:
    """The ``lightning-reseed-each-stage`` callback's ``setup_device`` wrapper, driven as
    pluggy drives it, for a process of a ``world_size``-process job."""
    trainer.world_size = world_size
    wrapper = trainer.pm.get_plugin("lightning-reseed-each-stage").setup_device(trainer)
    next(wrapper)
    with pytest.raises(StopIteration):
        wrapper.send(torch.device("cpu"))


def test_each_stage_of_a_multi_process_job_is_seeded_again_as_in_lightning(monkeypatch):
    monkeypatch.delenv("PTRAIN_GLOBAL_SEED", raising=False)
    trainer = ptrain.lightning.Trainer(strategy="ddp", devices=2, **QUIET)
    torch.manual_seed(123)
    drawn = torch.rand(3)
    _set_up_device(trainer, 2)  # no seed_everything before: nothing changes, as in Lightning
    torch.manual_seed(123)
    torch.rand(3)
    untouched = torch.get_rng_state()
    _set_up_device(trainer, 2)
    assert torch.equal(torch.get_rng_state(), untouched)

    ptrain.seed_everything(7)
    after_seeding = torch.rand(3)
    torch.rand(5)  # the program draws (builds its model) after seeding
    _set_up_device(trainer, 2)
    assert torch.equal(torch.rand(3), after_seeding)  # back to the seed's first numbers
    assert not torch.equal(drawn, after_seeding)

    torch.rand(5)
    before = torch.get_rng_state()
    single = ptrain.lightning.Trainer(devices=1, **QUIET)
    _set_up_device(single, 1)  # Lightning's single-device strategy re-seeds not
    assert torch.equal(torch.get_rng_state(), before)


def test_ddp_on_one_device_is_seeded_again_as_lightnings_ddp_strategy(monkeypatch):
    """PyG's gin example runs ``DDPStrategy`` with as many devices as there are (one here):
    Lightning's strategy seeds again when it sets up, also for a single process, so the
    dropout masks of the run are drawn from the seed; ptrain re-seeded only several
    processes, and the run trained to other weights."""
    monkeypatch.delenv("PTRAIN_GLOBAL_SEED", raising=False)
    ptrain.seed_everything(7)
    after_seeding = torch.rand(3)
    torch.rand(5)  # the program builds its data and model after seeding
    for strategy in ("ddp", ptrain.lightning.strategies.DDPStrategy(accelerator="cpu")):
        trainer = ptrain.lightning.Trainer(strategy=strategy, devices=1, **QUIET)
        _set_up_device(trainer, 1)
        assert torch.equal(torch.rand(3), after_seeding)


def test_use_distributed_sampler_false_turns_the_strategys_sharding_off():
    trainer = ptrain.lightning.Trainer(strategy="ddp", devices=2, use_distributed_sampler=False,
                                       **QUIET)
    assert trainer.plugins["ddp"].distributed_sampler is False
    assert trainer.config["plugins"]["ddp"]["distributed_sampler"] is False
    assert ptrain.lightning.Trainer(strategy="ddp", devices=2, **QUIET
                                    ).plugins["ddp"].distributed_sampler is True


def test_sync_batchnorm_takes_part_as_torch_sync_batch_norm():
    from ptrain.lightning.plugins import TorchSyncBatchNorm

    trainer = ptrain.lightning.Trainer(sync_batchnorm=True, **QUIET)
    assert any(isinstance(p, TorchSyncBatchNorm) for p in trainer.plugins.values())
    assert not any(isinstance(p, TorchSyncBatchNorm)
                   for p in ptrain.lightning.Trainer(**QUIET).plugins.values())


@pytest.mark.parametrize("argument, value", [
    ("enable_checkpointing", True), ("logger", True), ("enable_progress_bar", True),
    ("enable_model_summary", True), ("num_sanity_val_steps", 1), ("fast_dev_run", 1),
    ("detect_anomaly", True), ("profiler", "simple"),
])
def test_barebones_refuses_what_it_turns_off_as_lightning(argument, value):
    import lightning.pytorch as lightning

    with pytest.raises(ValueError):
        lightning.Trainer(barebones=True, **{argument: value})
    with pytest.raises(ptrain.ConfigError, match=f"barebones=True, {argument}="):
        ptrain.lightning.Trainer(barebones=True, **{argument: value})


def test_barebones_turns_off_checkpoints_loggers_and_displays():
    trainer = ptrain.lightning.Trainer(barebones=True, accelerator="cpu")
    assert trainer.barebones and not trainer.loggers and trainer.num_sanity_val_steps == 0
    assert {"checkpoint", "progress-bar", "model-summary"}.isdisjoint(trainer.plugins)


def test_arguments_not_passed_come_from_pl_trainer_variables(monkeypatch):
    monkeypatch.setenv("PL_TRAINER_MAX_STEPS", "7")
    monkeypatch.setenv("PL_TRAINER_LOGGER", "False")
    monkeypatch.setenv("PL_TRAINER_DEFAULT_ROOT_DIR", "/tmp/somewhere")  # not a literal: text
    trainer = ptrain.lightning.Trainer(**QUIET)
    assert trainer.max_steps == 7 and trainer.logger is None
    assert trainer.default_root_dir == "/tmp/somewhere"
    passed = ptrain.lightning.Trainer(max_steps=3, logger=None, **QUIET)
    assert passed.max_steps == 3  # what is passed wins
    assert ptrain.lightning.Trainer(**QUIET).max_steps == 7


def test_devices_read_as_lightnings():
    def run(pl):
        return [(t.num_devices, t.device_ids, t.num_nodes) for t in (
            pl.Trainer(accelerator="cpu", logger=False),
            pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False),
            pl.Trainer(accelerator="cpu", devices=3, strategy="ddp_spawn", logger=False))]

    lightning, ours = both(run)
    assert ours == lightning


def test_the_native_trainer_keeps_its_run_folder_attributes(tmp_path):
    trainer = ptrain.Trainer(default_root_dir=str(tmp_path), max_epochs=1, accelerator="cpu",
                             callbacks=["no:progress-bar", "no:model-summary"])
    assert trainer.default_root_dir == trainer.run_root == str(tmp_path)
    assert trainer.log_dir is None and trainer.max_epochs == 1
    from conftest import TinyRegressor

    trainer.fit(TinyRegressor())
    assert trainer.log_dir == trainer.run_dir == Path(tmp_path) / "version_0"
    assert (trainer.stage_call, trainer.status) == ("fit", "finished")


# -- an optimizer whose parameters the loss never reaches --------------------------------------

def test_an_optimizer_over_parameters_the_loss_never_reaches_steps_with_a_warning(tmp_path):
    """Lightning steps it (its tutorials' SWA part does: the loss goes through an averaged
    copy); so does ptrain.lightning, saying once that its steps change nothing, where ptrain's
    own Trainer stops (tests/test_bad_inputs.py)."""

    def run(pl):
        base = model_class(pl)

        class Unreached(base):
            def __init__(self):
                super().__init__()
                self.head = torch.nn.Linear(2, 2)

            def configure_optimizers(self):
                return torch.optim.SGD(self.head.parameters(), lr=0.1)

        model = Unreached()
        head = model.head.weight.detach().clone()
        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=1,
                             logger=False, **QUIET)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(model)
        said = [str(w.message) for w in caught if "the loss does not use them" in str(w.message)]
        return trainer.global_step, torch.equal(model.head.weight, head), said

    (l_steps, l_same, _), (p_steps, p_same, p_said) = both(run)
    assert (p_steps, p_same) == (l_steps, l_same) and p_same and p_steps > 0
    assert len(p_said) == 1 and "optimizer 0 (SGD)" in p_said[0], p_said
    assert "its steps change nothing" in p_said[0]


def test_print_speaks_in_the_first_process_as_lightnings_does(tmp_path, capsys):
    def printed(pl):
        trainer = pl.Trainer(default_root_dir=str(tmp_path), **QUIET)
        capsys.readouterr()
        trainer.print("parameters:", 3, sep=" ", end="!\n")
        return capsys.readouterr().out

    lightning, ptrain_ = both(printed)
    assert ptrain_ == lightning == "parameters: 3!\n"


# -- hyperparameters ------------------------------------------------------------------------

def test_hparams_of_one_dictconfig_keep_its_nested_configs_as_lightnings_do():
    """``save_hyperparameters(cfg)`` with an OmegaConf ``DictConfig``: nested configs are read
    and written with dots (``self.hparams.head.dim = 3``, ``hparams.metrics[0].top_k``), as
    PyTorch Tabular's models do; in ptrain the checkpoint still holds plain values."""
    from omegaconf import OmegaConf

    def run(pl):
        class Configured(model_class(pl)):
            def __init__(self, config):
                super().__init__()
                self.save_hyperparameters(config)
                self.hparams.head.dim = 3

        config = OmegaConf.create({"lr": 0.1, "head": {"layers": "8"},
                                   "metrics": [{"top_k": 1}]})
        module = Configured(config)
        if pl is ptrain.lightning:  # what a checkpoint holds: plain values only
            from ptrain.hyperparameters import saved_form

            assert saved_form(dict(module.hparams)) == {
                "lr": 0.1, "head": {"layers": "8", "dim": 3}, "metrics": [{"top_k": 1}]}
        return (module.hparams.lr, module.hparams.head.layers, module.hparams.head.dim,
                module.hparams.metrics[0].top_k, config.head.dim)

    lightning, ours = both(run)
    assert ours == lightning == (0.1, "8", 3, 1, 3)


# -- copies -----------------------------------------------------------------------------------

def test_a_fitted_trainer_deep_copies_as_lightnings_does(tmp_path):
    """``copy.deepcopy(trainer)`` after ``fit`` (PyTorch Tabular's tuner keeps its best model
    so): the copy has its own callbacks with their state, and tests as the original."""
    import copy

    def run(pl):
        pl.seed_everything(0)
        model = model_class(pl)()
        trainer = pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=2,
                             logger=False, **QUIET)
        trainer.fit(model)
        twin = copy.deepcopy(trainer)
        assert twin.checkpoint_callback is not trainer.checkpoint_callback
        original = trainer.test(model, verbose=False)
        copied = twin.test(copy.deepcopy(model), verbose=False)
        return (twin.global_step, twin.current_epoch, twin.checkpoint_callback.best_model_path
                == trainer.checkpoint_callback.best_model_path, original == copied, copied)

    lightning, ours = both(run)
    assert ours == lightning


def test_a_trainer_made_from_a_config_filtered_by_its_signature_draws_as_lightnings(tmp_path):
    """PyTorch Tabular passes the entries of its trainer config that Trainer.__init__ names:
    its `seed` reached ptrain.lightning's extra `seed` argument, which seeded again when the
    trainer was made, so every shuffle differed from Lightning's run (whose Trainer takes none)."""
    import inspect

    def run(pl):
        pl.seed_everything(7)
        model = model_class(pl)()  # draws its initial weights
        config = {"seed": 7, "max_epochs": 1, "logger": False, "enable_checkpointing": False,
                  "default_root_dir": tmp_path / pl.__name__, **QUIET}
        names = inspect.signature(pl.Trainer.__init__).parameters
        pl.Trainer(**{k: v for k, v in config.items() if k in names})
        return torch.rand(4).tolist(), model.layer.weight.tolist()

    lightning, ours = both(run)
    assert ours == lightning
    lightning_names = set(inspect.signature(importlib.import_module(
        "lightning.pytorch").Trainer.__init__).parameters)
    assert set(inspect.signature(ptrain.lightning.Trainer.__init__).parameters) - \
        lightning_names == {"plugin_options"}


@pytest.mark.parametrize("options", [{}, {"strategy": "ddp", "devices": 2},
                                     {"use_distributed_sampler": False}])
def test_the_connector_integrations_read_answers_as_lightnings(options):
    # optuna's PyTorchLightningPruningCallback reads trainer._accelerator_connector.is_distributed
    # in on_fit_start: an AttributeError before
    def run(pl):
        connector = pl.Trainer(logger=False, **QUIET, **options)._accelerator_connector
        return connector.is_distributed, connector.use_distributed_sampler

    lightning, ours = both(run)
    assert ours == lightning


def _early_stopping_run(framework: str, monitor: str, **trainer_args) -> dict:
    """Fits a module that logs ``train_loss`` (``on_epoch=True`` in ``training_step``),
    ``val_loss`` and ``epoch_metric`` (in ``on_train_epoch_end``) and never improves, with a
    patience-2 ``EarlyStopping`` on ``monitor`` and a callback recording what the stopper says
    where a program reads it; returns the record and where the run stopped."""
    pl = importlib.import_module(framework)
    callbacks = importlib.import_module(framework + ".callbacks")
    seen: list = []

    class Model(model_class(pl)):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("train_loss", loss.detach() * 0 + 1, on_epoch=True, on_step=False)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", 1.0)

        def on_train_epoch_end(self):
            self.log("epoch_metric", 1.0)
            seen.append(("module on_train_epoch_end", stopper.wait_count))

    class Watch(pl.Callback):
        def on_validation_end(self, trainer, module):
            if not trainer.sanity_checking:
                seen.append(("on_validation_end", stopper.wait_count, trainer.should_stop))

        def on_train_epoch_end(self, trainer, module):
            seen.append(("on_train_epoch_end", stopper.wait_count, trainer.should_stop))

    stopper = callbacks.EarlyStopping(monitor=monitor, patience=2)
    loader = DataLoader(Numbers(8), batch_size=4)
    trainer = pl.Trainer(max_epochs=6, callbacks=[stopper, Watch()], logger=False,
                         enable_checkpointing=False, **QUIET, **trainer_args)
    trainer.fit(Model(), loader, loader)
    return {"seen": seen, "stopped_epoch": stopper.stopped_epoch,
            "epochs": trainer.current_epoch}


@pytest.mark.parametrize("monitor, trainer_args", [
    ("val_loss", {}),
    ("train_loss", {}),  # an epoch value of training_step's: ready only at the epoch's end
    ("epoch_metric", {}),  # logged in the module's on_train_epoch_end
    # then it checks after each validation, after every callback's on_validation_end (in
    # Lightning, at its place in the list of callbacks: docs/from-lightning.md)
    ("val_loss", {"check_val_every_n_epoch": 2}),
    ("val_loss", {"val_check_interval": 1}),
], ids=["val_loss", "train_epoch_value", "logged_at_epoch_end", "every_2_epochs",
        "every_batch"])
def test_early_stopping_checks_where_lightnings_does(monitor, trainer_args):
    """With ``check_on_train_epoch_end=None`` Lightning's ``EarlyStopping`` checks at the end of
    each training epoch when the trainer validates once an epoch, after the module's and the
    other callbacks' ``on_train_epoch_end``: a metric logged there can be monitored, and a
    callback reading ``wait_count`` or ``should_stop`` in either hook sees the state before
    that epoch's check. ptrain had checked after each validation, so the first two stopped the
    run with "not logged" and the record differed by one hook."""
    runs = [_early_stopping_run(framework, monitor, **trainer_args)
            for framework in FRAMEWORKS]
    assert runs[0]["seen"], "the program recorded nothing"
    if "check_val_every_n_epoch" in trainer_args:
        for run in runs:
            run["seen"] = [entry for entry in run["seen"] if entry[0] != "on_validation_end"]
    assert runs[1] == runs[0]


def _warmed_up_early_stopping_run(framework: str, root: Path, check_on_train_epoch_end):
    """A program's own ``EarlyStopping`` subclass that skips the checks of the first three
    epochs by overriding Lightning's check methods and calling ``super()``, with a checkpoint
    each epoch; returns what it saw and what the checkpoints hold of it."""
    pl = importlib.import_module(framework)
    callbacks = importlib.import_module(framework + ".callbacks")
    calls: list = []

    class Model(model_class(pl)):
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", 1.0)

    class WarmedUp(callbacks.EarlyStopping):
        def on_validation_end(self, trainer, pl_module):
            calls.append(("on_validation_end", trainer.current_epoch, self.wait_count))
            if trainer.current_epoch >= 3:
                super().on_validation_end(trainer, pl_module)

        def on_train_epoch_end(self, trainer, pl_module):
            calls.append(("on_train_epoch_end", trainer.current_epoch, self.wait_count))
            if trainer.current_epoch >= 3:
                super().on_train_epoch_end(trainer, pl_module)

    stopper = WarmedUp(monitor="val_loss", patience=1,
                       check_on_train_epoch_end=check_on_train_epoch_end)
    saves = callbacks.ModelCheckpoint(dirpath=root, save_top_k=-1, filename="{epoch}")
    loader = DataLoader(Numbers(8), batch_size=4)
    trainer = pl.Trainer(max_epochs=8, callbacks=[stopper, saves], logger=False,
                         num_sanity_val_steps=0, **QUIET)
    trainer.fit(Model(), loader, loader)
    saved = {}
    for path in sorted(root.glob("epoch=*.ckpt")):
        state = torch.load(path, weights_only=False)["callbacks"][stopper.state_key]
        saved[path.name] = {key: state[key] for key in ("wait_count", "stopped_epoch",
                                                        "best_score", "patience",
                                                        "stopping_reason")}
    return {"calls": calls, "epochs": trainer.current_epoch, "key": stopper.state_key,
            "saved": saved, "state": {k: stopper.state_dict()[k] for k in
                                      ("wait_count", "stopped_epoch", "best_score",
                                       "patience")}}


@pytest.mark.parametrize("check_on_train_epoch_end", [None, False])
def test_a_programs_early_stopping_subclass_overrides_the_checks_as_in_lightning(
        tmp_path, check_on_train_epoch_end):
    """A common Lightning pattern: an ``EarlyStopping`` subclass whose ``on_validation_end`` or
    ``on_train_epoch_end`` calls ``super()`` only after some epochs. ptrain refused such a
    subclass (its checks were ptrain hooks); now each is called where Lightning calls it, and
    the state each checkpoint holds under ``["callbacks"][state_key]`` is Lightning's."""
    runs = [_warmed_up_early_stopping_run(framework, tmp_path / framework,
                                          check_on_train_epoch_end)
            for framework in FRAMEWORKS]
    assert runs[0]["saved"] and runs[0]["epochs"] < 8, "the oracle's run did not stop early"
    assert runs[1]["key"].endswith(".WarmedUp{'monitor': 'val_loss', 'mode': 'min'}")
    assert runs[1] == runs[0]


def test_early_stopping_takes_the_state_lightnings_gives():
    import lightning.pytorch.callbacks as lightning_callbacks
    from ptrain.lightning.callbacks import EarlyStopping
    from ptrain.lightning.callbacks.early_stopping import EarlyStoppingReason

    theirs = lightning_callbacks.EarlyStopping(monitor="val_loss", patience=4)
    theirs.wait_count, theirs.best_score, theirs.stopped_epoch = 2, torch.tensor(0.5), 5
    ours = EarlyStopping(monitor="val_loss", patience=4)
    ours.load_state_dict(theirs.state_dict())
    assert (ours.wait_count, ours.best, ours.stopped_epoch) == (2, 0.5, 5)
    assert ours.stopping_reason is EarlyStoppingReason.NOT_STOPPED
    assert ours.state_key == theirs.state_key
    # an older Lightning's state: without the reason's keys
    older = {"wait_count": 1, "stopped_epoch": 0, "best_score": torch.tensor(0.25),
             "patience": 4}
    ours.load_state_dict(older)
    assert (ours.wait_count, ours.best, ours.stopped_epoch) == (1, 0.25, 0)
@pytest.mark.parametrize("accelerator, devices", [("auto", "auto"), ("cpu", "auto"), ("cpu", 1),
                                                  ("auto", 1), ("cpu", 2), ("cpu", "2")])
def test_the_private_accelerator_connector_resolves_as_lightnings(accelerator, devices):
    # scvi-tools' parse_device_args resolves train(accelerator=, devices=) with Lightning's
    # private _AcceleratorConnector before it makes a Trainer (importing scvi failed: no module)
    def resolve(pl):
        module = importlib.import_module(
            f"{pl.__name__}.trainer.connectors.accelerator_connector")
        connector = module._AcceleratorConnector(accelerator=accelerator, devices=devices)
        return connector._accelerator_flag, connector._devices_flag

    lightning, ours = both(resolve)
    assert ours == lightning


def test_the_private_accelerator_connector_refuses_what_lightnings_refuses():
    from ptrain.lightning.trainer.connectors.accelerator_connector import _AcceleratorConnector

    with pytest.raises(TypeError, match="should be an int > 0"):
        _AcceleratorConnector(accelerator="cpu", devices=-1)
    if not torch.cuda.is_available() and not torch.backends.mps.is_available():
        with pytest.raises(ptrain.ConfigError, match="'cuda' can't run on this machine"):
            _AcceleratorConnector(accelerator="gpu")
    with pytest.raises(ptrain.ConfigError, match="accelerator and devices only; precision, "
                                                 "strategy would not be read"):
        _AcceleratorConnector(accelerator="cpu", strategy="ddp", precision="bf16-mixed")


@pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs an Apple GPU (mps)")
def test_gpu_means_mps_where_apple_gpus_are_as_in_lightning():
    def resolve(pl):
        module = importlib.import_module(
            f"{pl.__name__}.trainer.connectors.accelerator_connector")
        trainer = pl.Trainer(accelerator="gpu", devices=1, logger=False)
        return (module._AcceleratorConnector(accelerator="gpu")._accelerator_flag,
                type(trainer.accelerator).__name__)

    lightning, ours = both(resolve)
    assert ours == lightning == ("mps", "MPSAccelerator")


def test_each_strategy_imports_from_the_module_lightning_defines_it_in():
    # scvi-tools: from lightning.pytorch.strategies.ddp import DDPStrategy
    import ptrain.lightning.strategies as strategies

    for module, name in (("ddp", "DDPStrategy"), ("fsdp", "FSDPStrategy"),
                         ("deepspeed", "DeepSpeedStrategy"),
                         ("model_parallel", "ModelParallelStrategy"),
                         ("single_device", "SingleDeviceStrategy"),
                         ("parallel", "ParallelStrategy"), ("strategy", "Strategy")):
        importlib.import_module(f"lightning.pytorch.strategies.{module}")  # Lightning's paths
        ours = importlib.import_module(f"ptrain.lightning.strategies.{module}")
        assert getattr(ours, name) is getattr(strategies, name)


class _SwappableLoader(DataLoader):
    """A loader whose ``__iter__`` reads the rows it holds when the iterator is made, and whose
    rows a callback may replace (scvi-tools' semi-supervised loader swaps its labelled part in
    ``on_train_epoch_start``)."""

    def __init__(self, rows):
        super().__init__(rows, batch_size=4, shuffle=True)
        self.rows = rows

    def __iter__(self):
        return zip(DataLoader(self.rows, batch_size=4, shuffle=True), range(len(self)))


@pytest.mark.parametrize("sanity", [0, 2])
def test_the_first_epochs_training_iterator_is_made_before_the_training_hooks(sanity, tmp_path):
    # Lightning makes the first epoch's iterator before on_train_start: a callback drawing
    # random numbers in on_train_epoch_start leaves epoch 0's shuffle alone, and one swapping
    # the loader's rows there changes what epochs 1, 2, ... read, not epoch 0
    def run(pl):
        class Model(model_class(pl)):
            def training_step(self, batch, batch_idx):
                rows, _ = batch
                self.seen.append((self.current_epoch, rows.sum().item()))
                return self.layer(rows).pow(2).mean()

            def train_dataloader(self):
                self.loader = _SwappableLoader(Numbers(16).rows)
                return self.loader

        class Swap(pl.Callback):
            def on_train_epoch_start(self, trainer, pl_module):
                torch.rand(3)
                pl_module.loader.rows = Numbers(16, seed=trainer.current_epoch + 5).rows

        pl.seed_everything(0)
        model = Model()
        pl.Trainer(default_root_dir=str(tmp_path / pl.__name__), max_epochs=3, logger=False,
                   enable_checkpointing=False, num_sanity_val_steps=sanity, callbacks=[Swap()],
                   **QUIET).fit(model)
        return model.seen, [p.detach().clone() for p in model.parameters()]

    (lightning_seen, lightning_weights), (seen, weights) = both(run)
    assert seen == lightning_seen
    assert all(torch.equal(a, b) for a, b in zip(weights, lightning_weights))


@pytest.mark.slow
def test_a_spawned_workers_callback_finds_the_run_folder_as_in_lightning(tmp_path):
    """Under ``ddp_spawn`` a callback's ``setup`` read ``trainer.log_dir`` as the next free
    ``version_N`` (version_1: the launcher had taken version_0, the run's), so LightningCLI's
    SaveConfigCallback wrote config.yaml into a folder of its own."""
    import json
    import subprocess
    import sys

    from tests._subprocess_jobs import communicate_or_kill, launcher_free_env

    seen = {}
    for framework in FRAMEWORKS:
        root = tmp_path / framework
        root.mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests._lightning_spawn_log_dir_script", framework,
             str(root)], cwd=Path(__file__).resolve().parent.parent, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            env=launcher_free_env(PYTHONWARNINGS="ignore"))
        result = communicate_or_kill(proc, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        seen[framework] = (json.loads((root / "seen.json").read_text()),
                           json.loads((root / "listing.json").read_text()))
    lightning, ours = seen.values()
    assert lightning[1] == ["version_0"]
    assert ours == lightning
