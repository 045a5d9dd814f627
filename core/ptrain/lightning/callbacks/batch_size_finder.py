"""``lightning.pytorch.callbacks.batch_size_finder``: ``BatchSizeFinder``, over the
``batch-size-finder`` plugin of ``ptrain-finders``."""

from __future__ import annotations

from typing import Any

from ptrain_finders import BatchSizeFinder as _Finder

from ptrain.errors import ConfigError
from ptrain.hookspecs import hookimpl
from ptrain.lightning.callbacks._module_attribute import set_found_value


class BatchSizeFinder(_Finder):
    """Lightning's ``BatchSizeFinder``: the largest training batch size that fits, searched when
    ``fit`` starts, then trained with. ptrain's search doubles from ``init_val`` (at most
    ``max_trials`` times, up to ``max_val`` and the samples one process sees) and then bisects
    between the last size that fit and the first that did not (Lightning's ``binsearch``; with
    ``mode="power"`` Lightning keeps the last doubling that fit, ptrain refines it the same
    way). With ``binsearch`` the result is reduced by ``margin`` (0.05: 5%), as Lightning's.
    The training loader is rebuilt at the found size, and the module's (or datamodule's)
    ``batch_arg_name`` attribute, where it has one, is set to it. ``optimal_batch_size`` holds
    it after the search. Runs for ``fit`` only.
    """

    def __init__(self, mode: str = "power", steps_per_trial: int = 3, init_val: int = 2,
                 max_trials: int = 25, batch_arg_name: str = "batch_size", margin: float = 0.05,
                 max_val: int = 8192) -> None:
        if mode not in ("power", "binsearch"):
            raise ConfigError(f"BatchSizeFinder(mode={mode!r}) is not a mode; valid choices: "
                              f"'power', 'binsearch'.")
        if not 0 <= margin < 1:
            raise ConfigError(f"BatchSizeFinder(margin={margin}) must be in [0, 1): the share "
                              f"the found size is reduced by.")
        if max_trials < 1:
            raise ConfigError(f"BatchSizeFinder(max_trials={max_trials}) must be at least 1.")
        super().__init__(init=init_val, max_batch_size=max_val, steps_per_trial=steps_per_trial,
                         margin=1.0 - margin if mode == "binsearch" else 1.0,
                         max_growth=2 ** max_trials)
        self.mode, self.batch_arg_name = mode, batch_arg_name
        self.optimal_batch_size: int | None = init_val

    @hookimpl(specname="on_loop_start")
    def _tell_the_module(self, trainer: Any, loop: str) -> None:
        if loop == "fit" and self.batch_size is not None:
            self.optimal_batch_size = self.batch_size
            set_found_value(trainer, (self.batch_arg_name,), self.batch_size)


__all__ = ["BatchSizeFinder"]
