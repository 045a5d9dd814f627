"""Warnings that may be false alarms, and the switch that silences them."""

from __future__ import annotations

import warnings

from ptrain.data import DataLoaderWarning


class PossibleUserWarning(UserWarning):
    """A warning that may not apply to this program (Lightning's name)."""


def disable_possible_user_warnings(module: str = "") -> None:
    """Ignore warnings that may be false alarms: :class:`PossibleUserWarning` and ptrain's
    :class:`ptrain.data.DataLoaderWarning` (a loader setting that likely slows training, the
    warning Lightning gives as a possible user warning), from the modules whose name matches the
    regular expression ``module`` (default: all)."""
    for category in (PossibleUserWarning, DataLoaderWarning):
        warnings.filterwarnings("ignore", module=module, category=category)
