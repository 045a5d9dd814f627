"""The built-in ``dataloading`` callback: start-up advice on workers, persistent workers and
pinned memory (a DataLoaderWarning exactly when due), ``apply`` and ``preload``.

The datasets here do real work per item (matrix products) or read real files, and the runs are
real (tiny) trainings; core counts are given with the callback's ``cpus`` option so that the
advice does not depend on the machine the tests run on.
"""

from __future__ import annotations

import multiprocessing
import textwrap
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import ptrain
from _cli_util import assert_usage_error
from conftest import REPO, TinyRegressor, make_regression_data, run_cli
from ptrain.builtins.dataloading import MIN_ADVISED_WORKERS, DataLoading, PreloadedDataset
from ptrain.data import DataLoaderWarning, suggested_num_workers


class Costly(Dataset):
    """Regression pairs (the same as TinyRegressor's) whose every fetch also runs a small
    transform: a few hundred tiny tensor operations (single-threaded, about a millisecond of
    CPU per item); the items do not depend on it."""

    def __init__(self, n: int = 16, seed: int = 0):
        self.data = make_regression_data(n, seed=seed)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        x, y = self.data[index]
        v = x.clone()
        for _ in range(150):
            v = torch.tanh(v * 1.5 + 0.1)
        return x + 0.0 * v, y


class ListInMemory(Dataset):
    """In memory but not a TensorDataset: fetching is cheap, the probe must see it."""

    def __init__(self, n: int = 16):
        data = make_regression_data(n)
        self.items = [data[i] for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


class Augmented(Costly):
    """Costly, plus noise drawn from torch's global generator at every fetch."""

    def __getitem__(self, index: int):
        x, y = super().__getitem__(index)
        return x + 0.01 * torch.randn(4), y


class DiskDataset(Dataset):
    """One ``.pt`` file per item, read at every fetch."""

    def __init__(self, folder):
        self.paths = sorted(folder.glob("*.pt"))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        return torch.load(self.paths[index], weights_only=True)


def write_items(folder, n: int = 24):
    folder.mkdir()
    data = make_regression_data(n)
    for i in range(n):
        torch.save(data[i], folder / f"{i:04d}.pt")
    return folder


class LoaderRegressor(TinyRegressor):
    """TinyRegressor trained on ``dataset`` with the given loader settings; validation on
    ``val_dataset`` (default: TinyRegressor's TensorDataset, which draws no advice)."""

    def __init__(self, dataset: Dataset, val_dataset: Dataset | None = None, *,
                 shuffle: bool = False, **loader):
        torch.manual_seed(0)  # the same initial weights for every instance
        super().__init__(shuffle=shuffle)
        self.dataset, self.val_dataset, self.loader = dataset, val_dataset, loader

    def train_dataloader(self):
        return DataLoader(self.dataset, batch_size=8, shuffle=self.shuffle, **self.loader)

    def val_dataloader(self):
        if self.val_dataset is None:
            return super().val_dataloader()
        return DataLoader(self.val_dataset, batch_size=8)


def fit(make_trainer, module, options=None, callbacks=(), **trainer_options):
    """Train ``module``; returns the trainer and the DataLoaderWarnings issued."""
    trainer_options.setdefault("max_epochs", 2)
    trainer = make_trainer(callbacks=["no:progress-bar", "no:tensorboard", "no:checkpoint",
                                      *callbacks],
                           plugin_options={"dataloading": options} if options else None,
                           **trainer_options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module)
    return trainer, [w for w in caught if issubclass(w.category, DataLoaderWarning)]


# ---------------------------------------------------------------------------------------------
# When the advice fires, and when it must not


@pytest.mark.parametrize("case, dataset, loader, options, callbacks, expect", [
    ("below the suggestion", Costly, {}, {"cpus": 4}, (), "num_workers=3"),
    ("at the suggestion", Costly, {"num_workers": 3, "persistent_workers": True},
     {"cpus": 4}, (), None),
    ("blocked", Costly, {}, {"cpus": 4}, ("no:dataloading",), None),
    ("one core per process", Costly, {}, {"cpus": 1}, (), None),
    ("room for one worker only", Costly, {}, {"cpus": 2}, (), None),
    ("in-memory TensorDataset", lambda: make_regression_data(16), {}, {"cpus": 4}, (), None),
    ("cheap to fetch", ListInMemory, {}, {"cpus": 4}, (), None),
])
def test_worker_advice_fires_exactly_when_due(make_trainer, case, dataset, loader, options,
                                              callbacks, expect):
    trainer, caught = fit(make_trainer, LoaderRegressor(dataset(), **loader), options, callbacks)
    if expect is None:
        assert caught == [], f"{case}: {[str(w.message) for w in caught]}"
        return
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert expect in message and "the train dataloader" in message
    assert "--dataloading-apply" in message and "no:dataloading" in message
    assert caught[0].filename.endswith("test_dataloading.py")  # points at train_dataloader
    assert trainer.train_dataloader.num_workers == 0  # advice only: nothing changed


def test_worker_advice_uses_this_machines_cores(make_trainer):
    """Without ``cpus``: the cores detected here (2 on the project's machine: silent)."""
    expected = suggested_num_workers(1)
    _, caught = fit(make_trainer, LoaderRegressor(Costly()))
    if expected < MIN_ADVISED_WORKERS:
        assert caught == []
        return
    assert len(caught) == 1 and f"num_workers={expected}" in str(caught[0].message)
    _, caught = fit(make_trainer, LoaderRegressor(Costly(), num_workers=expected,
                                                  persistent_workers=True))
    assert caught == []


def test_validation_loader_gets_the_same_check(make_trainer):
    _, caught = fit(make_trainer, LoaderRegressor(make_regression_data(16), Costly(seed=1)),
                    {"cpus": 3})
    assert len(caught) == 1
    assert "the validate dataloader" in str(caught[0].message)
    assert "num_workers=2" in str(caught[0].message)


@pytest.mark.parametrize("persistent, max_epochs, short_epoch_batches, warns", [
    (False, 2, 500, True),    # 2 batches a pass, passes again: keep the workers
    (True, 2, 500, False),    # already persistent
    (False, 1, 500, False),   # one pass only: nothing to keep
    (False, 2, 2, False),     # 2 batches is not short under a threshold of 2
])
def test_persistent_workers_rule(make_trainer, persistent, max_epochs, short_epoch_batches,
                                 warns):
    module = LoaderRegressor(Costly(), num_workers=1, persistent_workers=persistent)
    _, caught = fit(make_trainer, module, {"cpus": 2, "short_epoch_batches": short_epoch_batches},
                    max_epochs=max_epochs)
    messages = [str(w.message) for w in caught]
    if warns:
        assert len(caught) == 1 and "persistent_workers=True" in messages[0], messages
        assert "num_workers=" not in messages[0]
    else:
        assert caught == [], messages


def test_pin_memory_rule_on_cuda(make_trainer):
    """The rule itself, on a trainer whose device reads as CUDA (no GPU needed): advice when the
    accelerator has no pin_memory setting (the cpu one here), none when it has one, as
    ptrain-cuda has (it pins by default; turning that off is respected)."""
    ptrain_cuda = pytest.importorskip("ptrain_cuda")
    loader = DataLoader(make_regression_data(16), batch_size=8)
    plugin = DataLoading(cpus=1)

    on_cpu = make_trainer()
    assert plugin.plan(on_cpu, loader, "train").changes == {}
    on_cpu.device = torch.device("cuda", 0)  # as a CUDA accelerator's setup_device would set it
    plan = plugin.plan(on_cpu, loader, "train")
    assert plan.changes == {"pin_memory": True} and "pageable memory" in plan.reasons[0]
    pinned = DataLoader(make_regression_data(16), batch_size=8, pin_memory=True)
    assert plugin.plan(on_cpu, pinned, "train").changes == {}

    for pin in (True, False):
        with_cuda = make_trainer(accelerator=ptrain_cuda.CUDAAccelerator(pin_memory=pin))
        with_cuda.device = torch.device("cuda", 0)
        assert plugin.plan(with_cuda, loader, "train").changes == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_ptrain_cuda_pins_and_nothing_is_said(make_trainer):
    _, caught = fit(make_trainer, LoaderRegressor(make_regression_data(16)), {"cpus": 1},
                    accelerator="cuda")
    assert caught == []


# ---------------------------------------------------------------------------------------------
# apply


def test_apply_rebuilds_the_loader_and_trains_the_same(make_trainer, capsys):
    applied, caught = fit(make_trainer, LoaderRegressor(Costly(n=32)),
                          {"cpus": 3, "apply": True}, seed=0)
    loader = applied.train_dataloader
    assert (loader.num_workers, loader.persistent_workers) == (2, True)
    assert caught == []  # applied, not warned
    out = capsys.readouterr().out
    assert "num_workers 0 -> 2" in out and "persistent_workers False -> True" in out
    assert applied.plugins["dataloading"].report["train"]["changes"] == {
        "num_workers": 2, "persistent_workers": True}
    assert multiprocessing.active_children() == []  # teardown stopped the persistent workers

    plain, _ = fit(make_trainer, LoaderRegressor(Costly(n=32)), callbacks=["no:dataloading"],
                   seed=0)
    assert plain.train_dataloader.num_workers == 0
    assert applied.global_step == plain.global_step == 8
    for name, value in plain.module.state_dict().items():
        assert torch.equal(value, applied.module.state_dict()[name]), name
    assert float(applied.callback_metrics["train_loss"]) == float(plain.callback_metrics[
        "train_loss"])


def test_the_trainer_stops_persistent_workers_when_the_run_ends(make_trainer):
    """Core behaviour, with the callback off: a run's persistent workers do not outlive it."""
    trainer, _ = fit(make_trainer, LoaderRegressor(Costly(), num_workers=1,
                                                   persistent_workers=True),
                     callbacks=["no:dataloading"])
    assert trainer.global_step == 4
    assert multiprocessing.active_children() == []
    trainer.validate(trainer.module)  # a stopped loader starts new workers when iterated again
    assert multiprocessing.active_children() == []


def test_checks_leave_random_generators_alone(make_trainer):
    """The probe fetches items of a dataset that draws random numbers: a seeded run must come
    out the same with the callback on (it measured) and off."""
    on, caught = fit(make_trainer, LoaderRegressor(Augmented(), shuffle=True), {"cpus": 4},
                     seed=3)
    assert len(caught) == 1  # the probe ran
    assert on.plugins["dataloading"].report["train"]["batch_ms"] > 0
    off, _ = fit(make_trainer, LoaderRegressor(Augmented(), shuffle=True),
                 callbacks=["no:dataloading"], seed=3)
    for name, value in off.module.state_dict().items():
        assert torch.equal(value, on.module.state_dict()[name]), name


# ---------------------------------------------------------------------------------------------
# preload


def test_preload_holds_the_dataset_in_memory_and_gives_identical_batches(make_trainer, tmp_path,
                                                                         capsys):
    folder = write_items(tmp_path / "items", n=24)
    trainer, _ = fit(make_trainer, LoaderRegressor(DiskDataset(folder)),
                     {"preload": True, "cpus": 1}, max_epochs=1)
    report = trainer.plugins["dataloading"].report["train"]
    assert report["preload_bytes"] == 24 * (4 + 1) * 4  # float32 x (4,) and y (1,) per item
    assert report["preload_seconds"] > 0
    out = capsys.readouterr().out
    assert "preloaded the train dataset (DiskDataset): 24 items, 480 bytes" in out

    loader = trainer.train_dataloader
    assert isinstance(loader.dataset, PreloadedDataset)
    expected = [b for b in DataLoader(DiskDataset(folder), batch_size=8)]
    for path in folder.iterdir():  # what the loader gives now comes from memory
        path.unlink()
    got = list(loader)
    assert len(got) == len(expected) == 3
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)


def test_preload_refuses_a_dataset_over_the_limit(make_trainer, tmp_path):
    folder = write_items(tmp_path / "items", n=8)
    with pytest.raises(ptrain.ConfigError, match="preload-max-gib"):
        fit(make_trainer, LoaderRegressor(DiskDataset(folder)),
            {"preload": True, "preload_max_gib": 100 / 2**30})  # 100 bytes: 5 items fit


def test_preload_of_an_iterable_dataset_is_a_usage_error(cli, tmp_path):
    (tmp_path / "stream_model.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, IterableDataset
        from tests.conftest import TinyRegressor

        class Stream(IterableDataset):
            def __iter__(self):
                for _ in range(16):
                    yield torch.zeros(4), torch.zeros(1)

        class StreamRegressor(TinyRegressor):
            def train_dataloader(self):
                return DataLoader(Stream(), batch_size=8)
    """))
    result = cli("fit", "--model", "stream_model:StreamRegressor", "--accelerator", "cpu",
                 "--max-epochs", "1", "--dataloading-preload", "--no-progress-bar",
                 "--default-root-dir", str(tmp_path / "runs"),
                 env={"PYTHONPATH": f"{tmp_path}"})
    assert_usage_error(result, "IterableDataset", "--dataloading-preload", "Stream")


def test_preloaded_and_iterable_datasets_draw_no_worker_advice(make_trainer):
    class Stream(IterableDataset):
        def __iter__(self):
            yield from (make_regression_data(16)[i] for i in range(16))

    _, caught = fit(make_trainer, LoaderRegressor(Stream()), {"cpus": 4})
    assert caught == []
    _, caught = fit(make_trainer, LoaderRegressor(Costly()), {"cpus": 4, "preload": True})
    assert caught == []


def test_a_worker_count_no_machine_could_start_is_a_usage_error(tmp_path):
    """torch would try to start them all: the CLI fuzz drew 99999999999999999999 and hung."""

    result = run_cli("fit", "--model", "tests._input_models:Base", "--accelerator", "cpu",
                     "--max-steps", "2", "-p", "no:progress-bar", "-p", "dataloading",
                     "--dataloading-num-workers", "99999999999999999999", "--dataloading-cpus",
                     "2", "--default-root-dir", str(tmp_path / "runs"), cwd=REPO)
    assert result.returncode == 2, result.stderr
    assert "give at most 32 (16 per core" in result.stderr
    assert "Traceback" not in result.stderr
