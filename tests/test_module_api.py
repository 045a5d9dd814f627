"""What a module reads and calls during a run, as Lightning's module offers it: ``current_epoch``,
``global_step``, ranks, ``device``, ``dtype``, ``print``, ``lr_schedulers()``, and step methods
written without ``batch_idx``."""

from __future__ import annotations

import torch
from torch import nn

import ptrain
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
