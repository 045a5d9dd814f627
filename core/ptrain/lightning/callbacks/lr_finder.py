"""``lightning.pytorch.callbacks.lr_finder``: ``LearningRateFinder``, over the ``lr-finder``
plugin of ``ptrain-finders``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ptrain_finders import LRFinder as _Finder

from ptrain.hookspecs import hookimpl
from ptrain.lightning.callbacks._module_attribute import set_found_value
from ptrain.lightning._common import refuse


class LearningRateFinder(_Finder):
    """Lightning's ``LearningRateFinder``: the LR range test when ``fit`` starts, from
    ``min_lr`` to ``max_lr`` over ``num_training_steps`` steps (stopped once the smoothed loss
    passes ``early_stop_threshold`` x its minimum; ``None``: never), then training at the
    suggested rate (every param group scaled by one factor; with ``attr_name``, or the module's
    ``lr``/``learning_rate``, that attribute set too). ``optimal_lr`` holds the result
    (``results``, ``suggestion()``, ``plot()``).

    ptrain's test and its suggestion rule are the ``lr-finder`` plugin's (see its card): the
    suggestion is where the smoothed loss falls fastest before its minimum, which is
    Lightning's idea with other smoothing, so the two suggest close but not equal rates.
    ``mode="linear"`` and ``update_attr=False`` (test, then train at the configured rate) are
    refused.
    """

    def __init__(self, min_lr: float = 1e-8, max_lr: float = 1, num_training_steps: int = 100,
                 mode: str = "exponential", early_stop_threshold: float | None = 4.0,
                 update_attr: bool = True, attr_name: str = "") -> None:
        if mode != "exponential":
            raise refuse("LearningRateFinder", "mode", mode,
                         "ptrain's test raises the rate exponentially; use mode='exponential'")
        if update_attr is not True:
            raise refuse("LearningRateFinder", "update_attr", update_attr,
                         "ptrain trains with the suggestion; to only look at the curve, use "
                         "the lr-finder plugin with then='stop'")
        super().__init__(min_lr=min_lr, max_lr=max_lr, num_steps=num_training_steps,
                         diverge_factor=math.inf if early_stop_threshold is None
                         else early_stop_threshold)
        self.attr_name = attr_name
        self.optimal_lr: _Result | None = None

    @hookimpl(specname="on_loop_start")
    def _tell_the_module(self, trainer: Any, loop: str) -> None:
        # a search, or a resume of a run that trains at the suggestion its checkpoint holds
        # (whose result then has no curve: the search was the first run's)
        if loop != "fit" or not (self.lrs or self.suggestion is not None):
            return
        self.optimal_lr = _Result(self, Path(trainer.log_dir))
        if self.suggestion is not None:
            names = (self.attr_name,) if self.attr_name else ("lr", "learning_rate")
            set_found_value(trainer, names, self.suggestion)


class _Result:
    """Lightning's ``_LRFinder`` result: ``results`` (``lr``, ``loss``: the smoothed losses),
    ``suggestion()`` and ``plot()``."""

    def __init__(self, finder: _Finder, folder: Path):
        self.results = {"lr": list(finder.lrs), "loss": list(finder.smoothed)}
        self._finder, self._folder = finder, folder

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The suggested rate, by ptrain's rule (which leaves out the points before the moving
        average settles itself: other ``skip_begin``/``skip_end`` are refused)."""
        if (skip_begin, skip_end) != (10, 1):
            raise refuse("optimal_lr.suggestion", "skip_begin/skip_end",
                         (skip_begin, skip_end), "ptrain's suggestion rule chooses the points "
                         "it leaves out itself; call suggestion() without them")
        return self._finder.suggestion

    def plot(self, suggest: bool = False, show: bool = False, ax: Any = None) -> Any:
        """The curve as a matplotlib figure (with the suggestion marked when ``suggest``)."""
        from matplotlib.figure import Figure

        figure = ax.figure if ax is not None else Figure(figsize=(7, 4.5))
        axes = ax if ax is not None else figure.add_subplot()
        axes.plot(self.results["lr"], self.results["loss"])
        axes.set_xscale("log")
        axes.set_xlabel("Learning rate")
        axes.set_ylabel("Loss")
        if suggest and self._finder.suggestion is not None:
            at = self.results["lr"].index(self._finder.suggestion)
            axes.plot(self._finder.suggestion, self.results["loss"][at], markersize=10,
                      marker="o", color="red")
        if show:
            import matplotlib.pyplot as plt

            plt.show()
        return figure


__all__ = ["LearningRateFinder"]
