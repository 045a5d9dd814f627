"""Smoke uses of ``ptrain.lightning.callbacks``: each callback takes part in a short fit and
what it did is checked (tests/test_lightning_callbacks_loggers.py compares the important ones
with Lightning)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from torch import nn

import ptrain.lightning as pl
from lightning_names import refuses
from ptrain.lightning import callbacks


class _Model(pl.LightningModule):
    """A backbone and a head over 8 samples in batches of 2, with a validation set."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Linear(2, 3)
        self.head = nn.Linear(3, 1)
        self.batch_size, self.lr = 2, 0.1

    def forward(self, x):
        return self.head(torch.tanh(self.backbone(x)))

    def training_step(self, batch, batch_idx):
        loss = self(batch).pow(2).mean()
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self(batch).pow(2).mean())

    def predict_step(self, batch, batch_idx):
        return self(batch)

    def configure_optimizers(self):
        return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=self.lr)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=self.batch_size)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(4, 2), batch_size=2)

    predict_dataloader = val_dataloader


def _fit(*given, epochs: int = 1, model=None, **options):
    """A fit with ``given`` callbacks in a scratch folder; the trainer and the module."""
    model = model or _Model()
    settings = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0)
    settings.update(options)
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(max_epochs=epochs, callbacks=list(given), default_root_dir=root,
                             **settings)
        trainer.fit(model)
    return trainer, model


def _callback():
    seen = []

    class Counter(callbacks.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(batch_idx)

    _fit(Counter())
    assert seen == [0, 1, 2, 3]


def _checkpoint():
    with tempfile.TemporaryDirectory() as root:
        checkpoint = callbacks.ModelCheckpoint(dirpath=root, monitor="val_loss")
        assert isinstance(checkpoint, callbacks.Checkpoint)
        _fit(checkpoint, enable_checkpointing=True)
        assert Path(checkpoint.best_model_path).is_file()


def _early_stopping():
    class Worsening(_Model):
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", float(self.current_epoch))  # worse every epoch

    stopping = callbacks.EarlyStopping(monitor="val_loss", patience=1)
    trainer, _ = _fit(stopping, epochs=10, model=Worsening())
    assert trainer.current_epoch == 2 and trainer.should_stop


def _learning_rate_monitor():
    from ptrain.lightning.loggers import CSVLogger

    with tempfile.TemporaryDirectory() as root:
        logger = CSVLogger(root)
        _fit(callbacks.LearningRateMonitor(), logger=logger, log_every_n_steps=1)
        assert "lr-SGD" in (Path(logger.log_dir) / "metrics.csv").read_text().splitlines()[0]


def _finetuning():
    finetuning = callbacks.BackboneFinetuning(unfreeze_backbone_at_epoch=1)
    trainer, model = _fit(finetuning, epochs=2)
    assert len(trainer.optimizers[0].param_groups) == 2
    assert all(p.requires_grad for p in model.backbone.parameters())


def _base_finetuning():
    class Frozen(callbacks.BaseFinetuning):
        def freeze_before_training(self, pl_module):
            self.freeze(pl_module.backbone)

        def finetune_function(self, pl_module, current_epoch, optimizer):
            pass

    before = _Model()
    kept = before.backbone.weight.detach().clone()
    _fit(Frozen(), model=before)
    assert torch.equal(before.backbone.weight, kept)  # frozen before the optimizer was made


def _prediction_writer():
    class Writer(callbacks.BasePredictionWriter):
        def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch,
                               batch_idx, dataloader_idx):
            self.written.append((batch_idx, batch_indices, tuple(prediction.shape)))

    writer = Writer("batch")
    writer.written = []
    trainer = pl.Trainer(callbacks=[writer], logger=False, enable_progress_bar=False,
                         accelerator="cpu")
    trainer.predict(_Model(), return_predictions=False)
    assert writer.written == [(0, [0, 1], (2, 1)), (1, [2, 3], (2, 1))]


def _accumulation():
    scheduler = callbacks.GradientAccumulationScheduler({0: 2})
    trainer, _ = _fit(scheduler)
    assert trainer.global_step == 2  # 4 batches, 2 at a time


def _lambda():
    seen = []
    _fit(callbacks.LambdaCallback(on_train_epoch_start=lambda t, m: seen.append(t.current_epoch)),
         epochs=2)
    assert seen == [0, 1]


def _timer():
    timer = callbacks.Timer(duration="00:00:00:00")
    trainer, _ = _fit(timer, epochs=100, log_every_n_steps=1)
    assert trainer.global_step < 400 and timer.time_remaining() <= 0


def _progress_bars():
    for bar in (callbacks.TQDMProgressBar(), callbacks.RichProgressBar()):
        assert isinstance(bar, callbacks.ProgressBar)
        trainer, _ = _fit(bar, enable_progress_bar=None)
        assert trainer.plugins["progress-bar"] is bar


def _model_summaries():
    for summary in (callbacks.ModelSummary(max_depth=2), callbacks.RichModelSummary()):
        _fit(summary, enable_model_summary=None)
        assert "backbone" in summary.text


def _batch_size_finder():
    finder = callbacks.BatchSizeFinder(max_trials=1)
    _, model = _fit(finder)
    assert finder.optimal_batch_size == model.batch_size == 4


def _learning_rate_finder():
    finder = callbacks.LearningRateFinder(num_training_steps=15)
    _, model = _fit(finder)
    assert model.lr == finder.optimal_lr.suggestion() is not None


def _weight_averaging(make):
    def use():
        averaging = make()
        _, model = _fit(averaging, epochs=2)
        assert averaging._latest_update_step == 8  # after each of the 8 steps
        average = averaging._average_model.module
        assert all(torch.equal(a, b) for a, b in zip(average.parameters(), model.parameters()))

    return use


def _device_stats():
    from ptrain.lightning.loggers import CSVLogger

    with tempfile.TemporaryDirectory() as root:
        _fit(callbacks.DeviceStatsMonitor(cpu_stats=False), logger=CSVLogger(root))
    refuses(lambda: _fit(callbacks.DeviceStatsMonitor()), "DeviceStatsMonitor", "logger")


def _throughput():
    from ptrain.lightning.loggers import CSVLogger

    with tempfile.TemporaryDirectory() as root:
        logger = CSVLogger(root)
        _fit(callbacks.ThroughputMonitor(batch_size_fn=len), logger=logger, log_every_n_steps=2)
        header = (Path(logger.log_dir) / "metrics.csv").read_text().splitlines()[0]
        assert "train/samples_per_sec" in header


def _spike():
    class Spiking(_Model):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return loss * 1000 if batch_idx == 3 else loss

    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "skip.json")
        try:
            _fit(callbacks.SpikeDetection(exclude_batches_path=path), model=Spiking())
        except RuntimeError as spike:
            assert "batch 3" in str(spike)
        assert json.loads(Path(path).read_text()) == [2, 3]


def _on_exception():
    class Failing(_Model):
        def training_step(self, batch, batch_idx):
            raise KeyboardInterrupt

    with tempfile.TemporaryDirectory() as root:
        saved = callbacks.OnExceptionCheckpoint(root)
        try:
            _fit(saved, model=Failing())
        except KeyboardInterrupt:
            pass
        assert Path(saved.ckpt_path).is_file()


SMOKE = {
    "Callback": _callback,
    "Checkpoint": _checkpoint,
    "ModelCheckpoint": _checkpoint,
    "EarlyStopping": _early_stopping,
    "LearningRateMonitor": _learning_rate_monitor,
    "BackboneFinetuning": _finetuning,
    "BaseFinetuning": _base_finetuning,
    "BasePredictionWriter": _prediction_writer,
    "GradientAccumulationScheduler": _accumulation,
    "LambdaCallback": _lambda,
    "Timer": _timer,
    "ProgressBar": _progress_bars,
    "TQDMProgressBar": _progress_bars,
    "RichProgressBar": _progress_bars,
    "ModelSummary": _model_summaries,
    "RichModelSummary": _model_summaries,
    "BatchSizeFinder": _batch_size_finder,
    "LearningRateFinder": _learning_rate_finder,
    "WeightAveraging": _weight_averaging(lambda: callbacks.WeightAveraging()),
    "EMAWeightAveraging": _weight_averaging(lambda: callbacks.EMAWeightAveraging(decay=0.5)),
    "DeviceStatsMonitor": _device_stats,
    "ThroughputMonitor": _throughput,
    "SpikeDetection": _spike,
    "OnExceptionCheckpoint": _on_exception,
    "StochasticWeightAveraging": lambda: refuses(
        lambda: callbacks.StochasticWeightAveraging(swa_lrs=0.01), "StochasticWeightAveraging",
        "WeightAveraging"),
    "ModelPruning": lambda: refuses(lambda: callbacks.ModelPruning("l1_unstructured"),
                                    "ModelPruning", "torch.nn.utils.prune"),
}
