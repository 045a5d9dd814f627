"""Smoke uses of ``ptrain.lightning.utilities`` (compared with Lightning's in
tests/test_lightning_components.py)."""

from __future__ import annotations

import pickle
import threading
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader

from ptrain.data import DataLoaderWarning
from ptrain.lightning import utilities as u


def _attribute_dict():
    d = u.AttributeDict(lr=0.1, name="x")
    d.layers = 3
    assert d["layers"] == 3 and d.lr == 0.1
    assert repr(d).splitlines()[0].startswith('"layers":')
    del d.name
    assert "name" not in d


def _combined_loader():
    loaders = {"a": DataLoader(range(6), batch_size=4), "b": DataLoader(range(15), batch_size=5)}
    combined = u.CombinedLoader(loaders, "max_size_cycle")
    iter(combined)
    assert len(combined) == 3
    batches = [batch for batch, _, _ in combined]
    assert batches[2]["a"].tolist() == [0, 1, 2, 3] and batches[2]["b"].tolist() == [10, 11, 12,
                                                                                      13, 14]
    from lightning_names._components import Regressor, trainer

    seen = []

    class TwoSources(Regressor):
        def training_step(self, batch, batch_idx):
            seen.append(sorted(batch))
            return super().training_step(batch["a"], batch_idx) + \
                super().training_step(batch["b"], batch_idx)

    module = TwoSources()
    run = trainer()
    run.fit(module, u.CombinedLoader({"a": DataLoader(module.data, batch_size=8),
                                      "b": DataLoader(module.data, batch_size=16)}, "min_size"))
    assert seen == [["a", "b"]] * 2 and run.global_step == 2


def _epsilons():
    for eps, dtype in ((u.FLOAT16_EPSILON, torch.float16), (u.FLOAT32_EPSILON, torch.float32),
                       (u.FLOAT64_EPSILON, torch.float64)):
        one = torch.tensor(1.0, dtype=dtype)
        assert one + eps != one and one + eps / 4 == one


def _enums():
    assert u.GradClipAlgorithmType("norm") == "NORM"
    assert u.GradClipAlgorithmType.from_str("value") is u.GradClipAlgorithmType.VALUE
    assert u.GradClipAlgorithmType.supported_types() == ["value", "norm"]
    assert issubclass(u.GradClipAlgorithmType, u.LightningEnum)
    assert len({u.GradClipAlgorithmType.NORM, "norm"}) == 1


def _possible_user_warnings():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        u.disable_possible_user_warnings()
        warnings.warn("slow loader", DataLoaderWarning)
        warnings.warn("other", UserWarning)
    assert [str(w.message) for w in seen] == ["other"]


def _shared_parameters():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[1].weight = model[0].weight
    shared = u.find_shared_parameters(model)
    assert shared == [["0.weight", "1.weight"]]
    model[1].weight = nn.Parameter(model[0].weight.detach().clone())
    assert u.find_shared_parameters(model) == []
    u.set_shared_parameters(model, shared)
    assert model[1].weight is model[0].weight


def _grad_norm():
    model = nn.Linear(3, 1)
    model(torch.ones(2, 3)).sum().backward()
    norms = u.grad_norm(model, 2)
    assert set(norms) == {"grad_2.0_norm/weight", "grad_2.0_norm/bias", "grad_2.0_norm_total"}
    assert torch.isclose(norms["grad_2.0_norm/bias"], torch.tensor(2.0))


def _picklable():
    assert u.is_picklable({"a": 1}) and not u.is_picklable(threading.Lock())
    assert not u.is_picklable(lambda: 0)
    pickle.dumps(u.AttributeDict(a=1))


def _shared_filesystem():
    assert u.is_shared_filesystem(None) is True  # one process


def _measure_flops():
    with torch.device("meta"):
        model = nn.Linear(8, 4, bias=False)
        x = torch.randn(2, 8)
    assert u.measure_flops(model, lambda: model(x)) == 2 * 2 * 8 * 4
    forward_and_weight_grads = 2 * (2 * 2 * 8 * 4)
    assert u.measure_flops(model, lambda: model(x), lambda y: y.sum()) == forward_and_weight_grads


def _move_data_to_device():
    batch = {"x": torch.ones(2), "meta": ["a", (torch.zeros(1),)]}
    moved = u.move_data_to_device(batch, "meta")
    assert moved["x"].is_meta and moved["meta"][1][0].is_meta and moved["meta"][0] == "a"


def _rank_zero():
    calls = []
    u.rank_zero_only(calls.append)(1)
    u.rank_zero_only.rank = 1
    try:
        assert u.rank_zero_only(calls.append, default="skipped")(2) == "skipped"
    finally:
        u.rank_zero_only.rank = None
    assert calls == [1] and u.rank_zero_only.rank == 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        u.rank_zero_warn("careful")
        u.rank_zero_deprecation("old")
    assert [str(w.message) for w in seen] == ["careful", "old"]
    assert issubclass(seen[1].category, DeprecationWarning)
    u.rank_zero_info("said once")


def _workers():
    import os

    assert 1 <= u.suggested_max_num_workers(1) <= max(1, len(os.sched_getaffinity(0)) - 1)


SMOKE = {
    "AttributeDict": _attribute_dict,
    "CombinedLoader": _combined_loader,
    "FLOAT16_EPSILON": _epsilons,
    "FLOAT32_EPSILON": _epsilons,
    "FLOAT64_EPSILON": _epsilons,
    "GradClipAlgorithmType": _enums,
    "LightningEnum": _enums,
    "disable_possible_user_warnings": _possible_user_warnings,
    "find_shared_parameters": _shared_parameters,
    "set_shared_parameters": _shared_parameters,
    "grad_norm": _grad_norm,
    "is_picklable": _picklable,
    "is_shared_filesystem": _shared_filesystem,
    "measure_flops": _measure_flops,
    "move_data_to_device": _move_data_to_device,
    "rank_zero_deprecation": _rank_zero,
    "rank_zero_info": _rank_zero,
    "rank_zero_only": _rank_zero,
    "rank_zero_warn": _rank_zero,
    "suggested_max_num_workers": _workers,
}
