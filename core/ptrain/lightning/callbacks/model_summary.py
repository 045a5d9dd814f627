"""``lightning.pytorch.callbacks.model_summary``: ``ModelSummary``, ptrain's ``model-summary``
callback with Lightning's arguments (``RichModelSummary`` is in ``rich_model_summary``)."""

from __future__ import annotations

from typing import Any

from ptrain.builtins.model_summary import ModelSummary as _Summary
from ptrain.errors import ConfigError
from ptrain.hook_methods import Callback
from ptrain.lightning._common import refuse


class ModelSummary(Callback, _Summary):
    """Lightning's ``ModelSummary``: ptrain's ``model-summary`` (it replaces the default one),
    the table of the module's layers to ``max_depth`` when ``fit`` starts, with trainable and
    non-trainable columns instead of Lightning's mode and FLOPs columns, and, for a module with
    an ``example_input_array``, Lightning's ``In sizes`` and ``Out sizes`` from one forward pass
    on it (eval mode, no autograd), which draws what Lightning's summary draws. Lightning's
    ``summarize_kwargs`` are refused, and so is a subclass overriding ``summarize`` (ptrain
    prints its own table). As Lightning's, it is a ``Callback`` whose ``on_fit_start`` prints
    the table: a subclass may override it (print a summary of its own, or call ``super()``)."""

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        if summarize_kwargs:
            argument = next(iter(summarize_kwargs))
            raise refuse(type(self).__name__, argument, summarize_kwargs[argument],
                         "ptrain's summary takes max_depth only")
        if callable(getattr(type(self), "summarize", None)):
            raise ConfigError(f"{type(self).__name__}.summarize overrides how Lightning's "
                              f"ModelSummary prints; ptrain's model-summary prints its own "
                              f"table and would not call it. Print your summary from a "
                              f"Callback's on_fit_start instead.")
        _Summary.__init__(self, max_depth=max_depth, example_sizes=True)  # Lightning's In/Out

    # Lightning's methods (the callback adapter calls them): the table is printed in
    # on_fit_start, as Lightning's is, so that a subclass's on_fit_start replaces it; ptrain's
    # setup hook of model-summary, which prints it otherwise, is shadowed by Lightning's setup

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Lightning's ``setup``: nothing."""

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Print the summary table (global rank 0)."""
        _Summary.setup(self, trainer, "fit")


__all__ = ["ModelSummary"]
