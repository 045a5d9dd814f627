"""``ptrain.lightning.callbacks`` and ``ptrain.lightning.loggers`` beyond their smoke uses
(tests/lightning_names): each trains for real and is compared with Lightning 2.6.6 (installed
as the oracle) running the same program, where that is the natural check."""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

pl = pytest.importorskip("lightning.pytorch", reason="the oracle: pip install lightning==2.6.6")

import lightning.pytorch.callbacks as l_callbacks  # noqa: E402
import lightning.pytorch.loggers as l_loggers  # noqa: E402
import lightning.pytorch.loggers.logger as l_logger  # noqa: E402

import ptrain  # noqa: E402
import ptrain.lightning as ppl  # noqa: E402
import ptrain.lightning.callbacks as p_callbacks  # noqa: E402
import ptrain.lightning.loggers as p_loggers  # noqa: E402
import ptrain.lightning.loggers.logger as p_logger  # noqa: E402
from ptrain.builtins.checkpoint import ModelCheckpoint as BuiltinCheckpoint  # noqa: E402
from ptrain.lightning.utilities import rank_zero_only  # noqa: E402

QUIET = dict(enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")


def model_class(framework, hparams: bool = True, example: bool = False):
    """A small regression module of ``framework`` (``pl`` or ``ppl``): 8 samples of 3 features
    in batches of 2, a validation set of 4, SGD; built from the same seed it has the same
    weights under both."""

    class Regressor(framework.LightningModule):
        def __init__(self, lr: float = 0.1, width: int = 4):
            super().__init__()
            if hparams:
                self.save_hyperparameters()
            self.lr = lr
            self.net = nn.Sequential(nn.Linear(3, width), nn.Tanh(), nn.Linear(width, 1))
            if example:
                self.example_input_array = torch.zeros(2, 3)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

        def train_dataloader(self):
            return _loader(8, seed=0)

        def val_dataloader(self):
            return _loader(4, seed=1)

    return Regressor


def _loader(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=2)


def fit(framework, model, root: Path, **options):
    trainer = framework.Trainer(default_root_dir=str(root), num_sanity_val_steps=0,
                                **{**QUIET, **options})
    trainer.fit(model)
    return trainer


# -- a user's Logger subclass -------------------------------------------------------------------


def recording_logger(base, rank_zero_experiment):
    """A logger class written as Lightning's docs show, on ``base`` (either ``Logger``): it
    records every call it receives."""

    class Recording(base):
        def __init__(self):
            super().__init__()
            self.calls = []

        @property
        def name(self):
            return "recording"

        @property
        def version(self):
            return "0"

        @property
        @rank_zero_experiment
        def experiment(self):
            return self.calls

        def log_hyperparams(self, params, *args, **kwargs):
            self.calls.append(("log_hyperparams", dict(params)))

        def log_metrics(self, metrics, step=None):
            self.calls.append(("log_metrics", dict(metrics), step))

        def after_save_checkpoint(self, checkpoint_callback):
            self.calls.append(("after_save_checkpoint", checkpoint_callback))

        def finalize(self, status):
            self.calls.append(("finalize", status))

    return Recording


def _run_recording(framework, base, experiment, root):
    framework.seed_everything(3)
    logger = recording_logger(base, experiment)()
    fit(framework, model_class(framework)(), root, logger=logger, max_epochs=2,
        log_every_n_steps=2)
    return logger.calls


def test_a_users_logger_receives_what_lightning_gives_it(tmp_path):
    theirs = _run_recording(pl, l_loggers.Logger, l_logger.rank_zero_experiment,
                            tmp_path / "lightning")
    ours = _run_recording(ppl, p_loggers.Logger, p_logger.rank_zero_experiment,
                          tmp_path / "ptrain")

    def kind(calls, name):
        return [c for c in calls if c[0] == name]

    assert kind(ours, "log_hyperparams") == kind(theirs, "log_hyperparams") == [
        ("log_hyperparams", {"lr": 0.1, "width": 4})]
    assert kind(ours, "finalize") == kind(theirs, "finalize") == [("finalize", "success")]
    our_metrics, their_metrics = kind(ours, "log_metrics"), kind(theirs, "log_metrics")
    assert [sorted(c[1]) for c in our_metrics] == [sorted(c[1]) for c in their_metrics]
    assert [c[2] for c in our_metrics] == [c[2] + 1 for c in their_metrics]  # documented
    for (_, mine, _), (_, lightning, _) in zip(our_metrics, their_metrics):
        assert mine == pytest.approx(lightning, rel=1e-5)
    saved = kind(ours, "after_save_checkpoint")
    assert saved and all(isinstance(c[1], p_callbacks.Checkpoint) for c in saved)
    assert kind(ours, "log_hyperparams")[0] is ours[0]  # first, as in Lightning


@pytest.mark.parametrize("interval", ["epoch", "step"])
def test_a_users_logger_gets_the_learning_rates_without_an_epoch_as_lightnings(tmp_path,
                                                                               interval):
    # Lightning adds `epoch` to what self.log publishes, not to LearningRateMonitor's rows;
    # scvi-tools' logger keys each row by `epoch` when it is there, else by `step`
    def rows(framework, callbacks, base, experiment):
        framework.seed_everything(3)
        logger = recording_logger(base, experiment)()
        fit(framework, model_class(framework)(), tmp_path / framework.__name__, logger=logger,
            max_epochs=2, log_every_n_steps=2,
            callbacks=[callbacks.LearningRateMonitor(logging_interval=interval)])
        return [sorted(c[1]) for c in logger.calls
                if c[0] == "log_metrics" and "lr-SGD" in c[1]]

    theirs = rows(pl, l_callbacks, l_loggers.Logger, l_logger.rank_zero_experiment)
    ours = rows(ppl, p_callbacks, p_loggers.Logger, p_logger.rank_zero_experiment)
    assert ours == theirs and theirs and ["lr-SGD"] in theirs


@pytest.mark.parametrize("logger", [None, False], ids=["default", "off"])
def test_fast_dev_run_gives_the_module_a_logger_that_records_nothing_as_lightning_does(
        tmp_path, logger):
    """Lightning's fast_dev_run stands a DummyLogger in for the loggers it turns off: code that
    writes through self.logger runs and records nothing (none without a logger at all)."""
    seen = []
    for framework in (pl, ppl):
        class Writes(model_class(framework)):
            def training_step(self, batch, batch_idx):
                if self.logger is not None:
                    self.logger.experiment.add_scalar("custom", 1.0, self.global_step)
                    self.logger.log_hyperparams({"a": 1})
                return super().training_step(batch, batch_idx)

        root = tmp_path / framework.__name__
        trainer = framework.Trainer(max_epochs=1, fast_dev_run=2, logger=logger,
                                    default_root_dir=str(root), **QUIET)
        trainer.fit(Writes())
        seen.append((type(trainer.logger).__name__, len(trainer.loggers),
                     trainer.logger and trainer.logger.log_dir, trainer.log_dir is None,
                     sorted(p.name for p in root.rglob("*")) if root.exists() else []))
    assert seen[1] == seen[0]


def test_a_users_logger_is_finalized_as_failed_after_an_error(tmp_path):
    class Failing(model_class(ppl)):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("broken step")

    logger = recording_logger(p_loggers.Logger, p_logger.rank_zero_experiment)()
    with pytest.raises(RuntimeError, match="broken step"):
        fit(ppl, Failing(), tmp_path, logger=logger, max_epochs=1)
    assert logger.calls[-1] == ("finalize", "failed")


def test_a_users_logger_answers_its_own_calls_unchanged_and_its_experiment_by_rank():
    logger = recording_logger(p_loggers.Logger, p_logger.rank_zero_experiment)()
    logger.log_metrics({"a": 1.0})
    logger.log_metrics({"b": 2.0}, step=5)
    logger.log_hyperparams({"x": 1})
    assert logger.calls == [("log_metrics", {"a": 1.0}, None), ("log_metrics", {"b": 2.0}, 5),
                            ("log_hyperparams", {"x": 1})]
    assert logger.experiment is logger.calls
    saved = rank_zero_only.rank
    try:
        rank_zero_only.rank = 1
        stand_in = logger.experiment
        assert stand_in is not logger.calls and stand_in.anything(1, key=2) is None
    finally:
        rank_zero_only.rank = saved
    with pytest.raises(TypeError):  # abstract, as Lightning's
        p_loggers.Logger()


def test_two_loggers_of_lightnings_default_name_log_side_by_side(tmp_path):
    tb = p_loggers.TensorBoardLogger(tmp_path)
    csv = p_loggers.CSVLogger(tmp_path)
    assert tb.name == csv.name == "lightning_logs"
    trainer = fit(ppl, model_class(ppl)(), tmp_path, logger=[tb, csv], max_epochs=1)
    assert {"tensorboard", "csv"} <= set(trainer.plugins)
    assert trainer.loggers == [tb, csv] and trainer.logger is tb
    assert tb.log_dir == csv.log_dir == str(tmp_path / "lightning_logs" / "version_0")
    assert tb.version == csv.version == 0


# -- TensorBoardLogger ---------------------------------------------------------------------------


def _events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _session_hparams(acc) -> dict:
    from tensorboard.plugins.hparams import metadata

    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(
        content[metadata.SESSION_START_INFO_TAG])
    return {name: getattr(value, value.WhichOneof("kind"))
            for name, value in start.hparams.items()}


def test_tensorboard_logger_takes_lightnings_method_signatures(tmp_path):
    logger = p_loggers.TensorBoardLogger(tmp_path, name="exp")
    logger.log_hyperparams({"batch": 2})  # before the run: written when its folder is chosen
    logger.log_metrics({"before": 1.5}, step=0)
    logger.experiment.add_text("note", "made before the run")
    fit(ppl, model_class(ppl)(), tmp_path, logger=logger, max_epochs=1)
    logger.log_metrics({"after": torch.tensor(2.5)}, step=7)
    logger.log_hyperparams(argparse.Namespace(extra="x"), metrics={"hp": 0.5})
    logger.save()
    assert logger.hparams == {"batch": 2, "lr": 0.1, "width": 4, "extra": "x"}
    acc = _events(logger.log_dir)
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert scalars["before"] == [(0, 1.5)] and scalars["after"] == [(7, 2.5)]
    assert scalars["hp"] == [(0, 0.5)]
    published = {s for name in ("train_loss", "val_loss") for s, _ in scalars[name]}
    assert {step for step, _ in scalars["epoch"]} == published  # as Lightning adds it
    assert "note/text_summary" in acc.Tags()["tensors"]
    assert _session_hparams(acc) == {"batch": 2, "lr": 0.1, "width": 4}


@pytest.mark.parametrize("how", ["argument", "attribute"])
def test_tensorboard_log_graph_adds_the_modules_graph(tmp_path, how):
    logger = p_loggers.TensorBoardLogger(tmp_path, log_graph=how == "argument")
    trainer = ppl.Trainer(default_root_dir=str(tmp_path), logger=logger, max_epochs=1,
                          num_sanity_val_steps=0, **QUIET)
    if how == "attribute":  # the issue: setting it on trainer.logger did nothing
        trainer.logger._log_graph = True
    trainer.fit(model_class(ppl, example=True)())
    graph = _events(logger.log_dir).Graph()
    assert any("Linear" in node.name or "linear" in node.op for node in graph.node)


def test_tensorboard_log_graph_without_an_input_warns_as_lightning_does(tmp_path):
    logger = p_loggers.TensorBoardLogger(tmp_path, log_graph=True)
    with pytest.warns(UserWarning, match="example_input_array"):
        fit(ppl, model_class(ppl)(), tmp_path, logger=logger, max_epochs=1)
    assert not _events(logger.log_dir).Tags()["graph"]


def test_tensorboard_logger_refuses_what_it_cannot_do(tmp_path):
    with pytest.raises(ptrain.ConfigError, match="sub_dir"):
        p_loggers.TensorBoardLogger(tmp_path, sub_dir="x")
    for version in ("", "a/b", 1.5, True):  # what names no one folder under save_dir/name
        with pytest.raises(ptrain.ConfigError, match="version"):
            p_loggers.TensorBoardLogger(tmp_path, version=version)


# -- CSVLogger ----------------------------------------------------------------------------------


def _csv_rows(path):
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_csv_logger_writes_lightnings_columns_and_values(tmp_path):
    runs = {}
    for framework, loggers in ((pl, l_loggers), (ppl, p_loggers)):
        framework.seed_everything(3)
        logger = loggers.CSVLogger(tmp_path / framework.__name__)
        fit(framework, model_class(framework)(), tmp_path, logger=logger, max_epochs=2,
            log_every_n_steps=2)
        runs[framework.__name__] = _csv_rows(Path(logger.log_dir) / "metrics.csv")
    ours, theirs = runs["ptrain.lightning"], runs["lightning.pytorch"]
    assert set(ours[0]) == set(theirs[0]) == {"epoch", "step", "train_loss", "val_loss"}

    def column(rows, name):
        return [(int(r["epoch"]), float(r[name])) for r in rows if r[name]]

    for name in ("train_loss", "val_loss"):
        assert [e for e, _ in column(ours, name)] == [e for e, _ in column(theirs, name)]
        assert [v for _, v in column(ours, name)] == pytest.approx(
            [v for _, v in column(theirs, name)], rel=1e-5)


def test_csv_logger_takes_lightnings_method_signatures(tmp_path):
    import tomllib

    logger = p_loggers.CSVLogger(tmp_path)
    logger.log_hyperparams({"given": "early"})  # before the run: written when it starts
    logger.log_metrics({"before": 1.0})
    fit(ppl, model_class(ppl)(), tmp_path, logger=logger, max_epochs=1)
    logger.log_hyperparams(argparse.Namespace(later=3))
    logger.log_metrics({"after": torch.tensor(4.0)}, step=9)
    logger.save()
    hparams = tomllib.loads((Path(logger.log_dir) / "hparams.toml").read_text())
    assert hparams == {"given": "early", "lr": 0.1, "width": 4, "later": 3}
    rows = _csv_rows(Path(logger.log_dir) / "metrics.csv")
    assert [(r["step"], r["before"]) for r in rows if r["before"]] == [("0", "1.0")]
    assert [(r["step"], r["after"]) for r in rows if r["after"]] == [("9", "4.0")]
    assert logger.experiment.metrics_file_path == str(Path(logger.log_dir) / "metrics.csv")


# -- the other loggers ---------------------------------------------------------------------------


def test_mlflow_logger_takes_lightnings_method_signatures(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps it behind this
    logger = p_loggers.MLFlowLogger(save_dir=str(tmp_path / "mlruns"))
    logger.log_hyperparams({"given": "early"})
    fit(ppl, model_class(ppl)(), tmp_path, logger=logger, max_epochs=1)
    logger.log_metrics({"after": 2.0}, step=5)
    run = logger.experiment.get_run(logger.run_id)
    assert run.data.params == {"given": "early", "lr": "0.1", "width": "4"}
    assert run.data.metrics["after"] == 2.0 and "train_loss" in run.data.metrics
    assert logger.version == logger.run_id and logger.name == run.info.experiment_id


def test_loggers_ptrain_has_no_plugin_for_are_refused_when_made():
    for cls in (p_loggers.CometLogger, p_loggers.LitLogger):
        with pytest.raises(ptrain.ConfigError, match=f"{cls.__name__} is not supported"):
            cls(api_key="x")


def test_the_deeper_logger_module_has_lightnings_names(tmp_path):
    from lightning_names import public_names

    assert set(public_names("loggers.logger")) <= set(dir(p_logger))
    dicts = [{"a": 1.7, "b": 2.0, "c": 1, "d": {"d1": 1, "d3": 3}},
             {"a": 1.1, "b": 2.2, "v": 1, "d": {"d1": 2, "d2": 3}},
             {"a": 1.1, "v": 2.3, "d": {"d3": 3, "d4": {"d5": 1}}}]
    functions = {"a": statistics.mean, "v": max, "d": {"d1": sum}}
    assert p_logger.merge_dicts(dicts, functions, min) == \
        l_logger.merge_dicts(dicts, functions, min)
    dummy = p_logger.DummyLogger()
    assert dummy.anything(1) is None and dummy[0] is dummy and dummy.experiment.x() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer = ppl.Trainer(logger=dummy, max_epochs=1, default_root_dir=str(tmp_path), **QUIET)
    assert trainer.loggers == [dummy]


# -- callbacks ------------------------------------------------------------------------------------

CALLBACKS = {pl: l_callbacks, ppl: p_callbacks}


def backbone_class(framework, batches: int = 10):
    """A module with a ``backbone`` and a ``head``, trained by SGD with momentum over the
    trainable parameters only (as Lightning's finetuning docs ask)."""

    class WithBackbone(framework.LightningModule):
        def __init__(self):
            super().__init__()
            self.backbone = nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.Tanh())
            self.head = nn.Linear(6, 1)

        def forward(self, x):
            return self.head(self.backbone(x))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()),
                                   lr=0.05, momentum=0.9)

        def train_dataloader(self):
            return _loader(2 * batches, seed=0)

        def val_dataloader(self):
            return _loader(4, seed=1)

    return WithBackbone


def fit_weights(framework, make_callbacks, root, epochs=3, **options):
    framework.seed_everything(1)
    model = backbone_class(framework)()
    options = {"logger": False, "enable_checkpointing": False, **QUIET, **options}
    trainer = framework.Trainer(max_epochs=epochs, num_sanity_val_steps=0,
                                default_root_dir=str(root),
                                callbacks=make_callbacks(CALLBACKS[framework]), **options)
    trainer.fit(model)
    return model.state_dict(), trainer


def assert_same_weights(ours, theirs):
    assert set(ours) == set(theirs)
    for name in theirs:
        assert torch.equal(ours[name], theirs[name]), name


@pytest.mark.parametrize("scheduling", [{0: 2, 1: 4}, {1: 2}])
def test_gradient_accumulation_scheduler_trains_lightnings_weights(tmp_path, scheduling):
    theirs, _ = fit_weights(pl, lambda c: [c.GradientAccumulationScheduler(scheduling)],
                            tmp_path / "l")
    ours, trainer = fit_weights(ppl, lambda c: [c.GradientAccumulationScheduler(scheduling)],
                                tmp_path / "p")
    assert_same_weights(ours, theirs)  # powers of two: to the bit
    expected = sum(-(-10 // scheduling.get(max(k for k in [0, *scheduling] if k <= e), 1))
                   for e in range(3))
    assert trainer.global_step == expected
    assert trainer.accumulate_grad_batches == 1  # the Trainer's own again after fit


def test_gradient_accumulation_scheduler_refuses_a_second_setting(tmp_path):
    with pytest.raises(ptrain.ConfigError, match="accumulate_grad_batches"):
        fit_weights(ppl, lambda c: [c.GradientAccumulationScheduler({0: 2})], tmp_path,
                    accumulate_grad_batches=2)
    with pytest.raises(ptrain.ConfigError, match="epoch"):
        p_callbacks.GradientAccumulationScheduler({-1: 2})


def test_backbone_finetuning_trains_lightnings_weights(tmp_path):
    def make(c):
        return [c.BackboneFinetuning(unfreeze_backbone_at_epoch=1, backbone_initial_ratio_lr=0.5,
                                     lambda_func=lambda epoch: 1.5)]

    theirs, their_trainer = fit_weights(pl, make, tmp_path / "l")
    ours, trainer = fit_weights(ppl, make, tmp_path / "p")
    assert_same_weights(ours, theirs)
    assert [g["lr"] for g in trainer.optimizers[0].param_groups] == \
        [g["lr"] for g in their_trainer.optimizers[0].param_groups]


def test_a_users_base_finetuning_trains_lightnings_weights(tmp_path):
    def make(c):
        class FreezeUnfreeze(c.BaseFinetuning):  # as Lightning's docs write it
            def __init__(self, unfreeze_at_epoch=1):
                super().__init__()
                self._unfreeze_at_epoch = unfreeze_at_epoch
                self.epochs_seen = []

            def freeze_before_training(self, pl_module):
                self.freeze(pl_module.backbone, train_bn=False)

            def finetune_function(self, pl_module, current_epoch, optimizer):
                if current_epoch == self._unfreeze_at_epoch:
                    self.unfreeze_and_add_param_group(pl_module.backbone, optimizer,
                                                      train_bn=True)

            def on_train_epoch_end(self, trainer, pl_module):  # a Lightning method of its own
                self.epochs_seen.append(trainer.current_epoch)

        return [FreezeUnfreeze()]

    theirs, _ = fit_weights(pl, make, tmp_path / "l")
    ours, trainer = fit_weights(ppl, make, tmp_path / "p")
    assert_same_weights(ours, theirs)
    (finetuning,) = [p for p in trainer.plugins.values() if type(p).__name__ == "FreezeUnfreeze"]
    assert finetuning.epochs_seen == [0, 1, 2]


def test_backbone_finetuning_resumes_exactly(tmp_path):
    def make(c):
        return [c.BackboneFinetuning(unfreeze_backbone_at_epoch=1)]

    whole, _ = fit_weights(ppl, make, tmp_path / "whole", epochs=3)
    fit_weights(ppl, make, tmp_path / "parts", epochs=2, enable_checkpointing=True)
    ppl.seed_everything(1)
    model = backbone_class(ppl)()
    trainer = ppl.Trainer(max_epochs=3, logger=False, num_sanity_val_steps=0,
                          default_root_dir=str(tmp_path / "parts"), callbacks=make(p_callbacks),
                          **QUIET)
    trainer.fit(model, ckpt_path="last")  # the backbone's param group comes back first
    assert_same_weights(model.state_dict(), whole)


@pytest.mark.parametrize("name, options", [("EMAWeightAveraging", {"decay": 0.9}),
                                           ("WeightAveraging", {})])
def test_weight_averaging_trains_and_validates_as_lightning(tmp_path, name, options):
    runs = {}
    for framework in (pl, ppl):
        weights, trainer = fit_weights(
            framework, lambda c: [getattr(c, name)(**options)], tmp_path / framework.__name__)
        runs[framework] = weights, float(trainer.callback_metrics["val_loss"])
    assert_same_weights(runs[ppl][0], runs[pl][0])  # the module holds the average after fit
    assert runs[ppl][1] == pytest.approx(runs[pl][1], rel=1e-6)  # validated on the average


def test_lambda_callback_is_called_where_lightning_calls_it(tmp_path):
    def make(calls):
        def record(name):
            return lambda trainer, *args: calls.append((name, trainer.current_epoch))

        return lambda c: [c.LambdaCallback(
            on_fit_start=record("fit_start"), on_train_epoch_start=record("epoch_start"),
            on_validation_epoch_end=record("val_end"), on_fit_end=record("fit_end")),
            c.LambdaCallback(on_train_start=record("train_start"))]

    theirs, ours = [], []
    fit_weights(pl, make(theirs), tmp_path / "l", epochs=2)
    fit_weights(ppl, make(ours), tmp_path / "p", epochs=2)
    assert ours == theirs


@pytest.mark.parametrize("private", [False, True], ids=["public-hook", "private-hook"])
def test_a_callback_with_ptrain_hooks_too_runs_its_lightning_methods(tmp_path, private):
    """A user's ``Callback`` subclass that also marks a ptrain hook is registered as a plugin;
    its Lightning-named methods still run where Lightning runs them. A hook marked only on a
    private method (``specname``) counts too: it was adapted as a Lightning callback, and its
    ptrain hook silently never ran."""
    def make(calls):
        def factory(c):
            class Both(c.Callback):
                def on_fit_start(self, trainer, pl_module):
                    calls.append(("fit_start", trainer.global_step))

                def on_train_epoch_end(self, trainer, pl_module):
                    calls.append(("epoch_end", trainer.global_step))

            def on_train_step_end(self, trainer, batch_idx):  # Lightning never calls it
                steps.append(batch_idx)

            if private:
                Both._step = ptrain.hookimpl(specname="on_train_step_end")(on_train_step_end)
            else:
                Both.on_train_step_end = ptrain.hookimpl(on_train_step_end)
            return [Both()]
        return factory

    steps, theirs, ours = [], [], []
    fit_weights(pl, make(theirs), tmp_path / "l", epochs=2)
    assert steps == []
    _, trainer = fit_weights(ppl, make(ours), tmp_path / "p", epochs=2)
    assert ours == theirs
    assert len(steps) == trainer.global_step and steps[0] == 0


def predictions_written(framework, root):
    class Writer(CALLBACKS[framework].BasePredictionWriter):
        def __init__(self):
            super().__init__(write_interval="batch_and_epoch")
            self.batches, self.epoch = [], None

        def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch,
                               batch_idx, dataloader_idx):
            self.batches.append((batch_idx, list(batch_indices), prediction.clone()))

        def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
            self.epoch = ([p.clone() for p in predictions], batch_indices)

    class Predicting(backbone_class(framework)):
        def predict_step(self, batch, batch_idx):
            return self(batch[0])

        def predict_dataloader(self):
            return _loader(6, seed=2)

    framework.seed_everything(1)
    writer = Writer()
    trainer = framework.Trainer(callbacks=[writer], logger=False, default_root_dir=str(root),
                                **QUIET)
    assert trainer.predict(Predicting(), return_predictions=False) is None
    return writer


def test_a_users_prediction_writer_writes_what_lightnings_does(tmp_path):
    theirs = predictions_written(pl, tmp_path / "l")
    ours = predictions_written(ppl, tmp_path / "p")
    assert [b[:2] for b in ours.batches] == [b[:2] for b in theirs.batches] == \
        [(0, [0, 1]), (1, [2, 3]), (2, [4, 5])]
    for mine, lightning in zip(ours.batches, theirs.batches):
        assert torch.equal(mine[2], lightning[2])
    assert ours.epoch[1] == theirs.epoch[1] == [[[0, 1], [2, 3], [4, 5]]]
    assert all(torch.equal(a, b) for a, b in zip(ours.epoch[0], theirs.epoch[0]))
    with pytest.raises(ptrain.ConfigError, match="write_interval"):
        p_callbacks.BasePredictionWriter("sometimes")


def test_timer_stops_training_and_times_the_stages(tmp_path):
    class Slow(backbone_class(ppl)):
        def training_step(self, batch, batch_idx):
            time.sleep(0.02)
            return super().training_step(batch, batch_idx)

    timer = p_callbacks.Timer(duration={"seconds": 0.5}, verbose=False)
    trainer = ppl.Trainer(max_epochs=1000, callbacks=[timer], logger=False, log_every_n_steps=1,
                          enable_checkpointing=False, default_root_dir=str(tmp_path), **QUIET)
    trainer.fit(Slow())
    assert 0.5 <= timer.time_elapsed("train") < 60 and trainer.current_epoch < 1000
    assert timer.time_remaining() <= 0 and timer.end_time("training") is not None
    assert timer.time_elapsed("validate") > 0 and trainer.max_time is None  # put back
    assert p_callbacks.Timer().state_dict()["time_elapsed"]["train"] == 0
    with pytest.raises(ptrain.ConfigError, match="DD:HH:MM:SS"):
        p_callbacks.Timer(duration="12 hours")


def test_spike_detection_finds_the_spike_lightning_finds(tmp_path):
    found = {}
    for framework in (pl, ppl):
        path = tmp_path / f"{framework.__name__}.json"

        class Spiking(backbone_class(framework)):
            def training_step(self, batch, batch_idx):
                loss = super().training_step(batch, batch_idx)
                return loss * 50 if self.global_step == 13 else loss

        framework.seed_everything(1)
        trainer = framework.Trainer(
            max_epochs=3, logger=False, enable_checkpointing=False, log_every_n_steps=4,
            default_root_dir=str(tmp_path),
            callbacks=[CALLBACKS[framework].SpikeDetection(exclude_batches_path=str(path))],
            **QUIET)
        with pytest.raises(Exception, match="Training spike detected in batch") as info:
            trainer.fit(Spiking())
        found[framework] = str(info.value), json.loads(path.read_text())
    assert found[ppl] == found[pl]


def test_on_exception_checkpoint_saves_a_failed_run_and_forgets_a_good_one(tmp_path):
    class Failing(backbone_class(ppl)):
        def training_step(self, batch, batch_idx):
            if self.global_step == 3:
                raise RuntimeError("broken at step 3")
            return super().training_step(batch, batch_idx)

    callback = p_callbacks.OnExceptionCheckpoint(tmp_path / "saved")
    assert isinstance(callback, p_callbacks.Checkpoint)
    trainer = ppl.Trainer(max_epochs=1, callbacks=[callback], logger=False,
                          default_root_dir=str(tmp_path), **QUIET)
    with pytest.raises(RuntimeError, match="broken at step 3"):
        trainer.fit(Failing())
    saved = torch.load(callback.ckpt_path, weights_only=True)
    assert saved["loop"]["global_step"] == 3
    ppl.Trainer(max_epochs=1, callbacks=[callback], logger=False, default_root_dir=str(tmp_path),
                **QUIET).fit(backbone_class(ppl)())
    assert not Path(callback.ckpt_path).exists()


def test_a_lightning_progress_bar_replaces_ptrains_and_shows_its_metrics(tmp_path, capsys):
    class Quieter(p_callbacks.TQDMProgressBar):
        def get_metrics(self, trainer, pl_module):
            shown = super().get_metrics(trainer, pl_module)
            shown.pop("v_num", None)
            return {**shown, "shown_by": 7}

    trainer = ppl.Trainer(max_epochs=1, callbacks=[Quieter()], logger=False,
                          enable_checkpointing=False, enable_model_summary=False,
                          default_root_dir=str(tmp_path), accelerator="cpu")
    trainer.fit(backbone_class(ppl)())
    assert isinstance(trainer.plugins["progress-bar"], Quieter)
    assert "shown_by=7" in capsys.readouterr().out

    class Counting(p_callbacks.ProgressBar):  # a display of one's own
        def __init__(self):
            super().__init__()
            self.batches = 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.batches += 1

    counting = Counting()
    trainer = ppl.Trainer(max_epochs=1, callbacks=[counting], logger=False,
                          enable_checkpointing=False, enable_model_summary=False,
                          default_root_dir=str(tmp_path), accelerator="cpu")
    trainer.fit(backbone_class(ppl)())
    assert counting.batches == 10 and trainer.plugins["progress-bar"] is counting
    assert "Epoch 0" not in capsys.readouterr().out  # ptrain's own bar is gone

    class Drawing(p_callbacks.RichProgressBar):
        def configure_columns(self, trainer):
            return []

    with pytest.raises(ptrain.ConfigError, match="configure_columns"):
        Drawing()
    with pytest.raises(ptrain.ConfigError, match="process_position"):
        p_callbacks.TQDMProgressBar(process_position=1)


def test_model_summary_takes_lightnings_depth(tmp_path, capsys):
    summary = p_callbacks.RichModelSummary(max_depth=2)
    trainer = ppl.Trainer(max_epochs=1, callbacks=[summary], logger=False,
                          enable_checkpointing=False, enable_progress_bar=False,
                          default_root_dir=str(tmp_path), accelerator="cpu")
    trainer.fit(backbone_class(ppl)())
    assert trainer.plugins["model-summary"] is summary and "backbone.1" in summary.text
    with pytest.raises(ptrain.ConfigError, match="mode"):
        p_callbacks.ModelSummary(mode="train")


@pytest.mark.parametrize("calls_super", [False, True])
@pytest.mark.parametrize("enable_model_summary", [None, False])
def test_a_model_summary_subclass_prints_its_own_in_on_fit_start(tmp_path, capfd, caplog,
                                                                 calls_super,
                                                                 enable_model_summary):
    """As yoyodyne's CompactModelSummary: a ModelSummary whose on_fit_start prints a table of
    its own (the base's table only through super()), given with enable_model_summary=False
    too. What each framework shows is compared (Lightning logs its table)."""
    shown = {}
    for name, framework, callbacks in (("lightning", pl, l_callbacks),
                                       ("ptrain", ppl, p_callbacks)):
        class Compact(callbacks.ModelSummary):
            def on_fit_start(self, trainer, pl_module):
                print(f"compact: {type(pl_module).__name__}")
                if calls_super:
                    super().on_fit_start(trainer, pl_module)

        summary = Compact()
        assert isinstance(summary, framework.Callback)
        trainer = framework.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0,
                                    callbacks=[summary], logger=False, enable_progress_bar=False,
                                    enable_checkpointing=False, accelerator="cpu",
                                    enable_model_summary=enable_model_summary,
                                    default_root_dir=str(tmp_path / name))
        capfd.readouterr()
        caplog.clear()
        with caplog.at_level("INFO"):
            trainer.fit(backbone_class(framework)())
        out, err = capfd.readouterr()
        shown[name] = out + err + caplog.text
    for text in shown.values():
        assert text.count("compact: WithBackbone") == 1
        assert text.count("Trainable params") == calls_super


def test_the_finders_search_then_tell_the_module(tmp_path):
    class Sized(backbone_class(ppl)):
        def __init__(self):
            super().__init__()
            self.batch_size, self.lr = 2, 0.05

    sizes = p_callbacks.BatchSizeFinder(max_trials=2)
    rates = p_callbacks.LearningRateFinder(num_training_steps=20)
    model = Sized()
    trainer = ppl.Trainer(max_epochs=1, callbacks=[sizes, rates], logger=False,
                          enable_checkpointing=False, default_root_dir=str(tmp_path), **QUIET)
    trainer.fit(model)
    assert sizes.optimal_batch_size == model.batch_size == 8  # 2 x 2**2
    assert model.lr == rates.optimal_lr.suggestion() == rates.suggestion
    assert len(rates.optimal_lr.results["lr"]) == len(rates.optimal_lr.results["loss"]) > 0
    with pytest.raises(ptrain.ConfigError, match="update_attr"):
        p_callbacks.LearningRateFinder(update_attr=False)


def test_a_resumed_fit_tells_the_module_what_its_checkpoints_finders_found(tmp_path):
    """The resumed run trains at the size and the learning rate the first run found, and the
    module's attributes say so (they kept the module's own: only a search set them)."""
    class Sized(backbone_class(ppl)):
        def __init__(self):
            super().__init__()
            self.batch_size, self.lr = 2, 0.05

    def fit(epochs, ckpt_path=None):
        model = Sized()
        sizes = p_callbacks.BatchSizeFinder(max_trials=2)
        rates = p_callbacks.LearningRateFinder(num_training_steps=20)
        trainer = ppl.Trainer(max_epochs=epochs, callbacks=[sizes, rates], logger=False,
                              default_root_dir=str(tmp_path), **QUIET)
        trainer.fit(model, ckpt_path=ckpt_path)
        return model, sizes, rates, trainer

    model, sizes, rates, first = fit(1)
    assert model.batch_size == sizes.optimal_batch_size == 8
    found = rates.optimal_lr.suggestion()
    assert model.lr == found != 0.05
    model, sizes, rates, _ = fit(2, ckpt_path=first.checkpoint_callback.best_model_path)
    assert model.batch_size == sizes.optimal_batch_size == 8
    assert model.lr == rates.optimal_lr.suggestion() == found


def test_throughput_and_device_stats_reach_the_loggers(tmp_path):
    logger = p_loggers.CSVLogger(tmp_path)
    monitor = p_callbacks.ThroughputMonitor(batch_size_fn=lambda batch: len(batch[0]))
    trainer = ppl.Trainer(max_epochs=1, callbacks=[monitor], logger=logger, log_every_n_steps=2,
                          default_root_dir=str(tmp_path), enable_checkpointing=False, **QUIET)
    with pytest.warns(UserWarning, match="flops_per_batch"):
        trainer.fit(backbone_class(ppl)())
    rows = _csv_rows(Path(logger.log_dir) / "metrics.csv")
    samples = [float(r["train/samples"]) for r in rows if r["train/samples"]]
    assert samples == [4.0, 8.0, 12.0, 16.0, 20.0]  # 2 samples a batch, every 2 steps
    assert all(float(r["train/samples_per_sec"]) > 0 for r in rows if r["train/samples"])
    assert any(r["validate/batches"] for r in rows)
    with pytest.raises(ptrain.ConfigError, match="logger"):
        fit_weights(ppl, lambda c: [c.DeviceStatsMonitor(cpu_stats=False)], tmp_path, epochs=1)
    fit_weights(ppl, lambda c: [c.DeviceStatsMonitor(cpu_stats=False)], tmp_path, epochs=1,
                logger=p_loggers.CSVLogger(tmp_path))  # on the CPU, asked to log nothing


def test_callbacks_ptrain_cannot_honour_are_refused_when_made():
    with pytest.raises(ptrain.ConfigError, match="SWALR"):
        p_callbacks.StochasticWeightAveraging(swa_lrs=0.01)
    with pytest.raises(ptrain.ConfigError, match="weight_mask"):
        p_callbacks.ModelPruning("l1_unstructured")


@pytest.mark.parametrize("module, names", [
    ("callback", ["Callback"]), ("lr_monitor", ["LearningRateMonitor"]),
    ("progress.progress_bar", ["ProgressBar"]), ("progress.rich_progress", ["RichProgressBar"]),
    ("progress.tqdm_progress", ["TQDMProgressBar", "Tqdm"])])
def test_lightnings_callback_submodules_import_with_their_names(module, names):
    # darts' callbacks module imports Tqdm from callbacks.progress.tqdm_progress
    import importlib

    ours = importlib.import_module(f"ptrain.lightning.callbacks.{module}")
    for name in names:
        obj = getattr(ours, name)
        assert getattr(p_callbacks, name, obj) is obj  # the package's own class, where it has one
    if module == "progress.tqdm_progress":
        from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

        values = [1, 0.5, 1.0, 12345.0, "3", "abc", "1e-5", 1e-7, 0.123456, "12345678", -2.5]
        assert [ours.Tqdm.format_num(v) for v in values] == [Tqdm.format_num(v) for v in values]

        class Customised(ours.TQDMProgressBar):  # defined as in darts; refused only when made
            def init_train_tqdm(self):
                return ours.Tqdm(disable=True)

        with pytest.raises(ptrain.ConfigError, match="init_train_tqdm"):
            Customised()


def epoch_bar_class(framework):
    """A bar as NeuralProphet's (neuralprophet/logger.py): it calls ``init_train_tqdm`` in
    ``__init__`` and moves that tqdm bar itself, once per epoch."""

    class EpochBar(CALLBACKS[framework].TQDMProgressBar):
        def __init__(self, *args, **kwargs):
            self.epochs = kwargs.pop("epochs")
            super().__init__(*args, **kwargs)
            self.main_progress_bar = super().init_train_tqdm()
            self.seen = []

        def on_train_epoch_start(self, trainer, *_):
            self.main_progress_bar.reset(self.epochs)
            self.main_progress_bar.set_description(f"Epoch {trainer.current_epoch + 1}")
            self.seen.append(self.main_progress_bar.desc)

        def on_train_batch_end(self, trainer, pl_module, *_):
            pass

    return EpochBar


def test_a_tqdm_bar_may_call_the_init_tqdm_methods_as_in_lightning(tmp_path):
    # NeuralProphet's ProgressBar calls init_train_tqdm in __init__: an AttributeError before
    bars = {}
    for framework in (pl, ppl):
        bar = epoch_bar_class(framework)(refresh_rate=5, epochs=3)
        fit_weights(framework, lambda c: [bar], tmp_path / framework.__name__,
                    enable_progress_bar=True)
        bars[framework] = bar
        bar.main_progress_bar.close()
    assert bars[ppl].seen == bars[pl].seen == ["Epoch 1: ", "Epoch 2: ", "Epoch 3: "]
    for name in ("init_sanity_tqdm", "init_train_tqdm", "init_predict_tqdm", "init_test_tqdm"):
        for refresh_rate in (1, 0):
            made = {framework: getattr(CALLBACKS[framework].TQDMProgressBar(refresh_rate),
                                       name)() for framework in (pl, ppl)}
            for bar in made.values():
                bar.close()
            seen = [tuple(getattr(b, key, None)  # a disabled tqdm sets few attributes
                          for key in ("desc", "disable", "leave", "smoothing", "bar_format"))
                    for b in made.values()]
            assert seen[0] == seen[1], name
            assert seen[0][1] or refresh_rate  # disabled with refresh_rate=0
            assert type(made[ppl]).format_num(0.5) == type(made[pl]).format_num(0.5)


def test_the_deeper_callback_modules_have_lightnings_names():
    from lightning_names import public_names

    import ptrain.lightning.callbacks.progress as progress

    assert set(public_names("callbacks.progress")) <= set(dir(progress))
    assert issubclass(progress.TQDMProgressBar, progress.ProgressBar)
    assert isinstance(ppl.callbacks.ModelCheckpoint(), p_callbacks.Checkpoint)
    assert isinstance(BuiltinCheckpoint(), p_callbacks.Checkpoint)


def test_learning_rates_are_in_callback_metrics_at_the_validation_their_batch_triggers(
        tmp_path):
    # Lightning's LearningRateMonitor logs when the batch starts, so the validation that batch
    # triggers (a checkpoint or early stopping monitoring the rate, a callback reading
    # callback_metrics) sees that batch's rate; neuralforecast's models validate every few steps
    def seen(framework, callbacks, loggers):
        base = model_class(framework, hparams=False)

        class Scheduled(base):
            def configure_optimizers(self):
                optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
                decay = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
                return {"optimizer": optimizer,
                        "lr_scheduler": {"scheduler": decay, "interval": "step"}}

        class Reader(framework.Callback):
            def __init__(self):
                self.rates = []

            def on_validation_end(self, trainer, pl_module):
                rate = trainer.callback_metrics.get("lr-SGD")
                self.rates.append((trainer.global_step,
                                   None if rate is None else float(rate)))

        framework.seed_everything(3)
        reader = Reader()
        root = tmp_path / framework.__name__
        fit(framework, Scheduled(), root, logger=loggers.CSVLogger(root), max_epochs=2,
            log_every_n_steps=2, val_check_interval=2,
            callbacks=[reader, callbacks.LearningRateMonitor()])
        return reader.rates

    theirs = seen(pl, l_callbacks, l_loggers)
    assert seen(ppl, p_callbacks, p_loggers) == theirs
    assert [rate for _, rate in theirs] == pytest.approx([0.05, 0.0125, 0.003125, 0.00078125])
