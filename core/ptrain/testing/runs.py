"""``run_fit``: a whole, tiny fit with the plugins under test, in one call."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ptrain.catalog import Catalog
from ptrain.errors import ConfigError, PluginError
from ptrain.module import DataModule, TrainModule
from ptrain.options import closest
from ptrain.trainer import Trainer

#: Callbacks that are on by default in a run and that ``run_fit`` turns off unless named.
QUIET_CALLBACKS = ("progress-bar", "results", "tensorboard", "model-summary")
_BLOCK = "no:"


def plugin_kind(name: str, catalog: Catalog | None = None) -> str:
    """The kind (``accelerator``, ``strategy``, ``precision``, ``callback``) of the installed
    plugin ``name``; a name that is not installed, or that names plugins of two kinds, is a
    :class:`ptrain.ConfigError` saying what to do."""
    catalog = catalog if catalog is not None else Catalog.discover()
    kinds = sorted({info.kind for info in catalog.infos if info.name == name})
    if len(kinds) == 1:
        return kinds[0]
    if kinds:
        raise ConfigError(f"{name!r} names installed plugins of several kinds ({', '.join(kinds)});"
                          f" pass it by keyword instead: accelerator=, strategy=, precision= or "
                          f"callbacks=[...].")
    names = sorted({info.name for info in catalog.infos})
    raise PluginError(f"{name!r} is not an installed plugin of any kind.{closest(name, names)} "
                      f"Installed: {', '.join(names)}. Install its distribution (pip install -e "
                      f"DIR) so that its entry point is registered.")


def run_fit(*plugins: Any, module: TrainModule | None = None,
            root_dir: str | Path | None = None, max_epochs: int | None = 2,
            ckpt_path: str | Path | None = None, datamodule: DataModule | None = None,
            **trainer_options: Any) -> Trainer:
    """Fit ``module`` (a fresh :class:`~ptrain.testing.TinyModule` by default) on the CPU with
    ``plugins`` and return the trainer, fitted.

    ``plugins``: installed plugin names of any kind (an accelerator, strategy or precision name
    selects it; a callback name enables it), ``"no:NAME"`` to block a default callback, and
    callback objects. Give accelerator, strategy or precision *objects* by keyword
    (``precision=MyPrecision()``). ``trainer_options`` are :class:`ptrain.Trainer`'s keyword
    arguments, ``plugin_options={"name": {...}}`` included. Defaults differing from the
    Trainer's: ``accelerator="cpu"``, ``seed=0``, ``max_epochs=2`` and the progress bar, the
    TensorBoard logger and the model summary off unless named. Runs go under ``root_dir``
    (default: a new temporary folder, left in place for inspection).
    """
    catalog = trainer_options.pop("catalog", None) or Catalog.discover()
    options: dict[str, Any] = {"accelerator": "cpu", "seed": 0, **trainer_options}
    callbacks = list(options.pop("callbacks", None) or [])
    for plugin in plugins:
        if not isinstance(plugin, str) or plugin.startswith(_BLOCK):
            callbacks.append(plugin)
            continue
        kind = plugin_kind(plugin, catalog)
        if kind == "callback":
            callbacks.append(plugin)
        elif kind in trainer_options and trainer_options[kind] != plugin:
            raise ConfigError(f"two {kind} plugins were given: {plugin!r} and "
                              f"{kind}={trainer_options[kind]!r}; keep one.")
        else:
            options[kind] = plugin
    named = {c for c in callbacks if isinstance(c, str)}
    for quiet in QUIET_CALLBACKS:
        if quiet not in named and _BLOCK + quiet not in named:
            callbacks.append(_BLOCK + quiet)
    options["callbacks"] = callbacks
    if "default_root_dir" not in options:
        root = root_dir if root_dir is not None else tempfile.mkdtemp(prefix="ptrain-fit-")
        options["default_root_dir"] = str(root)
    options["max_epochs"] = max_epochs
    trainer = Trainer(catalog=catalog, **options)
    if module is None:
        from ptrain.testing.models import TinyModule

        module = TinyModule()
    trainer.fit(module, datamodule=datamodule,
                ckpt_path=str(ckpt_path) if ckpt_path is not None else None)
    return trainer


__all__ = ["QUIET_CALLBACKS", "plugin_kind", "run_fit"]
