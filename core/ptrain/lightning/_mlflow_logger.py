"""``MLFlowLogger`` with Lightning's arguments, over the ``ptrain-mlflow`` plugin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ptrain_mlflow import MLflowLogger

from ptrain.lightning._common import refuse_unless


class MLFlowLogger(MLflowLogger):
    """Lightning's ``MLFlowLogger``: without ``tracking_uri``, a file store at ``save_dir``
    (Lightning's default ``./mlruns``); one MLflow run per stage."""

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
        if tracking_uri is None and save_dir is not None:
            tracking_uri = Path(save_dir).resolve().as_uri()
        super().__init__(tracking_uri=tracking_uri, experiment=experiment_name,
                         run_name=run_name, tags=tags)
