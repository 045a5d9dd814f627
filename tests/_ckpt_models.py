"""A plugin for the checkpoint-callback tests that must travel to spawned ddp workers (so it lives in
an importable module): it writes what each rank's ``checkpoint`` callback ended with."""

from __future__ import annotations

import json
from pathlib import Path

import ptrain
from tests.conftest import TinyRegressor


class TopKRecorder:
    """At the end of ``fit``, writes ``<record_dir>/rank<R>.json``: the rank's ``checkpoint``
    callback's ``best_k_models`` (file names -> scores), best and kth file names, and best score."""

    name = "topk-recorder"

    def __init__(self, record_dir: str):
        self.record_dir = record_dir

    @ptrain.hookimpl
    def teardown(self, trainer, stage):
        if stage != "fit":
            return
        callback = trainer.plugins["checkpoint"]
        state = {"best_k_models": {Path(p).name: s for p, s in callback.best_k_models.items()},
                 "best_model_path": Path(callback.best_model_path).name,
                 "kth_best_model_path": Path(callback.kth_best_model_path).name,
                 "best_model_score": callback.best_model_score}
        path = Path(self.record_dir) / f"rank{trainer.global_rank}.json"
        path.write_text(json.dumps(state), encoding="utf-8")


class MetaHeavyRegressor(TinyRegressor):
    """TinyRegressor with a hyperparameter of ``size`` numbers, so that everything of its
    checkpoints but the weights (a sharded folder's ``meta.pt``) is larger than its shards."""

    def __init__(self, size: int = 250_000, n: int = 2048):
        super().__init__(n=n)
        self.save_hyperparameters({"table": [0.5] * size})
