"""Smoke uses of ``ptrain.lightning.plugins`` (precision objects against precision names and
layer sync on two processes in tests/test_lightning_components.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch import nn

from lightning_names import refuses
from lightning_names._components import QUIET, Regressor, fit, trainer
from ptrain.lightning import plugins as p


def _async_checkpoint_io():
    refuses(lambda: p.AsyncCheckpointIO(), "AsyncCheckpointIO", "--checkpoint-async-save")


def _bitsandbytes():
    refuses(lambda: p.BitsandbytesPrecision("nf4"), "BitsandbytesPrecision", "bf16-mixed")


class RecordingIO(p.TorchCheckpointIO):
    """A program's own checkpoint IO: torch's, with a record of what it did."""

    def __init__(self):
        self.saved, self.loaded = [], []

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.saved.append(Path(path).name)
        super().save_checkpoint(checkpoint, path, storage_options)

    def load_checkpoint(self, path, map_location=None):
        self.loaded.append(Path(path).name)
        return super().load_checkpoint(path, map_location)


def _checkpoint_io():
    assert issubclass(p.TorchCheckpointIO, p.CheckpointIO)
    io = RecordingIO()
    with tempfile.TemporaryDirectory() as root:
        options = {**QUIET, "enable_checkpointing": True, "default_root_dir": root}
        run, _ = fit(plugins=[io], **options)
        # Lightning's default ModelCheckpoint: epoch=0-step=4.ckpt, no last.ckpt
        assert io.saved == ["epoch=0-step=4.ckpt"] and run.global_step == 4
        resumed = trainer(plugins=[io], max_epochs=2, **options)
        resumed.fit(Regressor(), ckpt_path=run.checkpoint_callback.best_model_path)
        assert io.loaded == ["epoch=0-step=4.ckpt"] and resumed.global_step == 8
    refuses(lambda: trainer(plugins=[RecordingIO()], strategy="fsdp", devices=2), "fsdp",
            "sharded")


def _torch_checkpoint_io():
    io = p.TorchCheckpointIO()
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "sub" / "x.ckpt"
        io.save_checkpoint({"w": torch.ones(2)}, path)
        assert torch.equal(io.load_checkpoint(path)["w"], torch.ones(2))
        io.remove_checkpoint(path)
        assert not path.exists()
    run = trainer(plugins=[p.TorchCheckpointIO()])
    assert "checkpoint-io" not in run.plugins  # what ptrain does anyway


def _xla_checkpoint_io():
    refuses(lambda: trainer(plugins=[p.XLACheckpointIO()]), "XLACheckpointIO", "'tpu'")


def _precision_name(plugin, name):
    run = trainer(plugins=[plugin])
    assert run.options["precision"] == name


def _deepspeed_precision():
    _precision_name(p.DeepSpeedPrecision("bf16-mixed"), "bf16-mixed")


def _fsdp_precision():
    _precision_name(p.FSDPPrecision("bf16-true"), "bf16-true")
    refuses(lambda: p.FSDPPrecision("16-mixed", scaler=torch.amp.GradScaler("cpu")), "scaler")


def _xla_precision():
    _precision_name(p.XLAPrecision("bf16-true"), "bf16-true")


def _double():
    _, module = fit(plugins=p.DoublePrecision())
    assert module.net[1].weight.dtype == torch.float64


def _half():
    _, module = fit(plugins=[p.HalfPrecision("bf16-true")])
    assert module.net[1].weight.dtype == torch.bfloat16


def _mixed():
    run, module = fit(plugins=[p.MixedPrecision("bf16-mixed", "cpu")])
    assert run.options["precision"] == "bf16-mixed"
    assert module.net[1].weight.dtype == torch.float32 and run.global_step == 4
    scaled = trainer(plugins=[p.MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler(
        "cpu", init_scale=256.0, growth_interval=50))])
    # Lightning's autocast keeps no weight cache
    assert scaled.config["plugins"]["16-mixed"] == {"init_scale": 256.0, "growth_interval": 50,
                                                    "autocast_cache": False}
    assert run.config["plugins"]["bf16-mixed"] == {"autocast_cache": False}
    refuses(lambda: trainer(plugins=[p.MixedPrecision("bf16-mixed", "cuda")]), "device",
            "'cpu'")
    refuses(lambda: trainer(precision="bf16-mixed",
                            plugins=[p.MixedPrecision("bf16-mixed", "cpu")]), "precision")


def _precision():
    _precision_name(p.Precision(), "32-true")

    class MyPrecision(p.Precision):
        def backward(self, tensor, model, optimizer, *args, **kwargs):
            tensor.backward()

    refuses(lambda: trainer(plugins=[MyPrecision()]), "MyPrecision", "backward")


def _transformer_engine():
    refuses(lambda: p.TransformerEnginePrecision(weights_dtype=torch.bfloat16),
            "TransformerEnginePrecision", "FP8")


def _layer_sync():
    class Recording(p.LayerSync):
        name = "recording-sync"

        def apply(self, model):
            raise AssertionError("nothing to synchronise in one process")

    run, _ = fit(plugins=[Recording()])
    assert "recording-sync" in run.plugins and run.global_step == 4


def _sync_batchnorm():
    model = nn.Sequential(nn.BatchNorm1d(3), nn.Sequential(nn.BatchNorm2d(2), nn.Linear(2, 2)))
    synced = p.TorchSyncBatchNorm().apply(model)
    assert isinstance(synced[0], nn.SyncBatchNorm) and isinstance(synced[1][0], nn.SyncBatchNorm)
    back = p.TorchSyncBatchNorm().revert(synced)
    assert not any(isinstance(m, nn.SyncBatchNorm) for m in back.modules())
    assert back[0](torch.randn(4, 3)).shape == (4, 3)
    run, _ = fit(plugins=[p.TorchSyncBatchNorm()])
    assert "sync-batchnorm" in run.plugins


SMOKE = {
    "AsyncCheckpointIO": _async_checkpoint_io,
    "BitsandbytesPrecision": _bitsandbytes,
    "CheckpointIO": _checkpoint_io,
    "DeepSpeedPrecision": _deepspeed_precision,
    "DoublePrecision": _double,
    "FSDPPrecision": _fsdp_precision,
    "HalfPrecision": _half,
    "LayerSync": _layer_sync,
    "MixedPrecision": _mixed,
    "Precision": _precision,
    "TorchCheckpointIO": _torch_checkpoint_io,
    "TorchSyncBatchNorm": _sync_batchnorm,
    "TransformerEnginePrecision": _transformer_engine,
    "XLACheckpointIO": _xla_checkpoint_io,
    "XLAPrecision": _xla_precision,
}
