"""``lightning.pytorch.loggers.wandb``: ``WandbLogger`` with Lightning's arguments and
methods, over the ``ptrain-wandb`` plugin."""

from __future__ import annotations

import argparse
from typing import Any

import torch
try:
    from ptrain_wandb import WandbLogger as _WandbRun
except ImportError as exc:
    if exc.name is None or not exc.name.startswith("ptrain_"):
        raise
    raise ImportError("ptrain.lightning.loggers.wandb comes with the ptrain-wandb distribution, which "
                      "is not installed: pip install ptrain-wandb") from None

from ptrain.errors import ConfigError
from ptrain.hookspecs import hookimpl
from ptrain.lightning._common import refuse_unless
from ptrain.lightning.loggers.logger import Logger, _DeferredCalls, _DummyExperiment


class WandbLogger(Logger):
    """Lightning's ``WandbLogger``: ``offline=True`` is W&B's offline mode, files go under
    ``dir`` (else ``save_dir``); other keyword arguments (``tags``, ``mode``, ``job_type``,
    ``entity``, ``group``...) go to ``wandb.init``, as Lightning passes them. One W&B run per stage, started by the ``wandb``
    plugin (which this logger runs).

    Lightning's methods and attributes: ``log_metrics(metrics, step=None)`` (the step as the
    value ``trainer/global_step``, as Lightning logs it), ``log_hyperparams(params)`` (into the
    run's config), ``log_table``, ``log_text``, ``log_image``, ``log_audio``, ``log_video``,
    ``watch(model, ...)``, ``experiment`` (the stage's ``wandb`` run), ``name`` (the
    project), ``version`` (the run's id), ``save_dir``. Given before the first stage, metrics
    and hyperparameters are recorded when its run starts.
    """

    plugin_name = "wandb"

    def __init__(self, name: str | None = None, save_dir: Any = ".", version: str | None = None,
                 offline: bool = False, dir: Any = None, id: str | None = None,
                 anonymous: bool | None = None, project: str | None = None,
                 log_model: Any = False, experiment: Any = None, prefix: str = "",
                 checkpoint_name: str | None = None, add_file_policy: str = "mutable",
                 **kwargs: Any):
        refuse_unless("WandbLogger", locals(), {
            "version": (None, "ptrain starts one W&B run per stage"),
            "id": (None, "ptrain starts one W&B run per stage"),
            "anonymous": (None, "set WANDB_ANONYMOUS in the environment"),
            "log_model": (False, "log the checkpoint as an artifact yourself after fit()"),
            "experiment": (None, "ptrain starts the W&B run itself"),
            "prefix": ("", "add the prefix to the names in self.log"),
            "checkpoint_name": (None, "checkpoints are not uploaded"),
            "add_file_policy": ("mutable", "checkpoints are not uploaded"),
        })
        tags = kwargs.pop("tags", None)
        mode = kwargs.pop("mode", "offline" if offline else None)
        self._save_dir = str(dir or save_dir)
        self._project = project
        # the rest goes to wandb.init, as Lightning passes it
        self._run = _WandbRun(project=project, name=name, mode=mode, dir=self._save_dir,
                              tags=tags, init_kwargs=kwargs)
        self._early_params: dict[str, Any] = {}
        self._early_metrics: list[tuple[dict[str, Any], int | None]] = []
        self._watch: tuple[Any, dict[str, Any]] | None = None
        # calls made on `experiment` before the first stage
        self._early_calls: list[tuple[tuple[str, ...], tuple, dict]] = []
        self._finished: Any = None  # the run of the last stage, finished

    # -- Lightning's attributes --------------------------------------------------------------

    @property
    def experiment(self) -> Any:
        """The ``wandb`` run of the stage under way on global rank 0 (a stand-in whose methods
        do nothing elsewhere). After a stage, its finished run (W&B takes no new values in it);
        before the first stage, the calls made on it are kept and made on the first stage's
        run when it starts."""
        if self._rank() > 0:
            return _DummyExperiment()
        if self._run.run is not None:
            return self._run.run
        if self._finished is not None:
            return self._finished
        return _DeferredCalls(self._early_calls)

    @property
    def name(self) -> str | None:
        """The project: the stage's run's (the last one's after it), else the one given."""
        run = self._run.run or self._finished
        return run.project if run is not None else self._project

    @property
    def version(self) -> str | None:
        """The id of the stage's run (the last one's after it); ``None`` before."""
        run = self._run.run or self._finished
        return run.id if run is not None else None

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def root_dir(self) -> str:
        """Missing: the run folder (checkpoints, ptrain's files) is
        ``default_root_dir/lightning_logs/version_N``, as without a logger."""
        raise AttributeError("WandbLogger keeps the run's folder under the Trainer's "
                             "default_root_dir (lightning_logs/version_N)")

    # -- Lightning's methods -----------------------------------------------------------------

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if self._rank() > 0:
            return
        values = {name: value.item() if isinstance(value, torch.Tensor) else value
                  for name, value in metrics.items()}
        if self._run.run is None:
            self._early_metrics.append((values, step))
            return
        if step is not None:
            values["trainer/global_step"] = step
        self._run.run.log(values)

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        if self._rank() > 0:
            return
        if isinstance(params, argparse.Namespace):
            params = vars(params)
        if self._run.run is None:
            self._early_params.update(params)
            return
        self._run.run.config.update(dict(params), allow_val_change=True)

    def watch(self, model: Any, log: str | None = "gradients", log_freq: int = 100,
              log_graph: bool = True) -> None:
        """W&B's ``watch`` on ``model`` (before the first stage: when its run starts)."""
        options = {"log": log, "log_freq": log_freq, "log_graph": log_graph}
        if self._run.run is None:
            self._watch = (model, options)
        elif self._rank() == 0:
            self._run.run.watch(model, **options)

    def log_table(self, key: str, columns: list[str] | None = None, data: Any = None,
                  dataframe: Any = None, step: int | None = None) -> None:
        import wandb

        self.log_metrics({key: wandb.Table(columns=columns, data=data, dataframe=dataframe)},
                         step)

    def log_text(self, key: str, columns: list[str] | None = None, data: Any = None,
                 dataframe: Any = None, step: int | None = None) -> None:
        self.log_table(key, columns, data, dataframe, step)

    def log_image(self, key: str, images: list[Any], step: int | None = None,
                  **kwargs: Any) -> None:
        self._log_media("Image", key, images, step, kwargs)

    def log_audio(self, key: str, audios: list[Any], step: int | None = None,
                  **kwargs: Any) -> None:
        self._log_media("Audio", key, audios, step, kwargs)

    def log_video(self, key: str, videos: list[Any], step: int | None = None,
                  **kwargs: Any) -> None:
        self._log_media("Video", key, videos, step, kwargs)

    def _log_media(self, kind: str, key: str, items: list[Any], step: int | None,
                   per_item: dict[str, list[Any]]) -> None:
        """``items`` as ``wandb.<kind>`` objects under ``key``; each keyword argument is a list
        with one value per item (``caption=[...]``), as Lightning takes them."""
        import wandb

        for option, values in per_item.items():
            if len(values) != len(items):
                raise ConfigError(f"WandbLogger.log_{kind.lower()}: {option} has {len(values)} "
                                  f"values for {len(items)} items; give one per item.")
        made = [getattr(wandb, kind)(item, **{k: v[i] for k, v in per_item.items()})
                for i, item in enumerate(items)]
        self.log_metrics({key: made}, step)

    # -- the stage: the wandb plugin's hooks -------------------------------------------------

    @hookimpl(specname="setup")
    def _stage_starts(self, trainer: Any, stage: str) -> None:
        self._run.setup(trainer, stage)
        if self._run.run is not None:
            if self._early_params:
                self.log_hyperparams(self._early_params)
            for metrics, step in self._early_metrics:
                self.log_metrics(metrics, step)
            if self._watch is not None:
                self._run.run.watch(self._watch[0], **self._watch[1])
            _DeferredCalls(self._early_calls).make_on(self._run.run)
            self._early_params, self._early_metrics, self._watch = {}, [], None

    def _publish_hyperparams(self, trainer: Any, hyperparameters: dict[str, Any]) -> None:
        self._run.log_hyperparams(trainer, {})  # the run's configuration, under "ptrain"
        super()._publish_hyperparams(trainer, hyperparameters)

    @hookimpl(specname="teardown")
    def _stage_ends(self, trainer: Any) -> None:
        self._finished = self._run.run or self._finished
        self._run.teardown(trainer)
