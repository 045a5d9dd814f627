"""What Lightning's file loggers (``TensorBoardLogger``, ``CSVLogger``) say about the run folder
ptrain chose: ``save_dir/name/version_N``, or the one their ``version`` names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ptrain import run_folder
from ptrain.errors import ConfigError
from ptrain.lightning._common import refuse_unless


class RunFolder:
    """``save_dir``, ``name``, ``root_dir``, ``version`` and ``log_dir`` of a file logger. The
    :class:`~ptrain.lightning.Trainer` makes ``root_dir`` the root of its run folders and sets
    ``_run_dir`` once a stage chose one."""

    _save_dir: str
    _name: str

    def _init_folder(self, owner: str, save_dir: Any, name: str | None, version: Any,
                     prefix: str) -> None:
        refuse_unless(owner, {"prefix": prefix}, {
            "prefix": ("", "metric names are published as logged; add the prefix to the names "
                           "in self.log"),
        })
        if version is not None and (isinstance(version, bool) or not isinstance(
                version, (int, str)) or version == "" or os.sep in str(version)):
            raise ConfigError(
                f"{owner}(version={version!r}): give the run folder's number (an int: "
                f"version_N) or name (text naming one folder under save_dir/name), or leave "
                f"version out for the next free version_N.")
        self._save_dir, self._name = os.fspath(save_dir), name or ""
        self._version = version
        self._run_dir: str | None = None  # set by the Trainer once a stage chose the folder

    @property
    def name(self) -> str:
        """The experiment's name: the folder under ``save_dir`` (``lightning_logs``)."""
        return self._name

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def root_dir(self) -> str:
        """The folder the ``version_N`` run folders go under."""
        return str(Path(self._save_dir) / self._name)

    @property
    def version(self) -> int | str:
        """The ``version`` given, else N of the run folder ``version_N``: the one the run
        writes to, or before the first stage the one it will choose (the next free one)."""
        if self._version is not None:
            return self._version
        return int(Path(self._folder()).name.rsplit("_", 1)[1])

    @property
    def _named_folder(self) -> Path | None:
        """The run folder the ``version`` given names (``version_N`` for an int), else
        ``None``: Lightning's logger writes there whether it holds an earlier run or not."""
        if self._version is None:
            return None
        return Path(self.root_dir) / (f"version_{self._version}"
                                      if isinstance(self._version, int) else self._version)

    @property
    def log_dir(self) -> str:
        """The run folder; before the first stage, the one it will choose (the next free
        ``version_N``), as Lightning's loggers name theirs before writing."""
        return self._folder()

    def _folder(self) -> str:
        if self._run_dir:
            return self._run_dir
        stage = getattr(self, "_stage_run_dir", None)  # set by the Logger while a stage runs
        if stage is not None and self._holds(stage):
            return str(stage)
        named = self._named_folder
        return str(named if named is not None else run_folder.next_free(Path(self.root_dir)))

    def _holds(self, run_dir: Any) -> bool:
        """Whether the run folder ``run_dir`` is this logger's: the one its ``version`` names,
        or without one any under its ``root_dir`` (the run's first file logger, or one with
        the same ``save_dir`` and ``name``)."""
        named = self._named_folder
        if named is not None:
            return os.path.abspath(named) == os.path.abspath(run_dir)
        return os.path.abspath(self.root_dir) == os.path.abspath(Path(run_dir).parent)

    def _writes_to(self, trainer: Any) -> Path:
        """The run folder where it is this logger's (:meth:`_holds`); else the one its
        ``version`` names, or a ``version_N`` of this logger's own under its ``root_dir`` (a
        second logger given another ``save_dir`` or ``name``, as Lightning's writes there),
        taken at its first stage and kept for the later ones."""
        if self._holds(trainer.run_dir):
            return Path(trainer.run_dir)
        if self._run_dir is None or not self._holds(self._run_dir):
            named = self._named_folder
            if named is not None:
                named.mkdir(parents=True, exist_ok=True)
            self._run_dir = str(named if named is not None
                                else run_folder.reserve(Path(self.root_dir)))
        return Path(self._run_dir)
