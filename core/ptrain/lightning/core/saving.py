"""``lightning.pytorch.core.saving``: hyperparameters to and from the ``hparams.yaml`` files
Lightning's loggers write (``save_hparams_to_yaml``, ``load_hparams_from_yaml``). They need
PyYAML (``pip install pyyaml``); ptrain's own run folder keeps them as ``hparams.toml``.
Also ``get_filesystem``, which Lightning's module re-exports and programs import from here."""

from __future__ import annotations

import argparse
import enum
import warnings
from pathlib import Path
from typing import Any

from ptrain.errors import ModelError


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise ModelError("hparams.yaml files need PyYAML: pip install pyyaml (ptrain's run "
                         "folder keeps the hyperparameters in hparams.toml without it).") from None
    return yaml


def _omegaconf(value: Any) -> bool:
    return type(value).__module__.startswith("omegaconf")


def _plain(value: Any) -> Any:
    """``value`` as YAML's safe dumper takes it: an enum member as its name, tuples as lists."""
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def save_hparams_to_yaml(config_yaml: Any, hparams: Any, use_omegaconf: bool = True) -> None:
    """Write ``hparams`` (a dict, ``argparse.Namespace``, ``AttributeDict`` or OmegaConf
    container) to the YAML file ``config_yaml``. A value YAML can't hold safely is left out,
    with a warning naming it."""
    yaml = _yaml()
    path = Path(config_yaml)
    if not path.parent.is_dir():
        raise ModelError(f"save_hparams_to_yaml: the folder {str(path.parent)!r} does not "
                         f"exist; create it first.")
    if isinstance(hparams, argparse.Namespace):
        hparams = vars(hparams)
    if _omegaconf(hparams):
        from omegaconf import OmegaConf

        if use_omegaconf:
            OmegaConf.save(hparams, path, resolve=True)
            return
        hparams = OmegaConf.to_container(hparams, resolve=True)
    if not isinstance(hparams, dict):
        raise ModelError(f"save_hparams_to_yaml takes a dict, an argparse.Namespace or an "
                         f"OmegaConf container of hyperparameters, not "
                         f"{type(hparams).__qualname__}.")
    kept = {}
    for key, value in hparams.items():
        value = _plain(value)
        try:
            yaml.safe_dump(value)
        except yaml.YAMLError:
            warnings.warn(f"save_hparams_to_yaml leaves {key!r} (a {type(value).__qualname__}) "
                          f"out of {path.name}: YAML can hold plain values, lists and dicts "
                          f"safely, not this object.", UserWarning, stacklevel=2)
            continue
        kept[key] = value
    path.write_text(yaml.safe_dump(kept, sort_keys=False), encoding="utf-8")


def load_hparams_from_yaml(config_yaml: Any, use_omegaconf: bool = True) -> Any:
    """The hyperparameters in the YAML file ``config_yaml`` as a dict (an OmegaConf
    ``DictConfig`` when OmegaConf is installed and ``use_omegaconf``); ``{}`` when the file is
    missing, with a warning."""
    yaml = _yaml()
    path = Path(config_yaml)
    if not path.is_file():
        warnings.warn(f"load_hparams_from_yaml: no file at {str(path)!r}; no hyperparameters "
                      f"read.", RuntimeWarning, stacklevel=2)
        return {}
    loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if use_omegaconf:
        try:
            from omegaconf import OmegaConf
        except ImportError:
            return loaded
        return OmegaConf.create(loaded)
    return loaded


def get_filesystem(path: Any, **kwargs: Any) -> Any:
    """The ``fsspec`` filesystem that holds ``path`` (a local path or a URL such as
    ``s3://bucket/x``; ``kwargs`` go to that filesystem), as Lightning's ``get_filesystem``
    returns it. Needs ``fsspec`` (``pip install fsspec``)."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise ModelError(f"get_filesystem({str(path)!r}) needs fsspec: pip install fsspec.") \
            from None
    return url_to_fs(str(path), **kwargs)[0]


__all__ = ["get_filesystem", "load_hparams_from_yaml", "save_hparams_to_yaml"]
