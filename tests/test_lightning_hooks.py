"""Lightning's module and callback hook methods under ``ptrain.lightning``, against Lightning
2.6.6 run in the same process on the same program: the order of every call during
``validate``, ``test`` and ``predict`` (evaluation-mode hooks, batch-transfer hooks, ``setup``
and ``teardown`` with ``stage=``), and the native hooks behind them (``on_stage_start``,
``evaluation_mode``)."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import ptrain
import ptrain.lightning as ptl
from ptrain import hookimpl

lightning = pytest.importorskip("lightning.pytorch", reason="the oracle: Lightning 2.6.6")

#: what both frameworks' modules define and the test records (the step methods and hooks a
#: stage calls; ``train`` is nn.Module's, called by eval())
MODULE_METHODS = (
    "configure_callbacks", "prepare_data", "setup", "configure_model", "teardown", "zero_grad",
    "train", "forward", "val_dataloader", "test_dataloader", "predict_dataloader",
    "validation_step", "test_step", "predict_step", "on_before_batch_transfer",
    "transfer_batch_to_device", "on_after_batch_transfer", "on_validation_model_eval",
    "on_validation_model_train", "on_test_model_eval", "on_test_model_train",
    "on_predict_model_eval", "on_validation_start", "on_validation_end", "on_test_start",
    "on_test_end", "on_predict_start", "on_predict_end", "on_validation_epoch_start",
    "on_validation_epoch_end", "on_test_epoch_start", "on_test_epoch_end",
    "on_predict_epoch_start", "on_predict_epoch_end", "on_validation_batch_start",
    "on_validation_batch_end", "on_test_batch_start", "on_test_batch_end",
    "on_predict_batch_start", "on_predict_batch_end")
CALLBACK_METHODS = (
    "setup", "teardown", "on_validation_start", "on_validation_end", "on_test_start",
    "on_test_end", "on_predict_start", "on_predict_end", "on_validation_epoch_start",
    "on_validation_epoch_end", "on_test_epoch_start", "on_test_epoch_end",
    "on_predict_epoch_start", "on_predict_epoch_end", "on_validation_batch_start",
    "on_validation_batch_end", "on_test_batch_start", "on_test_batch_end",
    "on_predict_batch_start", "on_predict_batch_end")


class Vectors(Dataset):
    def __init__(self, n=6):
        self.data = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


def _recording(obj, names, calls, prefix):
    """Replace each method of ``obj`` named in ``names`` by one that records its call (with
    its keyword arguments' names) after running it, as Lightning's own hook test does."""
    def record(name, method, *args, **kwargs):
        out = method(*args, **kwargs)
        calls.append((prefix + name, tuple(sorted(kwargs))))
        return out

    for name in names:
        setattr(obj, name, partial(record, name, getattr(obj, name)))


def _program(pl, calls):
    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(8, 2)
            _recording(self, MODULE_METHODS, calls, "")

        def forward(self, x):
            return self.layer(x)

        def validation_step(self, batch, batch_idx):
            return {"x": self(batch).sum()}

        def test_step(self, batch, batch_idx):
            return {"y": self(batch).sum()}

        def predict_step(self, batch, batch_idx):
            return self(batch)

        def val_dataloader(self):
            return DataLoader(Vectors(), batch_size=3)

        test_dataloader = predict_dataloader = val_dataloader

        def prepare_data(self):
            pass

        def configure_model(self):
            pass

        def on_test_model_train(self):  # called only when overridden, in both
            pass

    class Recorder(pl.Callback):
        def __init__(self):
            _recording(self, CALLBACK_METHODS, calls, "Callback.")

    return Model(), Recorder()


def _run(pl, verb, tmp_path, **options):
    calls = []
    model, callback = _program(pl, calls)
    trainer = pl.Trainer(default_root_dir=str(tmp_path / pl.__name__), accelerator="cpu",
                         devices=1, enable_progress_bar=False, enable_model_summary=False,
                         logger=False, callbacks=[callback], **options)
    if verb == "predict":
        trainer.predict(model)
    else:
        getattr(trainer, verb)(model, verbose=False)
    return calls


@pytest.mark.parametrize("verb", ["validate", "test", "predict"])
def test_evaluation_hooks_are_called_in_lightnings_order(tmp_path, verb):
    expected = _run(lightning, verb, tmp_path)
    assert ("on_before_batch_transfer", ()) in expected  # the recording saw what it should
    assert _run(ptl, verb, tmp_path) == expected


@pytest.mark.parametrize("verb", ["validate", "test"])
def test_an_evaluation_limited_to_no_batch_asks_for_no_dataloader(tmp_path, verb):
    limit = {"limit_val_batches" if verb == "validate" else "limit_test_batches": 0}
    expected = _run(lightning, verb, tmp_path, **limit)
    assert not any(name.endswith("_dataloader") for name, _ in expected)
    assert _run(ptl, verb, tmp_path, **limit) == expected


class CustomBatch:
    """A batch type the default transfer does not know."""

    def __init__(self, tensors):
        self.tensors = tensors


def _custom_batches(batch):
    return CustomBatch(torch.stack(batch))


class TransfersItsBatch(ptrain.TrainModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 1)
        self.seen = []

    def train_dataloader(self):
        return DataLoader(Vectors(8), batch_size=4, collate_fn=_custom_batches)

    def on_before_batch_transfer(self, batch, dataloader_idx):
        self.seen.append(("before", type(batch).__name__, dataloader_idx))
        batch.tensors = batch.tensors * 2
        return batch

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        self.seen.append(("transfer", str(device)))
        return batch.tensors.to(device)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        self.seen.append(("after", type(batch).__name__))
        return batch + 1

    def training_step(self, batch, batch_idx):
        self.seen.append(("step", float(batch.sum())))
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_batch_transfer_hooks_move_a_batch_of_the_modules_own_type(tmp_path):
    module = TransfersItsBatch()
    ptrain.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path),
                   callbacks=["no:progress-bar", "no:checkpoint"]).fit(module)
    data = Vectors(8).data
    assert module.seen == [
        ("before", "CustomBatch", 0), ("transfer", "cpu"), ("after", "Tensor"),
        ("step", pytest.approx(float((data[:4] * 2 + 1).sum()), rel=1e-5)),
        ("before", "CustomBatch", 0), ("transfer", "cpu"), ("after", "Tensor"),
        ("step", pytest.approx(float((data[4:] * 2 + 1).sum()), rel=1e-5))]


class StageSpy:
    """A native plugin on the two hooks behind Lightning's Callback.setup and the
    on_*_model_eval methods."""

    name = "stage-spy"

    def __init__(self, calls):
        self.calls = calls

    @hookimpl
    def on_stage_start(self, trainer, stage):
        self.calls.append(("on_stage_start", stage, trainer.model is None))

    @hookimpl
    def setup(self, trainer, stage):
        self.calls.append(("setup", stage, trainer.model is None))

    @hookimpl
    def evaluation_mode(self, trainer, stage):
        trainer.model.eval()
        trainer.model.module.layer.train()  # keeps one layer training: the plugin decides
        self.calls.append(("evaluation_mode", stage, trainer.stage))
        return True

    @hookimpl
    def on_evaluation_batch_end(self, trainer, stage):
        self.calls.append(("batch", stage, trainer.model.module.layer.training,
                           trainer.model.module.training))


class SetsUp(ptrain.TrainModule):
    def __init__(self, calls):
        super().__init__()
        self.calls = calls
        self.layer = nn.Linear(8, 1)

    def setup(self, stage):
        self.calls.append(("module.setup", stage, self._trainer.model is None))

    def training_step(self, batch, batch_idx):
        return self.layer(batch).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        pass

    def train_dataloader(self):
        return DataLoader(Vectors(4), batch_size=4)

    val_dataloader = train_dataloader

    def configure_optimizers(self):
        self.calls.append(("configure_optimizers",))
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_on_stage_start_comes_before_the_module_is_set_up_and_evaluation_mode_decides(tmp_path):
    calls = []
    module = SetsUp(calls)
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path),
                             num_sanity_val_steps=0, callbacks=[StageSpy(calls), "no:checkpoint",
                                                                "no:progress-bar"])
    trainer.fit(module)
    assert calls == [("on_stage_start", "fit", True), ("module.setup", "fit", True),
                     ("configure_optimizers",), ("setup", "fit", False),
                     ("evaluation_mode", "validate", "train"), ("batch", "validate", True, False)]
    assert module.training and module.layer.training  # the modes it had are back
