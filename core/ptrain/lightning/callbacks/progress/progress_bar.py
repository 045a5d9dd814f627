"""``lightning.pytorch.callbacks.progress.progress_bar``: ``ProgressBar``, the base class of
progress displays, and the base of Lightning's two bars that ptrain's ``progress-bar`` draws."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ptrain.builtins.progress import ProgressBar as _Display
from ptrain.errors import ConfigError
from ptrain.hookspecs import hookimpl
from ptrain.lightning.callbacks._plugin_callback import PluginCallback


class ProgressBar(PluginCallback):
    """Lightning's ``ProgressBar``: subclass it for a display of your own, with Lightning's
    callback methods and ``disable()``/``enable()``. Given in ``callbacks`` it replaces ptrain's
    progress bar (its plugin name is ``progress-bar``), as in Lightning; on processes other than
    global rank 0 it is disabled at ``setup``."""

    plugin_name = "progress-bar"

    def __init__(self) -> None:
        self._trainer: Any = None
        self._enabled = True

    # -- what a display reads ------------------------------------------------------------------

    @property
    def trainer(self) -> Any:
        if self._trainer is None:
            raise AttributeError(f"{type(self).__name__}.trainer is set when a stage starts "
                                 f"(setup); it was read before.")
        return self._trainer

    sanity_check_description = "Sanity Checking"
    train_description = "Training"
    validation_description = "Validation"
    test_description = "Testing"
    predict_description = "Predicting"

    @property
    def total_train_batches(self) -> int | float:
        return self.trainer.num_training_batches

    @property
    def total_val_batches_current_dataloader(self) -> int | float:
        return self.trainer.num_eval_batches

    total_test_batches_current_dataloader = total_val_batches_current_dataloader
    total_predict_batches_current_dataloader = total_val_batches_current_dataloader

    @property
    def total_val_batches(self) -> int | float:
        """The batches of every validation dataloader in this epoch's validation (0 in an
        epoch that does not validate)."""
        trainer = self.trainer
        every = trainer.check_val_every_n_epoch
        if not trainer.enable_validation or (
                every is not None and (trainer.current_epoch + 1) % every != 0):
            return 0
        return sum(trainer.num_val_batches)

    @property
    def total_test_batches(self) -> int | float:
        return sum(self.trainer.num_test_batches)

    @property
    def total_predict_batches(self) -> int | float:
        return sum(self.trainer.num_predict_batches)

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    @property
    def is_disabled(self) -> bool:
        return not self.is_enabled

    def disable(self) -> None:
        """Show nothing (called on processes other than global rank 0)."""
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def print(self, *args: Any, **kwargs: Any) -> None:
        print(*args, **kwargs)

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, int | float | str]:
        """What the display shows beside the progress: the values logged with
        ``prog_bar=True`` and ``v_num``, the run folder's version number, as Lightning's."""
        metrics: dict[str, int | float | str] = dict(trainer.metrics.progress_values())
        folder = getattr(trainer, "run_dir", None)
        if folder is not None and getattr(trainer, "loggers", None):
            name = Path(folder).name
            if name.startswith("version_") and name[len("version_"):].isdigit():
                metrics["v_num"] = int(name[len("version_"):])
        return metrics

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._trainer = trainer
        if not trainer.is_global_zero:
            self.disable()


class _LightningDisplay(_Display):
    """ptrain's bar, showing what its Lightning owner's ``get_metrics`` gives."""

    def __init__(self, owner: ProgressBar, refresh_rate: float = 0.2):
        super().__init__(refresh_rate=refresh_rate)
        self.owner = owner

    def shown_metrics(self, trainer: Any) -> dict[str, float]:
        return self.owner.get_metrics(trainer, trainer.module)


class _PtrainBar(ProgressBar):
    """A Lightning progress bar class drawn by ptrain's ``progress-bar`` (rich, redrawn at most
    every 0.2 s on a terminal, a line per finished epoch). A subclass overriding the drawing
    methods of Lightning's class (``_drawing``) is refused: ptrain would not call them. The
    class that names ``_drawing`` may define them for a program to call itself."""

    _drawing: tuple[str, ...] = ()

    def __init__(self, refresh_rate: int) -> None:
        super().__init__()
        base = next(cls for cls in type(self).__mro__ if "_drawing" in vars(cls))
        drawn = [name for name in self._drawing
                 if getattr(type(self), name, None) is not getattr(base, name, None)]
        if drawn:
            raise ConfigError(
                f"{type(self).__name__}.{drawn[0]} overrides how Lightning's "
                f"{type(self).__mro__[1].__name__} draws, which ptrain's progress display "
                f"does not call, so it would be silently ignored. Override get_metrics to "
                f"change what the bar shows, or derive from ptrain.lightning.callbacks."
                f"ProgressBar and draw it yourself in the callback methods.")
        self.refresh_rate = refresh_rate
        self._display = _LightningDisplay(self)
        if refresh_rate == 0:
            self.disable()

    @hookimpl(specname="setup")
    def _display_setup(self, trainer: Any, stage: str) -> None:
        self._display.setup(trainer, stage)
        self._display.enabled = self._display.enabled and self.is_enabled

    @hookimpl(specname="on_epoch_start")
    def _display_epoch_start(self, trainer: Any) -> None:
        self._display.on_epoch_start(trainer)

    @hookimpl(specname="on_train_batch_end")
    def _display_train_batch(self, trainer: Any, batch: Any, batch_idx: int, loss: Any) -> None:
        self._display.on_train_batch_end(trainer, batch, batch_idx, loss)

    @hookimpl(specname="on_evaluation_batch_end")
    def _display_eval_batch(self, trainer: Any, stage: str, batch_idx: int) -> None:
        self._display.on_evaluation_batch_end(trainer, stage, batch_idx)

    @hookimpl(specname="on_epoch_end")
    def _display_epoch_end(self, trainer: Any) -> None:
        self._display.on_epoch_end(trainer)

    @hookimpl(specname="teardown")
    def _display_teardown(self, trainer: Any, stage: str) -> None:
        self._display.teardown(trainer, stage)


__all__ = ["ProgressBar"]
