"""``ptrain.lightning``'s accelerators, strategies, plugins, profilers, tuner and utilities,
beyond their smoke uses (tests/lightning_names): each against Lightning 2.6.6 (installed as the
oracle) on the same inputs, or training for real where the object selects a ptrain plugin."""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import random
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import lightning.pytorch.utilities as lightning_utilities
import ptrain.lightning.utilities as ptrain_utilities
from tests._campaigns import TWO_PROCESS_RUNS

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


def test_init_argument_readers_match_lightnings():
    """pytorch-forecasting's BaseModel reads its init arguments with
    ``get_init_args(inspect.currentframe())`` from ``utilities.parsing``."""
    import inspect

    import lightning.pytorch.utilities.parsing as lightning_parsing
    import ptrain.lightning.utilities.parsing as ptrain_parsing

    seen = {}

    class Base:
        def __init__(self, width, *rest, depth=2, **options):
            super().__init__()
            frame = inspect.currentframe()
            for name, parsing in (("L", lightning_parsing), ("P", ptrain_parsing)):
                seen[name] = (parsing.get_init_args(frame),
                              parsing.collect_init_args(frame, []),
                              parsing.collect_init_args(frame, [], classes=(Child,)),
                              parsing.collect_init_args(frame, [], classes=(nn.Module,)),
                              parsing.parse_class_init_keys(type(self)))

    class Child(Base):
        def __init__(self, size, **extra):
            super().__init__(size * 2, 7, mode="x", **extra)

    def plain(frame):
        return {name: parsing.get_init_args(frame) for name, parsing in
                (("L", lightning_parsing), ("P", ptrain_parsing))}

    Child(3, scale=0.5)
    assert seen["P"] == seen["L"]
    assert seen["P"][0] == {"width": 6, "depth": 2, "mode": "x", "scale": 0.5}
    assert seen["P"][1][1] == {"size": 3, "scale": 0.5}
    assert seen["P"][3] == [] and seen["P"][4] == ("self", None, "extra")
    assert plain(inspect.currentframe()) == {"L": {}, "P": {}}


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


@pytest.mark.parametrize("environment", [{}, {"PL_GLOBAL_SEED": "5"}])
def test_seed_everything_without_a_seed_is_lightnings(monkeypatch, environment):
    from lightning.fabric.utilities.seed import seed_everything as lightnings

    import ptrain.lightning as pl

    draws = {}
    for name, seed_everything in (("lightning", lightnings), ("ptrain", pl.seed_everything)):
        for variable in ("PL_GLOBAL_SEED", "PTRAIN_GLOBAL_SEED"):
            monkeypatch.delenv(variable, raising=False)
        for variable, value in environment.items():
            monkeypatch.setenv(variable, value)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            seed = seed_everything()
        said = [str(w.message) for w in seen if "seed" in str(w.message).lower()]
        draws[name] = (seed, said, torch.rand(3).tolist(), os.environ["PL_GLOBAL_SEED"])
    assert draws["ptrain"] == draws["lightning"]
    assert draws["ptrain"][0] == int(environment.get("PL_GLOBAL_SEED", 0))


def test_seed_everything_says_the_seed_it_set_as_lightnings_does(caplog):
    from lightning.fabric.utilities.seed import seed_everything as lightnings

    import ptrain.lightning as pl

    said = []
    for seed_everything in (lightnings, pl.seed_everything):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            seed_everything(123)
            seed_everything(124, verbose=False)
        said.append([(r.levelname, r.getMessage()) for r in caplog.records
                     if "seed" in r.getMessage().lower()])
    assert said[1] == said[0] == [("INFO", "Seed set to 123")]


def test_seed_everything_without_a_seed_takes_ptrains_seed_of_a_launched_process(monkeypatch):
    import ptrain.lightning as pl

    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    monkeypatch.setenv("PTRAIN_GLOBAL_SEED", "12")
    assert pl.seed_everything() == 12
    assert os.environ["PL_GLOBAL_SEED"] == "12"
    monkeypatch.setenv("PL_GLOBAL_SEED", "twelve")
    with pytest.raises(ValueError, match="PL_GLOBAL_SEED='twelve' is not a seed"):
        pl.seed_everything()


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
        # Lightning's private table of rows, which programs read (yoyodyne's summary callback)
        rows = {name: (layer.layer_type, layer.num_parameters, layer.in_size, layer.out_size,
                       layer.training) for name, layer in ours._layer_summary.items()}
        assert rows == {name: (layer.layer_type, layer.num_parameters, layer.in_size,
                               layer.out_size, layer.training)
                        for name, layer in theirs._layer_summary.items()}
    from lightning.pytorch.utilities.model_summary import LayerSummary as LightningLayer

    from ptrain.lightning.utilities.model_summary import LayerSummary

    layer = nn.Linear(3, 2).eval()
    ours, theirs = LayerSummary(layer), LightningLayer(layer)
    assert (ours.layer_type, ours.num_parameters, ours.training, ours.in_size) == \
        (theirs.layer_type, theirs.num_parameters, theirs.training, theirs.in_size)
    theirs.detach_hook()


def test_model_summary_sizes_take_keyword_inputs_and_the_first_call_as_lightnings():
    # gluonts' DeepAR: an example_input_array dict whose forward calls its model with keywords
    import lightning.pytorch as lightning
    from lightning.pytorch.utilities.model_summary import ModelSummary as LightningSummary

    from ptrain.lightning.utilities.model_summary import ModelSummary

    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, a, b=None, c=None):
            return self.lin(a) + (0 if b is None else b.sum())

    class Net(nn.Module):
        def __init__(self, example):
            super().__init__()
            self.inner, self.other = Inner(), nn.Linear(3, 3)
            self.example_input_array = example

        def forward(self, x, y=None):  # the inner module is called twice: the first call counts
            return self.inner(self.other(x), b=y, c=torch.zeros(5)), self.inner(a=x)

    class LightningNet(Net, lightning.LightningModule):
        pass

    for example in ({"x": torch.zeros(4, 3), "y": torch.zeros(2)}, (torch.zeros(4, 3),),
                    torch.zeros(1, 3)):
        ours, theirs = ModelSummary(Net(example), 2), LightningSummary(LightningNet(example), 2)
        assert ours.in_sizes == theirs.in_sizes and ours.out_sizes == theirs.out_sizes
    assert ours.in_sizes[0] == [[1, 3], "?", [5]]


def test_utilities_submodules_are_attributes_after_importing_the_package_alone():
    # pl.utilities.model_summary.ModelSummary, pl.utilities.types.STEP_OUTPUT with no other import
    import subprocess
    import sys

    names = ("exceptions", "imports", "model_helpers", "model_summary", "types")
    code = ("import importlib, sys\n"
            "pl = importlib.import_module(sys.argv[1])\n"
            f"print([hasattr(pl.utilities, name) for name in {names!r}])\n"
            "print(pl.utilities.model_summary.ModelSummary.__name__)\n")
    said = []
    for package in ("lightning.pytorch", "ptrain.lightning"):
        done = subprocess.run([sys.executable, "-c", code, package], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        said.append(done.stdout)
    assert said[1] == said[0] == f"{[True] * len(names)}\nModelSummary\n"


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


# -- accelerators, strategies, plugins: a Lightning program under both -------------------------

#: A Lightning program built from Lightning's objects (not names), run under Lightning 2.6.6
#: and, its import lines rewritten, under ptrain.lightning. ``python PROGRAM OUT single`` runs
#: single-process fits with precision objects; ``OUT ddp`` trains on two processes with a
#: DDPStrategy object and uses the strategy's collectives (TorchSyncBatchNorm can't take part:
#: torch's DistributedDataParallel accepts SyncBatchNorm layers on GPUs only).
PROGRAM = '''
import datetime
import json
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.plugins import DoublePrecision, HalfPrecision, MixedPrecision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import CombinedLoader, is_shared_filesystem


class Net(pl.LightningModule):
    def __init__(self, norm=False):
        super().__init__()
        self.net = nn.Sequential(nn.BatchNorm1d(8) if norm else nn.Identity(), nn.Linear(8, 16),
                                 nn.Tanh(), nn.Linear(16, 1))
        self.seen = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def on_train_end(self):
        strategy = self.trainer.strategy
        rank = strategy.global_rank
        strategy.barrier()
        self.seen = {
            "rank": rank, "world_size": strategy.world_size,
            "is_global_zero": strategy.is_global_zero,
            "root_device": str(strategy.root_device),
            "sum": strategy.reduce(torch.tensor(float(rank + 1)), reduce_op="sum").item(),
            "mean": strategy.reduce(torch.tensor(float(rank + 1))).item(),
            "gathered": strategy.all_gather(torch.tensor([rank, 10 * rank])).tolist(),
            "module_gathered": {k: v.tolist() for k, v in self.all_gather(
                {"rank": rank, "pair": torch.tensor([rank, 10 * rank])}).items()},
            "broadcast": strategy.broadcast({"from": rank}),
            "all": strategy.reduce_boolean_decision(rank == 0, all=True),
            "any": strategy.reduce_boolean_decision(rank == 0, all=False),
            "shared": is_shared_filesystem(strategy, Path.cwd()),
        }

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 8, generator=g)
        # shuffled: Lightning's sampler for several processes shuffles the training data even
        # when the loader does not (ptrain keeps the loader's order)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=8,
                          shuffle=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def weights(module):
    return {k: v.double().flatten().tolist() for k, v in module.state_dict().items()}


def fit(out, **options):
    pl.seed_everything(0)
    module = Net(norm=options.pop("norm", False))
    trainer = pl.Trainer(max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=out, **options)
    trainer.fit(module)
    return trainer, module


out, variant = sys.argv[1], sys.argv[2]
if variant == "single":
    plugins = {
        "bf16-mixed": MixedPrecision("bf16-mixed", "cpu"),
        "16-mixed-scaler": MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler(
            "cpu", init_scale=2.0 ** 8, growth_interval=3)),
        "64-true": DoublePrecision(),
        "bf16-true": HalfPrecision("bf16-true"),
    }
    result = {name: weights(fit(out, accelerator=CPUAccelerator(), plugins=[plugin])[1])
              for name, plugin in plugins.items()}
    Path(out, "result.json").write_text(json.dumps(result))
elif variant == "combined":
    class TwoLoaders(Net):
        def training_step(self, batch, batch_idx):
            (x, y), (u, v) = batch["a"], batch["b"]
            return (nn.functional.mse_loss(self.net(x), y)
                    + nn.functional.mse_loss(self.net(u), v))

        def train_dataloader(self):
            g = torch.Generator().manual_seed(1)
            x, u = torch.randn(40, 8, generator=g), torch.randn(24, 8, generator=g)
            return {"a": DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()),
                                    batch_size=8),
                    "b": DataLoader(TensorDataset(u, u.sum(1, keepdim=True).cos()),
                                    batch_size=6)}

    pl.seed_everything(0)
    module = TwoLoaders()
    trainer = pl.Trainer(max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=out, accelerator="cpu")
    trainer.fit(module)
    result = {"dict": weights(module), "steps": trainer.global_step}
    pl.seed_everything(0)
    module = TwoLoaders()
    combined = CombinedLoader(module.train_dataloader(), mode="min_size")
    trainer = pl.Trainer(max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=out, accelerator="cpu")
    trainer.fit(module, combined)
    result.update(min_size=weights(module), min_size_steps=trainer.global_step)
    Path(out, "result.json").write_text(json.dumps(result))
else:
    strategy = DDPStrategy(find_unused_parameters=False, timeout=datetime.timedelta(minutes=2))
    trainer, module = fit(out, accelerator=CPUAccelerator(), strategy=strategy, devices=2,
                          norm=True)
    Path(out, f"seen-{module.seen['rank']}.json").write_text(json.dumps(module.seen))
    if trainer.is_global_zero:
        Path(out, "result.json").write_text(json.dumps({"weights": weights(module)}))
'''


def _run_program(where, framework: str, variant: str) -> tuple[dict, list[dict]]:
    import json
    import os
    import subprocess
    import sys

    from test_lightning_dropin import ORACLE_EXIT, ported

    folder = where / framework
    folder.mkdir()
    script = folder / "program.py"
    script.write_text(PROGRAM + ORACLE_EXIT if framework == "lightning" else ported(PROGRAM))
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    env.pop("PTRAIN_TRACE", None)
    done = subprocess.run([sys.executable, str(script), str(folder), variant], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{framework}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    seen = [json.loads(p.read_text()) for p in sorted(folder.glob("seen-*.json"))]
    return json.loads((folder / "result.json").read_text()), seen


@pytest.mark.slow
def test_precision_objects_train_as_lightnings_and_as_the_precision_by_name(tmp_path):
    lightning, _ = _run_program(tmp_path, "lightning", "single")
    ours, _ = _run_program(tmp_path, "ptrain", "single")
    for name in ("bf16-mixed", "64-true", "bf16-true", "16-mixed-scaler"):
        assert ours[name] == lightning[name], name
    # the object selects the precision plugin the name selects: the same arithmetic
    from lightning_names._components import QUIET

    import ptrain.lightning as pl

    for name, extra in (("bf16-mixed", {}),
                        ("16-mixed", {"16-mixed": {"init_scale": 2.0 ** 8,
                                                   "growth_interval": 3}})):
        weights = []
        for options in ({"precision": name, "plugin_options": extra},
                        {"plugins": [_precision_object(name)]}):
            pl.seed_everything(0)
            module = _program_module()
            pl.Trainer(max_epochs=2, accelerator="cpu", default_root_dir=str(tmp_path), **QUIET,
                       **options).fit(module)
            weights.append({k: v.tolist() for k, v in module.state_dict().items()})
        assert weights[0] == weights[1], name


def _precision_object(name):
    from ptrain.lightning.plugins import MixedPrecision

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=3) \
        if name == "16-mixed" else None
    return MixedPrecision(name, "cpu", scaler=scaler)


def _program_module():
    namespace: dict = {}
    source = PROGRAM.split("\ndef weights")[0].replace("lightning.pytorch", "ptrain.lightning")
    exec(compile(source, "program", "exec"), namespace)
    return namespace["Net"]()


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_a_ddp_strategy_object_trains_on_two_processes_as_lightnings(tmp_path):
    lightning, lightning_seen = _run_program(tmp_path, "lightning", "ddp")
    ours, seen = _run_program(tmp_path, "ptrain", "ddp")
    assert ours["weights"].keys() == lightning["weights"].keys()
    for key, values in lightning["weights"].items():  # the all-reduce may add in another order
        assert ours["weights"][key] == pytest.approx(values, rel=1e-5, abs=1e-6), key
    assert seen == lightning_seen
    assert [s["sum"] for s in seen] == [3.0, 3.0] and [s["gathered"] for s in seen] == \
        [[[0, 0], [1, 10]]] * 2
    assert [s["module_gathered"] for s in seen] == [{"rank": [0, 1],
                                                     "pair": [[0, 0], [1, 10]]}] * 2


def test_sync_batchnorm_on_several_cpu_processes_is_refused_before_ddp_fails(tmp_path):
    # what the ddp strategy's wrap_model would meet on two CPU processes: torch's DDP refuses
    # SyncBatchNorm layers off GPUs, so the plugin says so first, with what to do
    import types

    import ptrain
    from ptrain.lightning.plugins import TorchSyncBatchNorm

    plugin = TorchSyncBatchNorm()
    trainer = types.SimpleNamespace(world_size=2, device=torch.device("cpu"))
    wrapper = plugin.wrap_model(trainer, nn.Sequential(nn.BatchNorm1d(2)))
    with pytest.raises(ptrain.ConfigError, match="GPUs only"):
        next(wrapper)
    one_process = types.SimpleNamespace(world_size=1, device=torch.device("cpu"))
    model = nn.Sequential(nn.BatchNorm1d(2))
    wrapper = plugin.wrap_model(one_process, model)
    next(wrapper)
    with pytest.raises(StopIteration):
        wrapper.send(model)
    assert isinstance(model[0], nn.BatchNorm1d) and not isinstance(model[0], nn.SyncBatchNorm)


# -- the tuner against Lightning's ----------------------------------------------------------------


def _tuned(framework: str, root, manual: bool = False) -> dict:
    """Lightning's tuner (``framework="lightning"``) or ptrain's on the same module: the LR
    test's curve and suggestion, the batch sizes found, and whether the weights came back.
    ``manual``: the module optimizes manually and steps its scheduler in ``training_step``
    (NeuralProphet's module does; Lightning's test hands it the test's own scheduler)."""
    if framework == "lightning":
        import lightning.pytorch as pl
        from lightning.pytorch.tuner import Tuner
    else:
        import ptrain.lightning as pl
        from ptrain.lightning.tuner import Tuner

    class Net(pl.LightningModule):
        def __init__(self, lr=0.01, batch_size=8):
            super().__init__()
            self.save_hyperparameters()
            self.lr, self.batch_size = lr, batch_size
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def train_dataloader(self):
            x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
            return DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).sin()),
                              batch_size=self.batch_size)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    class ManualNet(Net):
        automatic_optimization = False

        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            loss = super().training_step(batch, batch_idx)
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
            self.lr_schedulers().step()
            return loss

        def configure_optimizers(self):
            optimizer = super().configure_optimizers()
            return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(
                optimizer, step_size=1, gamma=0.99)}

    pl.seed_everything(0)
    module = ManualNet() if manual else Net()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", default_root_dir=str(root))
    tuner = Tuner(trainer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = tuner.lr_find(module, num_training=60, min_lr=1e-4, max_lr=10)
        unchanged = all(torch.equal(before[k], v) for k, v in module.state_dict().items())
        power = tuner.scale_batch_size(module, mode="power", max_trials=4)
        binsearch = tuner.scale_batch_size(module, mode="binsearch", max_val=100)
    return {"results": found.results, "suggestion": found.suggestion(skip_begin=5),
            "module_lr": module.lr, "unchanged": unchanged, "power": power,
            "binsearch": binsearch, "hparams_batch_size": module.hparams.batch_size,
            "left_behind": sorted(p.name for p in root.iterdir())}


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_the_tuner_finds_what_lightnings_finds(tmp_path, capsys, manual):
    (tmp_path / "lightning").mkdir()
    (tmp_path / "ptrain").mkdir()
    theirs = _tuned("lightning", tmp_path / "lightning", manual)
    capsys.readouterr()
    ours = _tuned("ptrain", tmp_path / "ptrain", manual)
    # the Tuner says what it set; the finder's own line (its suggestion, a plot in the scratch
    # folder, deleted) is not printed
    assert "lr-finder:" not in capsys.readouterr().out
    # the same rates (Lightning's first step runs at min_lr itself, ptrain's one rate higher),
    # and as many steps: the 32 batches of the trainer's one epoch
    assert len(ours["results"]["lr"]) == len(theirs["results"]["lr"]) == 32
    assert ours["results"]["lr"][1:] == pytest.approx(theirs["results"]["lr"][1:], rel=1e-12)
    # Lightning's smoothing of the losses; the first step's lower rate moves the weights less
    assert ours["results"]["loss"] == pytest.approx(theirs["results"]["loss"], rel=1e-4)
    assert ours["module_lr"] == pytest.approx(theirs["module_lr"], rel=1e-12)
    assert ours["suggestion"] == pytest.approx(theirs["suggestion"], rel=1e-12)
    for key in ("unchanged", "power", "binsearch", "hparams_batch_size", "left_behind"):
        assert ours[key] == theirs[key], key
    assert ours["unchanged"] and ours["left_behind"] == []


def test_lr_find_stops_where_lightnings_stops_on_a_diverging_loss():
    from ptrain.lightning.tuner import _LRFinder, _smooth_as_lightning

    losses = [1.0, 0.9, 0.8, 0.7, 0.8, 2.0, 9.0, 50.0, 80.0]
    smoothed = _smooth_as_lightning(losses, 4.0)
    beta, average, expected, best = 0.98, 0.0, [], None
    for step, loss in enumerate(losses, 1):  # written out as Lightning's callback computes it
        average = beta * average + (1 - beta) * loss
        value = average / (1 - beta ** (step + 1))
        expected.append(value)
        if step > 1 and value > 4.0 * best:
            break
        best = value if best is None or value < best else best
    assert smoothed == expected and len(smoothed) < len(losses)
    assert _smooth_as_lightning(losses, None) == pytest.approx(
        [v for v in _smooth_as_lightning(losses, float("inf"))])
    from lightning.pytorch.tuner.lr_finder import _LRFinder as LightningResult

    results = {"lr": [10 ** (-3 + i / 3) for i in range(9)],
               "loss": [5.0, 4.0, 3.5, 1.0, 0.9, float("nan"), 0.8, 2.0, 3.0]}
    ours, theirs = _LRFinder("exponential", 1e-3, 1.0, 9), LightningResult("exponential", 1e-3,
                                                                          1.0, 9)
    ours.results, theirs.results = results, results
    for skip in ((0, 1), (1, 1), (2, 3), (7, 1)):
        assert ours.suggestion(*skip) == theirs.suggestion(*skip), skip
        assert ours._optimal_idx == theirs._optimal_idx, skip
    assert ours.suggestion(7, 1) is None


def _lr_test_over_epochs(framework: str, root) -> dict:
    """Lightning's LR test (``framework="lightning"``) or ptrain's with more steps than a
    shuffled epoch has, and a validation loader: the test's losses, the training samples in the
    order it took them and the validation batches it ran."""
    if framework == "lightning":
        import lightning.pytorch as pl
        from lightning.pytorch.tuner import Tuner
    else:
        import ptrain.lightning as pl
        from ptrain.lightning.tuner import Tuner
    seen = {"train": [], "val": 0}

    class Samples(torch.utils.data.Dataset):
        def __init__(self, n, stage):
            self.x = torch.randn(n, 4, generator=torch.Generator().manual_seed(n))
            self.stage = stage

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            if self.stage == "train":
                seen["train"].append(i)
            return self.x[i], self.x[i].sum(0, keepdim=True)

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lr = 1e-3
            self.net = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            seen["val"] += 1
            self.log("val_loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    pl.seed_everything(1)
    module = Net()
    trainer = pl.Trainer(max_epochs=3, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", default_root_dir=str(root))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = Tuner(trainer).lr_find(
            module, train_dataloaders=DataLoader(Samples(36, "train"), batch_size=4,
                                                 shuffle=True),
            val_dataloaders=DataLoader(Samples(8, "val"), batch_size=4), num_training=20,
            max_lr=0.1, early_stop_threshold=None)
    return {"loss": found.results["loss"], "lr": found.results["lr"],
            "suggestion": found.suggestion(),
            "train": seen["train"], "val": seen["val"], "after": torch.rand(1).item()}


def test_lr_find_validates_between_epochs_as_lightning(tmp_path):
    # 20 steps over 9 batches an epoch: Lightning's test runs three epochs of a fit, validating
    # after the first two; the loader iterated there draws from the global generator, so the
    # next epoch's shuffle is the one after that draw
    (tmp_path / "lightning").mkdir()
    (tmp_path / "ptrain").mkdir()
    theirs = _lr_test_over_epochs("lightning", tmp_path / "lightning")
    ours = _lr_test_over_epochs("ptrain", tmp_path / "ptrain")
    assert theirs["val"] == 4 and len(theirs["loss"]) == 20
    assert ours["train"] == theirs["train"]
    assert ours["val"] == theirs["val"]
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-6)
    assert ours["suggestion"] == pytest.approx(theirs["suggestion"], rel=1e-12)
    assert ours["after"] == theirs["after"]


def test_lr_find_suggests_lightnings_rate_to_the_last_digit(tmp_path):
    # the rates computed as Lightning writes them, not the same numbers up to rounding (the
    # suggestion printed and set differed in its last digits); the first step runs one rate
    # higher (Lightning's runs at min_lr itself)
    (tmp_path / "lightning").mkdir()
    (tmp_path / "ptrain").mkdir()
    theirs = _lr_test_over_epochs("lightning", tmp_path / "lightning")
    ours = _lr_test_over_epochs("ptrain", tmp_path / "ptrain")
    assert ours["lr"][1:] == theirs["lr"][1:]
    assert ours["suggestion"] == theirs["suggestion"]


@pytest.mark.slow
def test_several_training_loaders_train_as_in_lightning(tmp_path):
    lightning, _ = _run_program(tmp_path, "lightning", "combined")
    ours, _ = _run_program(tmp_path, "ptrain", "combined")
    # a dict of loaders from train_dataloader (max_size_cycle: 5 batches an epoch), and a
    # CombinedLoader given to fit (min_size: 4)
    assert (ours["steps"], ours["min_size_steps"]) == (lightning["steps"],
                                                       lightning["min_size_steps"]) == (10, 8)
    assert ours["dict"] == lightning["dict"] and ours["min_size"] == lightning["min_size"]


def test_each_profiler_imports_from_the_module_lightning_defines_it_in():
    """Lightning's profiler example does ``from lightning.pytorch.profilers.pytorch import
    PyTorchProfiler``: every profiler is at its Lightning module's path too."""
    import importlib

    import lightning.pytorch.profilers as theirs
    import ptrain.lightning.profilers as ours

    for name in theirs.__all__:
        module = getattr(theirs, name).__module__
        assert module.startswith("lightning.pytorch.profilers."), (name, module)
        path = module.replace("lightning.pytorch", "ptrain.lightning", 1)
        assert getattr(importlib.import_module(path), name) is getattr(ours, name), path


def test_pytorch_profiler_traces_the_loop_and_each_modules_forward(tmp_path):
    import json

    from lightning_names._components import fit
    from ptrain.lightning.profilers import PyTorchProfiler

    schedule = torch.profiler.schedule(skip_first=1, wait=0, warmup=1, active=2, repeat=1)
    fit(profiler=PyTorchProfiler(dirpath=tmp_path, row_limit=3, schedule=schedule))
    (trace,) = tmp_path.glob("*.pt.trace.json")
    names = [e.get("name") for e in json.loads(trace.read_text())["traceEvents"]]
    assert names.count("[module] Linear: net.1") == 2 and "ptrain.forward" in names
    assert names.count("ProfilerStep#2") == 1 and "ProfilerStep#1" not in names  # warm-up


def test_is_overridden_answers_as_lightnings():
    import functools

    import lightning.pytorch as lightning

    import ptrain.lightning as pl
    from ptrain.lightning.utilities.model_helpers import is_overridden

    def decorated(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            return function(*args, **kwargs)
        return wrapper

    from lightning.pytorch.utilities.model_helpers import is_overridden as lightnings

    for framework, check in ((lightning, lightnings), (pl, is_overridden)):
        class Module(framework.LightningModule):
            def training_step(self, batch, batch_idx):
                return None

            @decorated
            def validation_step(self, batch, batch_idx):
                return None

        class Hooks(framework.Callback):
            def on_train_start(self, trainer, pl_module):
                pass

        answers = [check(name, Module()) for name in ("training_step", "validation_step",
                                                      "test_step", "configure_optimizers")]
        answers += [check(name, Hooks()) for name in ("on_train_start", "on_train_end")]
        answers.append(check("training_step", None))
        if framework is lightning:
            expected = answers
        else:
            assert answers == expected == [True, True, False, False, True, False, False]
    with pytest.raises(ValueError, match="Expected a parent"):
        is_overridden("forward", nn.Linear(1, 1))


@pytest.fixture
def restored_environ():
    """``os.environ`` as it was, after the test: Lightning's ``SLURMEnvironment.main_address``
    writes ``MASTER_ADDR`` itself, which ``monkeypatch`` can't undo (a later test's processes
    would then look for the master on the host it names)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("variables", [
    {},
    {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "2",
     "MASTER_ADDR": "node1", "MASTER_PORT": "1234", "TORCHELASTIC_RUN_ID": "job"},
    {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_PROCID": "2",
     "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "77",
     "SLURM_NODELIST": "gpu[03-05]"},
])
def test_cluster_environments_read_what_lightnings_read(monkeypatch, variables,
                                                        restored_environ):
    import lightning.pytorch.plugins.environments as theirs

    import ptrain.lightning.plugins.environments as ours

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK",
                 "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    for name in [n for n in os.environ if n.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    pairs = [(ours.TorchElasticEnvironment, theirs.TorchElasticEnvironment)]
    if "SLURM_NTASKS" in variables:
        pairs.append((ours.SLURMEnvironment, theirs.SLURMEnvironment))
    for mine, lightnings in pairs:
        assert mine.detect() == lightnings.detect(), mine
        if not lightnings.detect():
            continue
        a, b = mine(), lightnings()
        for method in ("world_size", "global_rank", "local_rank", "node_rank"):
            assert getattr(a, method)() == getattr(b, method)(), (mine, method)
        assert a.creates_processes_externally == b.creates_processes_externally
        if mine is ours.SLURMEnvironment:
            assert a.main_address == b.main_address == "gpu03"
            assert (a.job_id(), a.job_name()) == (b.job_id(), b.job_name())
