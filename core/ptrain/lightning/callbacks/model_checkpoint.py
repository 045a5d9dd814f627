"""``lightning.pytorch.callbacks.model_checkpoint``: ``ModelCheckpoint``, Lightning's arguments
and attributes over ptrain's ``checkpoint`` callback (:mod:`ptrain.builtins.checkpoint`).

The signature keeps Lightning's annotations as types (no postponed annotations in this module):
LightningCLI and jsonargparse read them to parse ``--trainer.callbacks.save_last=link``.
"""

import math
import os
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, Optional, Union

import torch

from ptrain.builtins.checkpoint import ModelCheckpoint as _Checkpoint
from ptrain.builtins.checkpoint import link_or_copy
from ptrain.errors import ConfigError
from ptrain.hook_methods import CALLBACK_METHODS, overridden
from ptrain.hookspecs import hookimpl

_PATH = Union[str, Path]

#: the methods of Lightning's ModelCheckpoint that its saving goes through and ptrain's
#: checkpoint callback does not have: a subclass overriding one expects it to be called
_LIGHTNING_SAVING_METHODS = (
    "_save_topk_checkpoint", "_save_checkpoint", "_should_skip_saving_checkpoint",
    "_should_save_on_exception", "_should_save_on_train_epoch_end", "_save_last_checkpoint",
    "_save_monitor_checkpoint", "_save_none_monitor_checkpoint", "_update_best_and_save",
    "_should_remove_checkpoint", "_remove_checkpoint", "_monitor_candidates",
    "_get_metric_interpolated_filepath_name", "check_monitor_top_k", "file_exists")


class ModelCheckpoint(_Checkpoint):
    """Lightning's ``ModelCheckpoint``, as ptrain's ``checkpoint`` callback (it replaces the
    default one). As in Lightning: files go to ``dirpath``, by default the logger's
    ``<log_dir>/checkpoints``, or ``<default_root_dir>/checkpoints`` without a logger;
    ``save_last=None`` writes no ``last.ckpt``, ``True`` writes it beside each top-k file (not
    at a point whose monitored value is not kept) and ``"link"`` makes it a link to the newest
    top-k file; scores (``best_model_score``, ``current_score``, ``best_k_models``' values) are
    tensors; a filename field that was never logged shows 0 (said once); ``state_dict()`` and
    ``load_state_dict()`` are Lightning's (absolute paths, a changed ``dirpath`` restores only
    ``best_model_path``, with a warning). With ``save_weights_only=True`` the top-k files hold
    the weights only, and the full state for an exact resume is kept in a ``last.ckpt`` (said
    once, with where). ``save_on_exception`` writes the state at an error under the top-k name
    but leaves ``last.ckpt`` as the last state saved at a checkpoint point (said when it
    happens); nothing is written after a non-finite loss. The top-k record ptrain keeps for
    ``ckpt_path="best"`` (``best_k_models.json``) is written only in the run folder, never beside
    files in a ``dirpath``."""

    # Lightning warns about an unlogged monitor while no validation has run, and saves nothing
    stops_on_unlogged_monitor_without_validation = False

    def __init__(self, dirpath: Optional[_PATH] = None, filename: Optional[str] = None,
                 monitor: Optional[str] = None, verbose: bool = False,
                 save_last: Optional[Union[bool, Literal["link"]]] = None, save_top_k: int = 1,
                 save_on_exception: bool = False, save_weights_only: bool = False,
                 mode: str = "min", auto_insert_metric_name: bool = True,
                 every_n_train_steps: Optional[int] = None,
                 train_time_interval: Optional[timedelta] = None,
                 every_n_epochs: Optional[int] = None,
                 save_on_train_epoch_end: Optional[bool] = None,
                 enable_version_counter: bool = True):
        if mode not in ("min", "max"):
            raise ConfigError(f"ModelCheckpoint(mode={mode!r}): `mode` can be min or max (whether "
                              f"a lower or a higher monitored value is better).")
        self._train_time_interval = train_time_interval  # as given: part of the state key
        # Lightning's triggers: one of them (each epoch when none is given); ptrain's own
        # callback can combine them (ptrain.builtins.checkpoint.ModelCheckpoint)
        if every_n_train_steps is None and every_n_epochs is None and train_time_interval is None:
            every_n_epochs, every_n_train_steps = 1, 0
        every_n_epochs, every_n_train_steps = every_n_epochs or 0, every_n_train_steps or 0
        given = [f"{name}={value!r}" for name, value, on in (
            ("every_n_train_steps", every_n_train_steps, every_n_train_steps > 0),
            ("every_n_epochs", every_n_epochs, every_n_epochs > 0),
            ("train_time_interval", train_time_interval, train_time_interval is not None))
            if on]
        if len(given) > 1:
            raise ConfigError(
                f"ModelCheckpoint({', '.join(given)}): Lightning's ModelCheckpoint takes one of "
                f"these triggers, not several; give one (ptrain's own "
                f"ptrain.builtins.checkpoint.ModelCheckpoint combines them).")
        super().__init__(filename=filename, monitor=monitor, mode=mode, save_top_k=save_top_k,
                         save_last=save_last if save_last == "link" else bool(save_last),
                         every_n_epochs=every_n_epochs,
                         every_n_train_steps=every_n_train_steps,
                         train_time_interval=train_time_interval,
                         save_on_train_epoch_end=save_on_train_epoch_end,
                         auto_insert_metric_name=auto_insert_metric_name, dirpath=dirpath,
                         save_weights_only=save_weights_only,
                         save_on_exception=save_on_exception,
                         enable_version_counter=enable_version_counter, verbose=verbose)
        self.kth_value = torch.tensor(math.inf if mode == "min" else -math.inf)
        ignored = overridden(self, [*CALLBACK_METHODS, *_LIGHTNING_SAVING_METHODS],
                             ModelCheckpoint)
        if ignored:
            raise ConfigError(
                f"{type(self).__name__} overrides {', '.join(ignored)} of ModelCheckpoint, "
                f"which ptrain's checkpoint callback does not call (its behaviour is in "
                f"ptrain hooks), so that code would never run. Put it in a separate Callback "
                f"in Trainer(callbacks=...).")

    # -- Lightning's names ---------------------------------------------------------------------

    @property
    def state_key(self) -> str:
        """Where Lightning-format checkpoints keep this callback's state (``checkpoint["callbacks"]
        [state_key]``): the class and the options that tell two such callbacks apart."""
        return type(self).__qualname__ + repr({
            "monitor": self.monitor, "mode": self.mode,
            "every_n_train_steps": self.every_n_train_steps,
            "every_n_epochs": self.every_n_epochs,
            "train_time_interval": self._train_time_interval})

    @staticmethod
    def _link_checkpoint(trainer: Any, filepath: str, linkpath: str) -> None:
        """Make ``linkpath`` a link to ``filepath`` (a copy where links can't be made)."""
        if os.path.abspath(filepath) != os.path.abspath(linkpath):
            link_or_copy(filepath, linkpath)

    def _format_checkpoint_name(self, filename: Optional[str], metrics: dict,
                                prefix: Optional[str] = None,
                                auto_insert_metric_name: bool = True) -> str:
        name = self._format_name(filename or self._default_template(), dict(metrics),
                                 auto_insert_metric_name)
        return self.CHECKPOINT_JOIN_CHAR.join([prefix, name]) if prefix is not None else name

    # -- where ---------------------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any = None, stage: Optional[str] = None) -> None:
        """Lightning's ``setup(trainer, pl_module, stage)``, for a call of one's own: resolves
        ``dirpath`` as a run of that trainer would (ptrain calls :meth:`_ptrain_setup`)."""
        if trainer.run_dir is not None or stage is None:
            _Checkpoint.setup(self, trainer, stage or "fit")
            return
        own = self._own_folder(trainer)
        log_dir = trainer.log_dir
        if own is not None or log_dir is not None:
            self.dirpath = str(own if own is not None else Path(log_dir) / "checkpoints")

    def _find_last_checkpoints(self, trainer: Any) -> set:
        """The paths of the files in this callback's folder named as its ``last.ckpt``."""
        folder = self._own_folder(trainer) or Path(trainer.log_dir) / "checkpoints"
        return {os.path.normpath(p) for p in self._last_files(Path(folder))}

    @hookimpl(specname="setup")
    def _ptrain_setup(self, trainer: Any, stage: str) -> None:
        _Checkpoint.setup(self, trainer, stage)
        folder = Path(self.dirpath) if self.dirpath else None
        if stage == "fit" and self._writes and self.save_top_k != 0 and trainer.is_global_zero \
                and folder is not None and folder.is_dir() and any(folder.iterdir()):
            # said, as Lightning does, on a resume into that folder too; stacklevel=1 in a
            # hook: the warning is this callback's (its caller is pluggy)
            warnings.warn(f"the checkpoint folder {folder} already holds files; "
                          + ("a name of this run's that is taken there replaces that file."
                             if not self.enable_version_counter else
                             "a name of this run's that is taken there gets -v1, -v2..."),
                          stacklevel=1)

    def _newest_is_last(self) -> bool:
        return False  # Lightning writes the newest top-k file beside last.ckpt

    def _last_beside_topk_only(self) -> bool:
        # Lightning 2.6: save_last=True writes last.ckpt beside a kept top-k file only; "link"
        # follows the newest one anyway, and weights-only files keep ptrain's resumable last
        return self.save_last is True and not self.save_weights_only

    def _last_name_reserved(self) -> bool:
        # Lightning's top-k file takes any free name: `filename="last"` without save_last
        # (yoyodyne's config) writes last.ckpt, as no last.ckpt of the callback's own is kept
        return self._keeps_last

    def _own_folder(self, trainer: Any) -> Optional[Path]:
        """Lightning's: ``dirpath``; without it, ``<default_root_dir>/checkpoints`` when the run
        has no logger (with one, the run folder's ``checkpoints/``, as the logger's
        ``<save_dir>/<name>/<version>/checkpoints``: a folder of the callback's own where the
        logger was given its ``version``, which earlier runs may have written to)."""
        given = super()._own_folder(trainer)
        if given is not None:
            return given
        if not trainer.loggers:
            return Path(trainer.default_root_dir) / "checkpoints"  # Lightning's meaning
        named = getattr(trainer.loggers[0], "_named_folder", None)
        return None if named is None else named / "checkpoints"

    def _record_folder(self, trainer: Any) -> Optional[Path]:
        # a Lightning program finds only checkpoints in its folders: the record stays in the
        # run folder (ckpt_path="best" of the trainer that trained needs none)
        return None if self._own_folder(trainer) is not None else self._folder(trainer)

    # -- values --------------------------------------------------------------------------------

    def _kept_score(self, raw: Any, score: float) -> Any:
        """Lightning keeps scores as tensors (``best_model_score.item()``)."""
        if isinstance(raw, torch.Tensor) and not math.isinf(score):
            return raw.detach().to("cpu", copy=True)
        return torch.tensor(score)

    def _missing_field(self, template: str, name: str, metrics: dict) -> Any:
        self._say_once(f"field {name}", (
            f"ModelCheckpoint filename {template!r} names {name!r}, which was not logged, so "
            f"the name shows {name}=0 as in Lightning; log it with self.log({name!r}, ...) "
            f"or change the filename."))
        return 0

    # -- state, as Lightning's ----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The callback's state as Lightning's ``ModelCheckpoint.state_dict()`` gives it
        (absolute paths, ``dirpath``); what its checkpoints hold."""
        return {"monitor": self.monitor, "best_model_score": self.best_model_score,
                "best_model_path": self.best_model_path, "current_score": self.current_score,
                "dirpath": self.dirpath, "best_k_models": self.best_k_models,
                "kth_best_model_path": self.kth_best_model_path, "kth_value": self.kth_value,
                "last_model_path": self.last_model_path}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s result. Written for another ``dirpath``, only
        ``best_model_path`` is restored (said), as in Lightning."""
        saved_dirpath = state_dict.get("dirpath", self.dirpath)
        if saved_dirpath == self.dirpath:
            self.best_model_score = state_dict["best_model_score"]
            self.kth_best_model_path = state_dict.get("kth_best_model_path",
                                                      self.kth_best_model_path)
            self.kth_value = state_dict.get("kth_value", self.kth_value)
            self.best_k_models = state_dict.get("best_k_models", self.best_k_models)
            self.last_model_path = state_dict.get("last_model_path", self.last_model_path)
        else:
            warnings.warn(
                f"The dirpath has changed from {saved_dirpath!r} to {self.dirpath!r}, so only "
                f"best_model_path is restored from the checkpoint; best_model_score, "
                f"best_k_models, kth_best_model_path, kth_value and last_model_path start "
                f"anew.", stacklevel=2)
        self.best_model_path = state_dict["best_model_path"]

    @hookimpl(specname="state_dict")
    def _checkpoint_state(self, trainer: Any) -> dict[str, Any]:
        """:meth:`state_dict` and, as ptrain's callback, the files due for deletion (absolute
        paths, as Lightning's): Lightning's ``load_state_dict`` reads its keys only."""
        return {**self.state_dict(), "due_for_deletion": self._due_state(str)}

    @hookimpl(specname="load_state_dict")
    def _restore_state(self, trainer: Any, state: dict[str, Any]) -> None:
        if "dirpath" not in state:  # written by ptrain's own checkpoint callback
            super()._restore_state(trainer, state)
            return
        self.dirpath = str(self._folder(trainer))  # Lightning restores after setup resolved it
        self.load_state_dict(state)
        self._restore_due(trainer, state.get("due_for_deletion", {}), str)
        if trainer.stage_call == "fit" and state.get("dirpath") == self.dirpath:
            self._due_if_unknown(trainer)


__all__ = ["ModelCheckpoint"]
