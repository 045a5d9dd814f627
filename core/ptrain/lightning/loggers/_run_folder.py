"""What Lightning's file loggers (``TensorBoardLogger``, ``CSVLogger``) say about the run folder
ptrain chose: ``save_dir/name/version_N``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ptrain import run_folder
from ptrain.lightning._common import refuse_unless


class RunFolder:
    """``save_dir``, ``name``, ``root_dir``, ``version`` and ``log_dir`` of a file logger. The
    :class:`~ptrain.lightning.Trainer` makes ``root_dir`` the root of its run folders and sets
    ``_run_dir`` once a stage chose one."""

    _save_dir: str
    _name: str

    def _init_folder(self, owner: str, save_dir: Any, name: str | None, version: Any,
                     prefix: str) -> None:
        refuse_unless(owner, {"version": version, "prefix": prefix}, {
            "version": (None, "ptrain numbers the run folders itself (version_N, the next "
                              "free one); leave version out"),
            "prefix": ("", "metric names are published as logged; add the prefix to the names "
                           "in self.log"),
        })
        self._save_dir, self._name = os.fspath(save_dir), name or ""
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
    def version(self) -> int:
        """N of the run folder ``version_N``: the one the run writes to, or before the first
        stage the one it will choose (the next free one)."""
        return int(Path(self._folder()).name.rsplit("_", 1)[1])

    @property
    def log_dir(self) -> str:
        """The run folder; before the first stage, the one it will choose (the next free
        ``version_N``), as Lightning's loggers name theirs before writing."""
        return self._folder()

    def _folder(self) -> str:
        return self._run_dir or str(run_folder.next_free(Path(self.root_dir)))

    def _holds(self, run_dir: Any) -> bool:
        """Whether the run folder ``run_dir`` is under this logger's ``root_dir``: the run's
        first file logger, or one with the same ``save_dir`` and ``name``."""
        return os.path.abspath(self.root_dir) == os.path.abspath(Path(run_dir).parent)

    def _writes_to(self, trainer: Any) -> Path:
        """The run folder where it is under this logger's ``root_dir``; else a ``version_N`` of
        this logger's own there (a second logger given another ``save_dir`` or ``name``, as
        Lightning's writes there), taken at its first stage and kept for the later ones."""
        if self._holds(trainer.run_dir):
            return Path(trainer.run_dir)
        if self._run_dir is None or not self._holds(self._run_dir):
            self._run_dir = str(run_folder.reserve(Path(self.root_dir)))
        return Path(self._run_dir)
