"""``ptrain.lightning.callbacks`` and ``ptrain.lightning.loggers`` beyond their smoke uses
(tests/lightning_names): each trains for real and is compared with Lightning 2.6.6 (installed
as the oracle) running the same program, where that is the natural check."""

from __future__ import annotations

import argparse
import os
import statistics
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

pl = pytest.importorskip("lightning.pytorch", reason="the oracle: pip install lightning==2.6.6")

import lightning.pytorch.loggers as l_loggers  # noqa: E402
import lightning.pytorch.loggers.logger as l_logger  # noqa: E402

import ptrain  # noqa: E402
import ptrain.lightning as ppl  # noqa: E402
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
    assert saved and all(isinstance(c[1], BuiltinCheckpoint) for c in saved)
    assert kind(ours, "log_hyperparams")[0] is ours[0]  # first, as in Lightning


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
    with pytest.raises(ptrain.ConfigError, match="version"):
        p_loggers.TensorBoardLogger(tmp_path, version=3)


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
