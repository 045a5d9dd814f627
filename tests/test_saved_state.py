"""What is saved can be loaded (issue 21): a plugin whose ``state_dict`` holds something the
weights-only loader refuses is named at the first save, before training goes on, and no
checkpoint is written; a plugin with plain state saves and resumes as before. What a resume
does with values changed since the checkpoint: test_resume_changes.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import ptrain
from conftest import TinyRegressor
from ptrain.checkpoint_io import safe_load


class Opaque:
    """An object of a class of the user's own: a checkpoint holding it can't be loaded safely."""

    def __init__(self, value):
        self.value = value


class StatefulCallback:
    name = "stateful"

    def __init__(self, state):
        self.state = state
        self.batches_after_first_save = 0

    @ptrain.hookimpl
    def state_dict(self, trainer):
        return self.state

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer):
        if trainer.global_step > 2:
            self.batches_after_first_save += 1


def test_unloadable_plugin_state_is_named_at_the_first_save(make_trainer, tmp_path):
    callback = StatefulCallback({"history": [Opaque(1)]})
    trainer = make_trainer(max_epochs=3, callbacks=["no:progress-bar", callback],
                           plugin_options={"checkpoint": {"every_n_train_steps": 2}})
    with pytest.raises(ptrain.PluginError) as refused:
        trainer.fit(TinyRegressor())
    message = str(refused.value)
    assert "plugin 'stateful'" in message and "Opaque" in message
    assert "could never be resumed" in message
    assert trainer.global_step == 2  # stopped at the first save: no training went on
    assert callback.batches_after_first_save == 0
    assert not list(Path(tmp_path / "runs").rglob("*.ckpt"))


def test_an_object_of_a_class_the_loader_refuses_to_build_is_named(make_trainer, tmp_path):
    # a NumPy string dtype (pytorch-forecasting's encoders hold them): torch refuses to build
    # it ("Can only build ... but got <class ...>"), a reason the message left out (it gave
    # only the first line of torch's, which names nothing)
    import numpy as np

    trainer = make_trainer(max_epochs=1, callbacks=["no:progress-bar",
                                                    StatefulCallback({"kind": np.dtype("U5")})])
    with pytest.raises(ptrain.PluginError) as refused:
        trainer.fit(TinyRegressor())
    assert ("it holds numpy.dtypes.StrDType, which the weights-only loader refuses"
            in str(refused.value))


def test_plain_plugin_state_is_saved_and_read_back(make_trainer, tmp_path):
    trainer = make_trainer(max_epochs=1, callbacks=["no:progress-bar",
                                                    StatefulCallback({"seen": [1, 2.5, "x"]})])
    trainer.fit(TinyRegressor())
    saved = safe_load(trainer.last_checkpoint_path)
    assert saved["plugins"]["stateful"] == {"seen": [1, 2.5, "x"]}
