"""The ``wandb`` callback: a ptrain logger that records a run in Weights & Biases.

One W&B run per ``fit``/``validate`` (per run folder), started with ``wandb.init`` on global
rank 0 at ``setup`` (as a new run, ``reinit="create_new"``, so a run the user started is left
alone). It records:

- every published metric with ``step=trainer.global_step`` (one ``run.log`` per publish point,
  never per training step; the step and epoch metrics of one step land in one history row);
- the hyperparameters in ``run.config`` (nested dicts stay nested);
- with ``log_config`` (on by default), the run's resolved configuration under the config key
  ``ptrain`` (``{"trainer": ..., "plugins": ..., "model": ..., "data": ...}``).

At ``teardown`` the run is finished with ``exit_code`` 0, or 1 when the stage ended with an
error (``trainer.exception``). Other ranks do nothing. ``mode`` (``online``, ``offline``,
``disabled``) is W&B's own; without it ``$WANDB_MODE`` or W&B's default applies.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from ptrain.errors import ConfigError, PluginError
from ptrain.hookspecs import hookimpl
from ptrain.options import to_str_list

INSTALL = "pip install ptrain-wandb (or: pip install wandb)"
MODES = ("online", "offline", "disabled")
#: The config key under which the run's resolved configuration goes.
CONFIG_KEY = "ptrain"


class WandbLogger:
    """Records metrics, hyperparameters and the configuration of a run in W&B (see the
    module's docstring)."""

    name = "wandb"  # its entry point's name, also when given as an object

    def __init__(self, project: str | None = None, name: str | None = None,
                 mode: str | None = None, dir: str | None = None,
                 tags: list[str] | None = None, log_config: bool = True,
                 init_kwargs: dict[str, Any] | None = None) -> None:
        """``init_kwargs`` (from Python): more keyword arguments for ``wandb.init`` (``entity``,
        ``group``, ``notes``, ``job_type``...), as Lightning's ``WandbLogger`` passes its
        extra ones; those this plugin sets itself (``project``, ``name``, ``mode``, ``dir``,
        ``tags``, ``reinit``) go through their own arguments."""
        if mode is not None and mode not in MODES:
            raise ConfigError(f"WandbLogger(mode={mode!r}) is not a W&B mode; valid modes: "
                              f"{', '.join(MODES)}. Use offline to log without a network and "
                              f"`wandb sync` later.")
        self.project = project
        self.run_name = name
        self.mode = mode
        self.dir = dir
        self.tags = to_str_list(tags) if tags is not None else []
        self.log_config = log_config
        own = {"project", "name", "mode", "dir", "tags", "reinit"} & set(init_kwargs or {})
        if own:
            raise ConfigError(f"WandbLogger init_kwargs {sorted(own)}: give "
                              f"{' and '.join(sorted(own))} as the plugin's own arguments.")
        self.init_kwargs = dict(init_kwargs or {})
        self.run = None  # the W&B run of the current stage (rank 0)
        self.last_run_dir: Path | None = None  # its folder (files/, the .wandb log), kept

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("project", str, help="W&B project; default: $WANDB_PROJECT, else W&B's "
                                         "default ('uncategorized')")
        options.add("name", str, help="the run's display name; default: the run folder "
                                      "(version_N)")
        options.add("mode", str, choices=MODES,
                    help="online (sync as it runs), offline (write locally, `wandb sync` "
                         "later) or disabled; default: $WANDB_MODE, else online")
        options.add("dir", str, help="where W&B writes its files (a wandb/ folder inside); "
                                     "default: the run folder")
        options.add("tags", to_str_list, help="tags of the run: TAG,TAG")
        options.add("log_config", bool, default=True,
                    help=f"record the run's resolved configuration in the run's config, under "
                         f"{CONFIG_KEY!r}")

    @staticmethod
    @hookimpl
    def check_available() -> str | None:
        if importlib.util.find_spec("wandb") is None:
            return f"wandb is not installed: {INSTALL}"
        return None

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        self.run = None
        if not trainer.is_global_zero:
            return
        problem = self.check_available()
        if problem is not None:
            raise PluginError(f"-p wandb can't run here: {problem}.")
        import wandb

        folder = Path(self.dir) if self.dir else Path(trainer.run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            self.run = wandb.init(
                project=self.project,
                name=self.run_name or Path(trainer.run_dir).name,
                mode=self.mode, dir=str(folder), tags=self.tags or None,
                reinit="create_new", **{"job_type": stage, **self.init_kwargs},
            )
        except wandb.errors.Error as exc:  # no API key, no network, a refused project...
            text = str(exc).strip()
            first = text.splitlines()[0].rstrip(".") if text else type(exc).__name__
            raise PluginError(
                f"-p wandb could not start a run ({first}). Log in (`wandb login`, or set "
                f"WANDB_API_KEY), or log locally with --wandb-mode offline and upload later "
                f"with `wandb sync`.") from None
        self.last_run_dir = Path(self.run.dir).parent  # <dir>/wandb/<run>/files -> <run>

    @hookimpl
    def log_hyperparams(self, trainer, hyperparameters: dict[str, Any]) -> None:
        if self.run is None:
            return
        values = dict(hyperparameters)
        if self.log_config:
            values[CONFIG_KEY] = trainer.config
        if values:
            self.run.config.update(values, allow_val_change=True)

    @hookimpl
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.run is not None and metrics:
            self.run.log(dict(metrics), step=step)

    @hookimpl
    def teardown(self, trainer) -> None:
        if self.run is None:
            return
        run, self.run = self.run, None
        run.finish(exit_code=0 if trainer.exception is None else 1)


__all__ = ["WandbLogger"]
