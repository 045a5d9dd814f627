"""``ptrain.lightning``'s accelerators, strategies, plugins, profilers, tuner and utilities,
beyond their smoke uses (tests/lightning_names): each against Lightning 2.6.6 (installed as the
oracle) on the same inputs, or training for real where the object selects a ptrain plugin."""

from __future__ import annotations

import collections
import dataclasses
import random
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import lightning.pytorch.utilities as lightning_utilities
import ptrain.lightning.utilities as ptrain_utilities

Pair = collections.namedtuple("Pair", "x y")


@dataclasses.dataclass
class Record:
    x: torch.Tensor
    label: str


class Movable:
    def __init__(self):
        self.moved_to = None

    def to(self, device):
        self.moved_to = torch.device(device)
        return self


# -- utilities ----------------------------------------------------------------------------------


def _loader_collections():
    return [
        {"a": DataLoader(range(6), batch_size=4), "b": DataLoader(range(15), batch_size=5)},
        [DataLoader(range(6), batch_size=4), [DataLoader(range(15), batch_size=5),
                                              DataLoader(range(3))]],
        Pair(DataLoader(range(6), batch_size=4), {"z": DataLoader(range(15), batch_size=5)}),
        DataLoader(range(5), batch_size=2),
        [[1, 2, 3], [4, 5]],
    ]


def _passes(cls, iterables, mode, limits):
    combined = cls(iterables, mode)
    if limits is not None:
        combined.limits = limits
    iter(combined)
    length = len(combined)
    return length, [(repr(batch), idx, loader_idx) for batch, idx, loader_idx in combined]


@pytest.mark.parametrize("mode", ["min_size", "max_size_cycle", "max_size", "sequential"])
@pytest.mark.parametrize("case", range(5))
@pytest.mark.parametrize("limits", [None, 1, "two each"])
def test_combined_loader_iterates_as_lightnings(mode, case, limits):
    count = len(ptrain_utilities.CombinedLoader(_loader_collections()[case]).flattened)
    limits = [2] * count if limits == "two each" else limits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's pytree use warns on this torch
        expected = _passes(lightning_utilities.CombinedLoader, _loader_collections()[case], mode,
                           limits)
    assert _passes(ptrain_utilities.CombinedLoader, _loader_collections()[case], mode,
                   limits) == expected


def test_combined_loader_refuses_what_lightnings_refuses():
    with pytest.raises(ValueError, match="Unsupported mode"):
        ptrain_utilities.CombinedLoader([], "longest")
    combined = ptrain_utilities.CombinedLoader([DataLoader(range(4))])
    with pytest.raises(RuntimeError, match="iter"):
        len(combined)
    with pytest.raises(ValueError, match="limits"):
        combined.limits = [1, 2]
    combined.flattened = [DataLoader(range(2))]
    assert [[t.tolist() for t in b] for b, _, _ in combined] == [[[0]], [[1]]]


def test_grad_norm_and_shared_parameters_match_lightnings():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 3), nn.Linear(3, 3))
    model[3].weight = model[2].weight
    model(torch.randn(5, 4)).pow(2).sum().backward()
    for norm in (1, 2.0, "inf", 3):
        ours, theirs = (m.grad_norm(model, norm, group_separator="|")
                        for m in (ptrain_utilities, lightning_utilities))
        assert ours.keys() == theirs.keys()
        for key in ours:
            torch.testing.assert_close(ours[key], theirs[key])
    with pytest.raises(ValueError, match="norm_type"):
        ptrain_utilities.grad_norm(model, 0)
    assert (ptrain_utilities.find_shared_parameters(model)
            == lightning_utilities.find_shared_parameters(model) == [["2.weight", "3.weight"]])


def test_move_data_to_device_walks_what_lightnings_walks():
    batch = {"pair": Pair(torch.ones(2), [torch.zeros(1), "text", 3]),
             "record": Record(torch.ones(1), "r"),
             "counts": collections.defaultdict(int, {"n": torch.ones(1)}),
             "ordered": collections.OrderedDict(t=torch.ones(1))}
    ours = ptrain_utilities.move_data_to_device(batch, "meta")
    theirs = lightning_utilities.move_data_to_device(batch, "meta")
    assert repr(ours) == repr(theirs)
    assert ours["pair"].x.is_meta and ours["record"].x.is_meta and ours["record"].label == "r"
    assert type(ours["counts"]) is collections.defaultdict and ours["counts"]["missing"] == 0
    thing = Movable()
    assert ptrain_utilities.move_data_to_device([thing], "meta")[0] is thing
    assert thing.moved_to == torch.device("meta")


def test_attribute_dict_enums_and_picklable_match_lightnings():
    values = {"learning_rate": 0.1, "b": "abc", "layers": [1, 2]}
    assert repr(ptrain_utilities.AttributeDict(values)) == repr(
        lightning_utilities.AttributeDict(values))
    assert repr(ptrain_utilities.AttributeDict()) == repr(lightning_utilities.AttributeDict())
    for source in ("key", "value", "any"):
        for text in ("norm", "NORM", "Value", "nope"):
            results = []
            for enum in (ptrain_utilities.GradClipAlgorithmType,
                         lightning_utilities.GradClipAlgorithmType):
                try:
                    results.append(enum.from_str(text, source).value)
                except ValueError as exc:
                    results.append(str(exc))
            assert results[0] == results[1]
    for thing in (1, lambda: 1, {"a": [1]}, nn.Linear(1, 1), (x for x in ())):
        assert ptrain_utilities.is_picklable(thing) == lightning_utilities.is_picklable(thing)


def test_measure_flops_and_workers_match_lightnings():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        x = torch.randn(3, 16)
    for loss in (None, lambda y: y.sum()):
        assert ptrain_utilities.measure_flops(model, lambda: model(x), loss) == \
            lightning_utilities.measure_flops(model, lambda: model(x), loss)
    for processes in (1, 2, 3):
        assert ptrain_utilities.suggested_max_num_workers(processes) == \
            lightning_utilities.suggested_max_num_workers(processes)
    with pytest.raises(ValueError, match="local_world_size"):
        ptrain_utilities.suggested_max_num_workers(0)


def test_rank_zero_warnings_point_at_the_caller_as_lightnings_do():
    from ptrain.lightning.utilities.rank_zero import WarningCache

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ptrain_utilities.rank_zero_warn("w")
        ptrain_utilities.rank_zero_deprecation("d")
        cache = WarningCache()
        cache.warn("once")
        cache.warn("once")
    assert [w.filename for w in seen] == [__file__] * 3
    assert [str(w.message) for w in seen] == ["w", "d", "once"]


def test_isolate_rng_puts_every_generator_back():
    from ptrain.lightning.utilities.seed import isolate_rng, seed_everything

    seed_everything(1)
    with isolate_rng():
        inside = (torch.rand(2), random.random())
    after = (torch.rand(2), random.random())
    assert torch.equal(inside[0], after[0]) and inside[1] == after[1]


def test_model_summary_reads_as_lightnings():
    from lightning.pytorch.utilities.model_summary import ModelSummary as LightningSummary

    from ptrain.lightning.utilities.model_summary import ModelSummary

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
            self.head = nn.Linear(4, 2)
            self.head.bias.requires_grad_(False)
            self.example_input_array = torch.zeros(3, 8)

        def forward(self, x):
            return self.head(self.encoder(x))

    import lightning.pytorch as lightning

    class LightningNet(Net, lightning.LightningModule):
        pass

    for depth in (0, 1, 2, -1):
        ours, theirs = ModelSummary(Net(), depth), LightningSummary(LightningNet(), depth)
        for attribute in ("layer_names", "layer_types", "param_nums", "in_sizes", "out_sizes",
                          "total_parameters", "trainable_parameters", "total_layer_params",
                          "model_size"):
            assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
        assert "Total params" in str(ours)


def test_trainer_states_are_lightnings_values():
    import lightning.pytorch.trainer.states as theirs

    import ptrain.lightning as pl
    import ptrain.lightning.trainer.states as ours
    from ptrain.lightning.trainer.trainer import Trainer

    assert Trainer is pl.Trainer
    for name in ("TrainerFn", "RunningStage", "TrainerStatus"):
        assert {m.name: m.value for m in getattr(ours, name)} == \
            {m.name: m.value for m in getattr(theirs, name)}
    for stage in ours.RunningStage:
        lightning_stage = theirs.RunningStage(stage.value)
        assert (stage.evaluating, stage.dataloader_prefix) == \
            (lightning_stage.evaluating, lightning_stage.dataloader_prefix)
    state = ours.TrainerState(ours.TrainerStatus.INTERRUPTED, ours.TrainerFn.FITTING)
    assert state.stopped and not state.finished and state.fn == "fit"
