"""Smoke uses of ``ptrain.lightning.tuner`` (compared with Lightning's in
tests/test_lightning_components.py)."""

from __future__ import annotations

import torch

from lightning_names import refuses
from lightning_names._components import Regressor, trainer
from ptrain.lightning.tuner import Tuner


def _tuner():
    torch.manual_seed(0)
    module = Regressor(lr=0.01, batch_size=4)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    run = trainer(max_epochs=3)
    tuner = Tuner(run)
    found = tuner.lr_find(module, min_lr=1e-4, max_lr=1.0, num_training=20)
    assert len(found.results["lr"]) == len(found.results["loss"]) == 20
    assert found.results["lr"][-1] == torch.tensor(1.0).item() or \
        abs(found.results["lr"][-1] - 1.0) < 1e-9
    assert module.lr == found.suggestion() and module.hparams.lr == found.suggestion()
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    size = tuner.scale_batch_size(module, mode="power", max_trials=3)
    assert size == 8 and module.batch_size == 8 and module.hparams.batch_size == 8
    assert tuner.scale_batch_size(module, mode="binsearch", max_val=20, margin=0.1) == 18
    run.fit(module)  # the tuned run trains as usual
    assert run.global_step == 3 * 2  # batches of 18 and 14 per epoch
    refuses(lambda: tuner.lr_find(module, mode="linear"), "mode", "exponential")
    refuses(lambda: tuner.scale_batch_size(module, method="validate"), "method", "'fit'")


SMOKE = {"Tuner": _tuner}
