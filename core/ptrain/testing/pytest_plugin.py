"""The pytest plugin of the kit, loaded by pytest through ptrain-core's ``pytest11`` entry point
(named ``ptrain``; ``-p no:ptrain`` turns it off). It adds two fixtures:

- ``ptrain_fit(*plugins, **trainer_options)``: :func:`ptrain.testing.run_fit` with
  ``root_dir=tmp_path`` (run folders ``tmp_path/version_N``); returns the fitted
  :class:`ptrain.Trainer`;
- ``hook_recorder``: a fresh :class:`ptrain.testing.HookRecorder`.

Nothing heavy is imported until a fixture is used, so pytest starts as fast as without it.
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def ptrain_fit(tmp_path):
    """``ptrain_fit(*plugins, **trainer_options) -> Trainer``: a tiny fit on the CPU with the
    given plugins (see :func:`ptrain.testing.run_fit`), under ``tmp_path``."""
    from ptrain.testing.runs import run_fit

    def fit(*plugins: Any, **trainer_options: Any):
        trainer_options.setdefault("root_dir", tmp_path)
        return run_fit(*plugins, **trainer_options)

    return fit


@pytest.fixture
def hook_recorder():
    """A fresh :class:`ptrain.testing.HookRecorder`; pass it among the callbacks."""
    from ptrain.testing.recorder import HookRecorder

    return HookRecorder()
