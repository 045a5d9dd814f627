"""What a module reads and calls during a run, as Lightning's module offers it: ``current_epoch``,
``global_step``, ranks, ``device``, ``dtype``, ``print``, ``lr_schedulers()``, ``all_gather``,
and step methods written without ``batch_idx``."""

from __future__ import annotations

import collections
import importlib

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

import ptrain
from tests._lightning_pair import FRAMEWORKS, Numbers
from tests._lightning_pair import QUIET as LIGHTNING_QUIET
from tests.conftest import TinyRegressor

QUIET = ["no:progress-bar", "no:tensorboard", "no:checkpoint"]


def fit(tmp_path, module, **options):
    options.setdefault("max_epochs", 2)
    ptrain.Trainer(accelerator="cpu", default_root_dir=str(tmp_path), callbacks=QUIET,
                   **options).fit(module)


class Observing(TinyRegressor):
    def __init__(self):
        super().__init__(n=16, batch_size=8, scheduler={"gamma": 0.5, "interval": "epoch"})
        self.seen = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, self.global_step, self.global_rank,
                          self.local_rank, self.device, self.dtype,
                          type(self.lr_schedulers()).__name__))
        return super().training_step(batch, batch_idx)


def test_the_run_state_reads_from_the_module(tmp_path):
    module = Observing()
    assert (module.current_epoch, module.global_step, module.global_rank) == (0, 0, 0)
    assert module.device == torch.device("cpu") and module.dtype == torch.float32
    fit(tmp_path, module)
    assert [s[:2] for s in module.seen] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert {s[2:] for s in module.seen} == {(0, 0, torch.device("cpu"), torch.float32,
                                             "StepLR")}


def test_dtype_follows_the_parameters_and_print_speaks_on_rank_zero(capsys):
    module = TinyRegressor().to(torch.float64)
    assert module.dtype == torch.float64
    module.print("hello", 3)
    assert capsys.readouterr().out == "hello 3\n"


class WithoutBatchIdx(TinyRegressor):
    def __init__(self):
        super().__init__(n=16, batch_size=8)
        self.calls = []

    def training_step(self, batch):
        self.calls.append("train")
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch):
        if not self.trainer.sanity_checking:
            self.calls.append("validate")


def test_step_methods_without_batch_idx(tmp_path):
    module = WithoutBatchIdx()
    fit(tmp_path, module, max_epochs=1)
    assert module.calls == ["train", "train", "validate", "validate"]


class OwnBackward(TinyRegressor):
    """Backpropagates half the loss: the override decides the gradients."""

    def __init__(self, lr: float):
        super().__init__(n=16, batch_size=8, lr=lr, with_val=False)
        self.calls = 0

    def backward(self, loss, *args, **kwargs):
        self.calls += 1
        (loss / 2).backward(*args, **kwargs)


def test_an_overridden_backward_does_every_backward_pass(tmp_path):
    """Half the loss at lr 0.1 is exactly the whole loss at lr 0.05 under SGD (halving is exact
    in floating point). Before, loop-defaults' own ``loss.backward()`` ran first and the
    override never did."""
    own = OwnBackward(lr=0.1)
    plain = TinyRegressor(n=16, batch_size=8, lr=0.05, with_val=False)
    plain.load_state_dict(own.state_dict())
    fit(tmp_path / "own", own, max_epochs=1)
    fit(tmp_path / "plain", plain, max_epochs=1)
    assert own.calls == 2  # once per step
    for name, value in own.state_dict().items():
        assert torch.equal(value, plain.state_dict()[name]), name


def test_all_gather_returns_what_lightnings_returns_in_one_process(tmp_path):
    """neuralforecast sums its validation loss over processes with ``self.all_gather`` in
    ``on_validation_epoch_end``; before, the module had no ``all_gather`` (an AttributeError)."""
    Pair = collections.namedtuple("Pair", "a b")

    def describe(value):
        if isinstance(value, torch.Tensor):
            return ("tensor", str(value.dtype), tuple(value.shape), value.tolist(),
                    value.requires_grad)
        if isinstance(value, dict):
            return type(value).__name__, {k: describe(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value).__name__, [describe(v) for v in value]
        return type(value).__name__, value

    def run(pl):
        class Gathers(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(4, 1)
                self.seen = []

            def training_step(self, batch, batch_idx):
                loss = self.layer(batch).pow(2).mean()
                self.seen.append(describe(self.all_gather(loss, sync_grads=True)))
                return loss

            def on_train_epoch_end(self):
                self.seen.append(describe(self.all_gather(
                    {"sum": torch.tensor([1.5, 2.0]), "count": 3, "rate": 0.25, "flag": True,
                     "array": np.arange(3), "both": [torch.ones(2, 2), 4.0],
                     "pair": Pair(torch.tensor(7), 8), "name": "kept",
                     "counts": collections.defaultdict(int, a=1)})))

            def train_dataloader(self):
                return DataLoader(Numbers(8), batch_size=4)

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        pl.seed_everything(0)
        module = Gathers()
        pl.Trainer(default_root_dir=tmp_path / pl.__name__, max_epochs=1, logger=False,
                   enable_checkpointing=False, **LIGHTNING_QUIET).fit(module)
        return module.seen

    lightning, ours = (run(importlib.import_module(name)) for name in FRAMEWORKS)
    assert ours == lightning
    assert ours[-1][1]["count"] == ("tensor", "torch.int32", (), 3, False)
    assert ours[-1][1]["counts"] == ("defaultdict", {"a": ("tensor", "torch.int32", (), 1,
                                                           False)})
