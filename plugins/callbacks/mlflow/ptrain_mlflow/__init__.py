"""The ``mlflow`` callback: a ptrain logger that records a run in MLflow.

One MLflow run per ``fit``/``validate`` (per run folder), created on global rank 0 at ``setup``
through :class:`mlflow.MlflowClient` (no global "active run" is touched, so the user's own
``mlflow`` calls are left alone). It records:

- every published metric, with ``trainer.global_step`` as its step (one ``log_batch`` call per
  publish point, never per training step);
- the hyperparameters as params (nested dicts flattened with ``/``: ``{"opt": {"lr": 0.1}}``
  becomes ``opt/lr``);
- with ``log_config`` (on by default), the run's resolved configuration as the artifact
  ``config.json``;
- the tags ``ptrain.log_dir`` and ``ptrain.stage``, and those given with ``tags``.

At ``teardown`` the run ends with status ``FINISHED``, ``FAILED`` (``trainer.exception``) or
``KILLED`` (a ``KeyboardInterrupt``). Other ranks do nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

from ptrain.errors import ConfigError, PluginError
from ptrain.hookspecs import hookimpl

INSTALL = "pip install ptrain-mlflow (or: pip install mlflow-skinny)"


def to_tags(value: Any) -> dict[str, str]:
    """Tags: a TOML table (``{ team = "vision" }``), a list of ``KEY=VALUE`` texts, or on the
    command line ``KEY=VALUE,KEY=VALUE``."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"expected KEY=VALUE pairs or a table, got {value!r}")
    tags = {}
    for item in items:
        if not isinstance(item, str) or "=" not in item or not item.split("=", 1)[0].strip():
            raise ValueError(f"expected KEY=VALUE, got {item!r} (e.g. team=vision,purpose=ablation)")
        key, text = item.split("=", 1)
        tags[key.strip()] = text.strip()
    return tags


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level, names joined with ``/``."""
    flat = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


class MLflowLogger:
    """Records metrics, hyperparameters and the configuration of a run in MLflow (see the
    module's docstring)."""

    name = "mlflow"  # its entry point's name, also when given as an object

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None,
                 run_name: str | None = None, tags: dict[str, str] | None = None,
                 log_config: bool = True) -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_name = run_name
        self.tags = to_tags(tags) if tags is not None else {}
        self.log_config = log_config
        self.client = None
        self.run_id: str | None = None  # the MLflow run of the current stage (rank 0)
        self.last_run_id: str | None = None  # the run of the latest stage, kept after teardown

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("tracking_uri", str,
                    help="where runs go: a tracking server (http://host:5000), a database "
                         "(sqlite:///PATH) or a folder (file:/PATH, MLflow 3 asks for "
                         "MLFLOW_ALLOW_FILE_STORE=true); default: $MLFLOW_TRACKING_URI, else "
                         "sqlite:///<default_root_dir>/mlflow.db")
        options.add("experiment", str,
                    help="experiment name, created if missing; default: $MLFLOW_EXPERIMENT_NAME, "
                         "else 'ptrain' (created with its artifacts beside a local database)")
        options.add("run_name", str, help="the run's name; default: the run folder (version_N)")
        options.add("tags", to_tags, help="tags of the run: KEY=VALUE,KEY=VALUE (a table in a "
                                          "config file)")
        options.add("log_config", bool, default=True,
                    help="record the run's resolved configuration as the artifact config.json")

    @staticmethod
    @hookimpl
    def check_available() -> str | None:
        if importlib.util.find_spec("mlflow") is None:
            return f"the MLflow client is not installed: {INSTALL}"
        return None

    def resolved_tracking_uri(self, trainer) -> str:
        """The tracking URI this run uses (see the ``tracking_uri`` option)."""
        if self.tracking_uri:
            return self.tracking_uri
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return os.environ["MLFLOW_TRACKING_URI"]
        return f"sqlite:///{Path(trainer.run_root, 'mlflow.db').resolve()}"

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        self.run_id = None
        if not trainer.is_global_zero:
            return
        problem = self.check_available()
        if problem is not None:
            raise PluginError(f"-p mlflow can't run here: {problem}.")
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        uri = self.resolved_tracking_uri(trainer)
        experiment = self.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "ptrain"
        artifacts = None  # MLflow's own default is ./mlruns in the current folder
        if uri.startswith("sqlite:"):
            database = Path(uri[len("sqlite:///"):])
            database.parent.mkdir(parents=True, exist_ok=True)
            artifacts = (database.parent / "mlartifacts").resolve().as_uri()
        try:
            self.client = MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = (found.experiment_id if found is not None
                             else self.client.create_experiment(
                                 experiment, artifact_location=artifacts))
            tags = {"ptrain.log_dir": str(trainer.run_dir), "ptrain.stage": stage, **self.tags}
            run = self.client.create_run(experiment_id,
                                         run_name=self.run_name or Path(trainer.run_dir).name,
                                         tags=tags)
        except ImportError as exc:
            raise PluginError(
                f"MLflow can't open the tracking store {uri!r}: {exc}. A local database store "
                f"needs SQLAlchemy and alembic beside the MLflow client (ptrain-mlflow "
                f"installs them; something removed them): pip install sqlalchemy alembic (or "
                f"pip install mlflow); or point --mlflow-tracking-uri at a tracking server "
                f"(http://HOST:PORT).") from None
        except MlflowException as exc:
            raise ConfigError(
                f"MLflow could not start a run at tracking URI {uri!r} (experiment "
                f"{experiment!r}): {str(exc).splitlines()[0]}. Check --mlflow-tracking-uri (a "
                f"running server http://HOST:PORT, sqlite:///PATH or file:/PATH) and "
                f"--mlflow-experiment.") from None
        self.run_id = self.last_run_id = run.info.run_id

    @hookimpl
    def log_hyperparams(self, trainer, hyperparameters: dict[str, Any]) -> None:
        if self.run_id is None:
            return
        from mlflow.entities import Param

        params = [Param(key, str(value)) for key, value in flatten(hyperparameters).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])
        if self.log_config:
            self.client.log_text(self.run_id, json.dumps(trainer.config, indent=2, default=str),
                                 "config.json")

    @hookimpl
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.run_id is None or not metrics:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(name, value, now, step)
                                                    for name, value in metrics.items()])

    @hookimpl
    def teardown(self, trainer) -> None:
        if self.run_id is None:
            return
        error = trainer.exception
        status = ("FINISHED" if error is None
                  else "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
        run_id, self.run_id = self.run_id, None
        self.client.set_terminated(run_id, status=status)


__all__ = ["MLflowLogger", "flatten", "to_tags"]
