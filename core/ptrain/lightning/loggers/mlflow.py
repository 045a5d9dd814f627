"""``lightning.pytorch.loggers.mlflow``: ``MLFlowLogger`` with Lightning's arguments and
methods, over the ``ptrain-mlflow`` plugin."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
try:
    from ptrain_mlflow import MLflowLogger, flatten
except ImportError as exc:
    if exc.name is None or not exc.name.startswith("ptrain_"):
        raise
    raise ImportError("ptrain.lightning.loggers.mlflow comes with the ptrain-mlflow distribution, which "
                      "is not installed: pip install ptrain-mlflow") from None

from ptrain.hookspecs import hookimpl
from ptrain.lightning._common import refuse_unless
from ptrain.lightning.loggers.logger import Logger, _DummyExperiment


class MLFlowLogger(Logger):
    """Lightning's ``MLFlowLogger``: without ``tracking_uri``, a file store at ``save_dir``
    (Lightning's default ``./mlruns``); one MLflow run per stage, made by the ``mlflow`` plugin
    (which this logger runs).

    Lightning's methods and attributes: ``log_metrics(metrics, step=None)``,
    ``log_hyperparams(params)`` (into the stage's run, or the last stage's after it; given
    before the first stage, they are recorded when its run starts), ``experiment`` (the
    ``MlflowClient``), ``run_id``, ``experiment_id``, ``name`` (the experiment's id),
    ``version`` (the run's id), ``save_dir`` (the file store's folder).
    """

    plugin_name = "mlflow"

    def __init__(self, experiment_name: str = "lightning_logs", run_name: str | None = None,
                 tracking_uri: str | None = None, tags: dict[str, Any] | None = None,
                 save_dir: str | None = "./mlruns", log_model: Any = False, prefix: str = "",
                 artifact_location: str | None = None, run_id: str | None = None,
                 synchronous: bool | None = None):
        refuse_unless("MLFlowLogger", locals(), {
            "log_model": (False, "log the checkpoint as an artifact yourself after fit()"),
            "prefix": ("", "add the prefix to the names in self.log"),
            "artifact_location": (None, "set it on the MLflow experiment beforehand"),
            "run_id": (None, "ptrain starts one MLflow run per stage"),
            "synchronous": (None, "set MLFLOW_ENABLE_ASYNC_LOGGING in the environment"),
        })
        self._save_dir = None
        if tracking_uri is None and save_dir is not None:
            self._save_dir = str(Path(save_dir))
            tracking_uri = Path(save_dir).resolve().as_uri()
        self._run = MLflowLogger(tracking_uri=tracking_uri, experiment=experiment_name,
                                 run_name=run_name, tags=tags)
        self._early_params: dict[str, Any] = {}
        self._early_metrics: list[tuple[dict[str, float], int | None]] = []

    # -- Lightning's attributes --------------------------------------------------------------

    @property
    def experiment(self) -> Any:
        """The ``MlflowClient`` on global rank 0 (a stand-in whose methods do nothing
        elsewhere); ``run_id`` names the stage's run (none before the first stage)."""
        if self._rank() > 0:
            return _DummyExperiment()
        if self._run.client is None:  # before the first stage: a client of the same store
            from mlflow import MlflowClient

            self._run.client = MlflowClient(tracking_uri=self._run.tracking_uri)
        return self._run.client

    @property
    def run_id(self) -> str | None:
        """The MLflow run of the stage under way, else of the last stage."""
        return self._run.run_id or self._run.last_run_id

    @property
    def experiment_id(self) -> str | None:
        run_id = self.run_id
        return None if run_id is None else self._run.client.get_run(run_id).info.experiment_id

    @property
    def name(self) -> str | None:
        return self.experiment_id

    @property
    def version(self) -> str | None:
        return self.run_id

    @property
    def save_dir(self) -> str | None:
        return self._save_dir

    @property
    def root_dir(self) -> str:
        """Missing: the run folder (checkpoints, ptrain's files) is
        ``default_root_dir/lightning_logs/version_N``, as without a logger."""
        raise AttributeError("MLFlowLogger keeps the run's folder under the Trainer's "
                             "default_root_dir (lightning_logs/version_N)")

    # -- Lightning's methods -----------------------------------------------------------------

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if self._rank() > 0:
            return
        values = {name: value.item() if isinstance(value, torch.Tensor) else float(value)
                  for name, value in metrics.items()}
        if self.run_id is None:
            self._early_metrics.append((values, step))
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._run.client.log_batch(self.run_id, metrics=[
            Metric(name, value, now, step or 0) for name, value in values.items()])

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        if self._rank() > 0:
            return
        if isinstance(params, argparse.Namespace):
            params = vars(params)
        if self.run_id is None:
            self._early_params.update(params)
            return
        from mlflow.entities import Param

        entries = [Param(key, str(value)) for key, value in flatten(dict(params)).items()]
        for start in range(0, len(entries), 100):  # MLflow takes at most 100 params per batch
            self._run.client.log_batch(self.run_id, params=entries[start:start + 100])

    # -- the stage: the mlflow plugin's hooks ------------------------------------------------

    @hookimpl(specname="setup")
    def _stage_starts(self, trainer: Any, stage: str) -> None:
        self._run.setup(trainer, stage)
        if self._run.run_id is not None:
            if self._early_params:
                self.log_hyperparams(self._early_params)
            for metrics, step in self._early_metrics:
                self.log_metrics(metrics, step)
            self._early_params, self._early_metrics = {}, []

    def _publish_hyperparams(self, trainer: Any, hyperparameters: dict[str, Any]) -> None:
        self._run.log_hyperparams(trainer, {})  # the run's configuration, as config.json
        super()._publish_hyperparams(trainer, hyperparameters)

    @hookimpl(specname="teardown")
    def _stage_ends(self, trainer: Any) -> None:
        self._run.teardown(trainer)
