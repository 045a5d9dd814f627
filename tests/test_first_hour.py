"""What a newcomer runs into in a first hour with ptrain, each named where it was silent or
confusing: a resume that trains nothing, a duration given as ``1h``, a folder of checkpoints
given as one checkpoint, a flag's bad value blamed on ``Trainer(...)``, an init argument of the
wrong type."""

from __future__ import annotations

import warnings

import pytest

from conftest import TinyRegressor


def test_resuming_a_checkpoint_already_at_max_epochs_says_nothing_is_trained(make_trainer):
    """``ptrain fit --ckpt-path last`` with the --max-epochs of the run it resumes (or less)
    printed "Training finished" in 0.0 s and trained nothing, without a word."""
    make_trainer(max_epochs=2).fit(TinyRegressor())
    with pytest.warns(UserWarning, match=r"has trained 2 epoch\(s\), 16 step\(s\), which "
                                         r"already reaches max_epochs=1, so nothing is "
                                         r"trained.*Raise max_epochs \(--max-epochs\)"):
        make_trainer(max_epochs=1).fit(TinyRegressor(), ckpt_path="last")
    with warnings.catch_warnings():  # a limit above what it has trained: it trains, unsaid
        warnings.simplefilter("error")
        trainer = make_trainer(max_epochs=3)
        trainer.fit(TinyRegressor(), ckpt_path="last")
    assert trainer.global_step == 24

