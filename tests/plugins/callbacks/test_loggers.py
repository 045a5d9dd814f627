"""Loggers: the ``log_hyperparams`` hook and its default (``hparams.toml``), and the ``csv``,
``mlflow`` and ``wandb`` loggers, each read back from what it wrote with the tool's own reader:
the CSV file, an MLflow store (a local file store, the default SQLite store, and a real
``mlflow server`` on 127.0.0.1) through ``MlflowClient``, and W&B's offline transaction log
through W&B's own protobuf records. Several loggers at once, and rank 0 only under ``ddp``."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
import torch

import ptrain
from ptrain.errors import ConfigError
from tests.conftest import TinyRegressor, make_regression_data

QUIET = ["no:progress-bar", "no:checkpoint"]


class Hyper(TinyRegressor):
    """TinyRegressor that records its init arguments (a nested dict and a None among them)."""

    def __init__(self, lr: float = 0.1, optim: dict | None = None, note: str | None = None,
                 n: int = 32):
        super().__init__(lr=lr, n=n)
        self.save_hyperparameters()


class Data(ptrain.DataModule):
    def __init__(self, batch_size: int = 8, lr: float = 99.0):
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(make_regression_data(32), batch_size=8)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(make_regression_data(16, seed=1), batch_size=8)


class Published:
    """A logger that keeps what the core published: every ``log_metrics`` call and the
    ``log_hyperparams`` calls, with where they fell relative to ``setup``."""

    name = "published"

    def __init__(self):
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.hparams: list[dict] = []
        self.events: list[str] = []

    @ptrain.hookimpl
    def setup(self):
        self.events.append("setup")

    @ptrain.hookimpl
    def log_hyperparams(self, trainer, hyperparameters):
        self.events.append("log_hyperparams")
        self.hparams.append(dict(hyperparameters))
        self.config = trainer.config

    @ptrain.hookimpl
    def log_metrics(self, metrics, step):
        if "log_metrics" not in self.events:
            self.events.append("log_metrics")
        self.metrics.append((step, dict(metrics)))

    def history(self, name: str) -> list[tuple[int, float]]:
        return [(step, m[name]) for step, m in self.metrics if name in m]


def final_values(trainer) -> dict[str, float]:
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


# -- the hook and its default ---------------------------------------------------------------------


def test_log_hyperparams_fires_after_setup_with_module_and_datamodule_merged(make_trainer):
    published = Published()
    trainer = make_trainer(max_epochs=1, callbacks=[*QUIET, published])
    trainer.fit(Hyper(lr=0.5, optim={"betas": [0.9, 0.99]}), datamodule=Data(batch_size=4))
    assert published.events == ["setup", "log_hyperparams", "log_metrics"]
    # the module wins on a shared name (lr), the datamodule adds its own
    expected = {"batch_size": 4, "lr": 0.5, "optim": {"betas": [0.9, 0.99]}, "note": None,
                "n": 32}
    assert published.hparams == [expected]
    assert published.config is trainer.config
    saved = tomllib.loads((trainer.log_dir / "hparams.toml").read_text())
    assert saved == {k: v for k, v in expected.items() if v is not None}  # TOML has no null
    assert "# note = (unset)" in (trainer.log_dir / "hparams.toml").read_text()


def test_no_hparams_file_without_hyperparameters(make_trainer):
    published = Published()
    trainer = make_trainer(max_epochs=1, callbacks=[*QUIET, published])
    trainer.validate(TinyRegressor(n=16))
    assert published.hparams == [{}]
    assert not (trainer.log_dir / "hparams.toml").exists()


# -- csv --------------------------------------------------------------------------------------------


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames), list(reader)


def test_csv_rows_are_the_published_metrics(make_trainer):
    published = Published()
    trainer = make_trainer(max_epochs=2, log_every_n_steps=3, val_check_interval=0.5,
                           callbacks=[*QUIET, "csv", published],
                           plugin_options={"csv": {"flush_every_n_steps": 1}})
    trainer.fit(Hyper(n=64))
    header, rows = read_csv(trainer.log_dir / "metrics.csv")
    # flushed every step: the train rows reached the file before val_loss existed, so the file
    # was rewritten with the wider header, and the earlier rows have an empty val_loss
    assert header == ["epoch", "step", "train_loss", "val_loss"]
    assert rows[0]["val_loss"] == ""
    assert len(rows) == len(published.metrics)
    for row, (step, metrics) in zip(rows, published.metrics):
        assert int(row["step"]) == step
        for name in ("train_loss", "val_loss"):
            assert row[name] == (repr(metrics[name]) if name in metrics else "")
    assert [int(r["epoch"]) for r in rows if r["val_loss"]] == [0, 0, 1, 1]
    last = {name: float([r for r in rows if r[name]][-1][name]) for name in ("train_loss",
                                                                              "val_loss")}
    assert last["val_loss"] == final_values(trainer)["val_loss"]
    # the run's configuration next to it, readable by --config
    config = tomllib.loads((trainer.log_dir / "config.toml").read_text())
    assert config["trainer"]["max_epochs"] == 2
    assert config["plugins"]["csv"] == {"flush_every_n_steps": 1, "log_config": True,
                                        "on_write_error": "stop"}


def test_csv_buffers_until_the_epoch_ends(make_trainer, tmp_path):
    class Probe:
        name = "probe"

        @ptrain.hookimpl(trylast=True)
        def log_metrics(self, trainer):
            path = trainer.log_dir / "metrics.csv"
            self.sizes.append(path.stat().st_size if path.exists() else 0)

    probe = Probe()
    probe.sizes = []
    trainer = make_trainer(max_epochs=1, log_every_n_steps=1, callbacks=[*QUIET, probe, "csv"])
    trainer.fit(TinyRegressor(n=64, with_val=False))
    assert probe.sizes and set(probe.sizes) == {0}  # nothing written within the epoch
    assert len(read_csv(trainer.log_dir / "metrics.csv")[1]) == len(probe.sizes) == 8


def test_csv_is_not_on_by_default_and_refuses_a_bad_interval(make_trainer):
    trainer = make_trainer(max_epochs=1)
    assert "csv" not in trainer.plugins
    with pytest.raises(ConfigError, match="flush_every_n_steps"):
        make_trainer(callbacks=["csv"], plugin_options={"csv": {"flush_every_n_steps": 0}})


# -- mlflow -----------------------------------------------------------------------------------------


def mlflow_run(uri: str, run_id: str):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return client, client.get_run(run_id)


def check_mlflow_run(uri: str, trainer, published: Published, hparams: dict[str, str]) -> None:
    plugin = trainer.plugins["mlflow"]
    client, run = mlflow_run(uri, plugin.last_run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == trainer.log_dir.name
    assert run.data.params == hparams
    assert run.data.tags["ptrain.stage"] == "fit"
    for name in ("train_loss", "val_loss"):
        history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, name)]
        assert sorted(history) == sorted(published.history(name)), name
    assert run.data.metrics["val_loss"] == final_values(trainer)["val_loss"]
    config = client.download_artifacts(run.info.run_id, "config.json", str(trainer.log_dir))
    assert json.loads(Path(config).read_text()) == json.loads(json.dumps(trainer.config))


HPARAMS = {"lr": "0.1", "optim/betas": "[0.9, 0.99]", "optim/eps": "1e-08", "note": "None",
           "n": "32"}


def test_mlflow_local_file_store(make_trainer, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps it behind this
    uri = (tmp_path / "mlruns").as_uri()
    published = Published()
    trainer = make_trainer(max_epochs=2, log_every_n_steps=3, callbacks=[*QUIET, "mlflow",
                                                                         published],
                           plugin_options={"mlflow": {"tracking_uri": uri, "experiment": "exp",
                                                      "tags": ["team=vision"]}})
    trainer.fit(Hyper(optim={"betas": [0.9, 0.99], "eps": 1e-8}))
    check_mlflow_run(uri, trainer, published, HPARAMS)
    _, run = mlflow_run(uri, trainer.plugins["mlflow"].last_run_id)
    assert run.data.tags["team"] == "vision"
    assert (tmp_path / "mlruns").is_dir()


class Boom(TinyRegressor):
    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == 2:
            raise RuntimeError("boom")
        return super().training_step(batch, batch_idx)


def test_mlflow_default_store_and_a_failed_run(make_trainer, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    trainer = make_trainer(max_epochs=1, log_every_n_steps=1, callbacks=[*QUIET, "mlflow"])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Boom())
    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    assert trainer.plugins["mlflow"].resolved_tracking_uri(trainer) == uri
    client, run = mlflow_run(uri, trainer.plugins["mlflow"].last_run_id)
    assert run.info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == [1, 2]


def test_mlflow_refuses_bad_tags(make_trainer):
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        make_trainer(callbacks=["mlflow"], plugin_options={"mlflow": {"tags": ["novalue"]}})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """A real ``mlflow server`` on 127.0.0.1 (SQLite backend, artifacts served by it), killed at
    the end; skipped with the reason when the full ``mlflow`` package is not installed."""
    pytest.importorskip("mlflow.server", reason="`mlflow server` needs the full mlflow package: "
                                                "pip install -c constraints.txt 'mlflow>=2.10'")
    port = free_port()
    exe = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or shutil.which("mlflow")
    argv = [exe, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
            "--artifacts-destination", str(tmp_path / "artifacts")]
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not come up on {url} within 90 s (exit "
                            f"{proc.poll()}):\n{(tmp_path / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.mark.slow
def test_mlflow_tracking_server_on_localhost(make_trainer, mlflow_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    published = Published()
    trainer = make_trainer(max_epochs=2, log_every_n_steps=3,
                           callbacks=[*QUIET, "mlflow", published],
                           plugin_options={"mlflow": {"tracking_uri": mlflow_server,
                                                      "experiment": "served"}})
    trainer.fit(Hyper(optim={"betas": [0.9, 0.99], "eps": 1e-8}))
    check_mlflow_run(mlflow_server, trainer, published, HPARAMS)


# -- wandb ------------------------------------------------------------------------------------------


def wandb_records(run_dir: Path) -> list:
    """The records of an offline run's transaction log (``run-ID.wandb``): W&B's own protobuf
    ``Record`` messages, framed in 32 KiB blocks of chunks (4-byte checksum, 2-byte length,
    1-byte type: full, first, middle, last) after a 7-byte header; checksums not verified."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:  # the block's tail is padding
            pos += room
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            pos += room
            continue
        pending = data[pos + 7:pos + 7 + length] if kind in (1, 2) \
            else pending + data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def finished_wandb_records(run_dir: Path, timeout: float = 120.0) -> list:
    """The transaction log's records once it holds the run's exit record: W&B's service
    process may still be writing the file after ``run.finish()`` returns (seen on a loaded
    machine), so this waits on that condition (checked every 0.1 s) up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            records = wandb_records(run_dir)
        except Exception:  # noqa: BLE001 - a half-written record: read again
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records) \
                or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def wandb_contents(run_dir: Path) -> dict:
    def key(item) -> str:  # W&B writes a name either as key or as nested_key
        return item.key or "/".join(item.nested_key)

    history, config, exits, run = [], {}, [], None
    records = finished_wandb_records(run_dir)
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({key(item): json.loads(item.value_json) for item in record.history.item})
        elif kind == "config":
            config.update({key(item): json.loads(item.value_json) for item in record.config.update})
        elif kind == "exit":
            exits.append(record.exit.exit_code)
        elif kind == "run":
            run = record.run
    assert run is not None, [r.WhichOneof("record_type") for r in records]
    return {"history": history, "config": config, "exits": exits, "run": run}


def test_wandb_offline_run(make_trainer, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    published = Published()
    trainer = make_trainer(max_epochs=2, log_every_n_steps=3,
                           callbacks=[*QUIET, "wandb", published],
                           # the mode given: W&B keeps the one of its first run in the
                           # process, so WANDB_MODE alone depends on which test ran first
                           plugin_options={"wandb": {"project": "ptrain-test", "tags": "a,b",
                                                     "mode": "offline"}})
    trainer.fit(Hyper(optim={"betas": [0.9, 0.99], "eps": 1e-8}))
    run_dir = trainer.plugins["wandb"].last_run_dir
    assert run_dir.parent == trainer.log_dir / "wandb"  # dir defaults to the run folder
    got = wandb_contents(run_dir)
    assert got["run"].project == "ptrain-test" and got["run"].display_name == trainer.log_dir.name
    assert list(got["run"].tags) == ["a", "b"]
    assert {k: got["config"][k] for k in ("lr", "optim", "note", "n")} == {
        "lr": 0.1, "optim": {"betas": [0.9, 0.99], "eps": 1e-8}, "note": None, "n": 32}
    assert got["config"]["ptrain"]["trainer"]["max_epochs"] == 2
    assert got["config"]["ptrain"]["plugins"]["wandb"]["tags"] == ["a", "b"]
    for name in ("train_loss", "val_loss"):
        logged = [(row["_step"], row[name]) for row in got["history"] if name in row]
        expected = {}
        for step, value in published.history(name):
            expected[step] = value  # one history row per step: a later value at a step wins
        assert logged == sorted(expected.items()), name
    assert got["history"][-1]["val_loss"] == final_values(trainer)["val_loss"]
    assert got["exits"] == [0]


def test_wandb_refuses_an_unknown_mode(make_trainer):
    with pytest.raises(ConfigError, match="offline"):
        make_trainer(callbacks=["wandb"], plugin_options={"wandb": {"mode": "offlne"}})


# -- several at once, and rank 0 only -------------------------------------------------------------


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.slow
def test_csv_mlflow_and_tensorboard_together_from_the_cli(cli, tmp_path):
    pytest.importorskip("mlflow")
    root = tmp_path / "runs"
    result = cli("fit", "--model", "tests.conftest:TinyRegressor", "--model.n", "32",
                 "--max-epochs", "2", "--seed", "0", "--accelerator", "cpu", "--no-progress-bar",
                 "--default-root-dir", str(root), "-p", "csv", "-p", "mlflow", "-p", "tensorboard",
                 env={"MLFLOW_TRACKING_URI": ""})
    assert result.returncode == 0, result.stderr
    run = root / "version_0"
    _, rows = read_csv(run / "metrics.csv")
    csv_val = [(int(r["step"]), float(r["val_loss"])) for r in rows if r["val_loss"]]
    tb = tensorboard_scalars(run)
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("ptrain").experiment_id])
    ml_val = [(m.step, m.value) for m in client.get_metric_history(found.info.run_id,
                                                                     "val_loss")]
    assert csv_val == [(s, pytest.approx(v, rel=1e-6)) for s, v in tb["val_loss"]]
    assert sorted(ml_val) == csv_val and len(csv_val) == 2
    assert found.data.params == {}  # TinyRegressor saves no hyperparameters
    assert found.info.status == "FINISHED"


@pytest.mark.slow
def test_rank_zero_only_under_ddp(make_trainer, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    trainer = make_trainer(strategy="ddp", devices=2, max_epochs=2, log_every_n_steps=1,
                           callbacks=[*QUIET, "csv", "mlflow"],
                           plugin_options={"ddp": {"timeout": 120.0},
                                           "csv": {"flush_every_n_steps": 1}})
    trainer.fit(Hyper(n=32))
    root = tmp_path / "runs"
    # the artifacts beside the database, not in ./mlruns of the current folder
    assert sorted(p.name for p in root.iterdir()) == ["mlartifacts", "mlflow.db", "version_0"]
    assert [p.name for p in root.rglob("metrics.csv")] == ["metrics.csv"]
    _, rows = read_csv(root / "version_0" / "metrics.csv")
    steps = [int(r["step"]) for r in rows if r["train_loss"]]
    # 2 ranks share 32 samples: 2 batches of 8 each per epoch; every step logged exactly once
    assert steps == [1, 2, 3, 4]
    final_val = float([r for r in rows if r["val_loss"]][-1]["val_loss"])
    assert math.isclose(final_val, final_values(trainer)["val_loss"], rel_tol=1e-6)
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ptrain").experiment_id])
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")] == [2, 4]
    assert run.data.metrics["val_loss"] == pytest.approx(final_values(trainer)["val_loss"],
                                                         rel=1e-6)
    assert (root / "version_0" / "hparams.toml").read_text().count("lr = 0.1") == 1
