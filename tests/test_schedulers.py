"""LR schedulers that step on a monitored metric (``ReduceLROnPlateau``), Lightning's way: the
``monitor`` and ``strict`` keys of the scheduler dict."""

from __future__ import annotations

import pytest
import torch

import ptrain
from tests.conftest import TinyRegressor


class Plateau(TinyRegressor):
    """Logs a scripted ``score`` per validation; its scheduler halves the LR when it stalls."""

    def __init__(self, scores, monitor="score", strict=True, **kwargs):
        super().__init__(lr=1.0, **kwargs)
        self.scores, self.monitor, self.strict = list(scores), monitor, strict

    def validation_step(self, batch, batch_idx):
        if not self.trainer.sanity_checking:
            self.log("score", self.scores[self.trainer.current_epoch])

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5,
                                                           patience=0)
        entry = {"scheduler": sched, "monitor": self.monitor}
        if not self.strict:
            entry["strict"] = False
        return {"optimizer": opt, "lr_scheduler": entry}


class LRs:
    name = "lrs"

    def __init__(self):
        self.lrs = []

    @ptrain.hookimpl
    def on_epoch_end(self, trainer):
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


def fit(tmp_path, module, epochs):
    recorder = LRs()
    ptrain.Trainer(accelerator="cpu", max_epochs=epochs, default_root_dir=str(tmp_path),
                   callbacks=["no:progress-bar", "no:tensorboard", "no:checkpoint", recorder]
                   ).fit(module)
    return recorder.lrs


def test_reduce_lr_on_plateau_steps_on_the_monitored_metric(tmp_path):
    # improves, improves, stalls (halve), improves, stalls (halve)
    lrs = fit(tmp_path, Plateau([3.0, 2.0, 2.5, 1.0, 1.5]), epochs=5)
    assert lrs == [1.0, 1.0, 0.5, 0.5, 0.25]


def test_a_monitor_never_logged_is_an_error_or_with_strict_false_a_warning(tmp_path):
    with pytest.raises(ptrain.ModelError, match="monitors 'val_los', which was not logged; "
                                                "logged metrics: .*score"):
        fit(tmp_path, Plateau([3.0, 2.0], monitor="val_los"), epochs=2)
    with pytest.warns(RuntimeWarning, match="was not stepped"):
        lrs = fit(tmp_path, Plateau([3.0, 2.0], monitor="val_los", strict=False), epochs=2)
    assert lrs == [1.0, 1.0]


def test_reduce_lr_on_plateau_without_a_monitor_is_an_error(tmp_path):
    with pytest.raises(ptrain.ModelError, match="ReduceLROnPlateau steps on a metric"):
        fit(tmp_path, Plateau([1.0], monitor=None), epochs=1)
