"""Lightning's layer synchronisation plugins: ``TorchSyncBatchNorm`` (and a program's own
``LayerSync``) convert the model before the strategy wraps it; see
:mod:`ptrain.lightning.plugins`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ptrain.errors import ConfigError
from ptrain.hookspecs import hookimpl

__all__ = ["LayerSync", "TorchSyncBatchNorm"]


class LayerSync:
    """Layers that synchronise across processes: ``apply(model)`` converts them, ``revert``
    converts them back. Given to the Trainer (in ``plugins``) it is a ptrain callback that
    applies itself to the module before the strategy wraps it, when several processes train
    (with one process there is nothing to synchronise)."""

    name = "layer-sync"

    def apply(self, model: nn.Module) -> nn.Module:
        raise NotImplementedError

    def revert(self, model: nn.Module) -> nn.Module:
        raise NotImplementedError

    @hookimpl(wrapper=True)
    def wrap_model(self, trainer: Any, model: nn.Module):
        if trainer.world_size > 1:
            converted = self.apply(model)
            if converted is not model:  # the root replaced: the wrapper takes its place
                raise ConfigError(f"{type(self).__name__}.apply returned a new object for the "
                                  f"model's root, which ptrain can't put in its place; convert "
                                  f"the layers in place and return the model.")
        return (yield)


class TorchSyncBatchNorm(LayerSync):
    """Every batch normalization layer becomes ``torch.nn.SyncBatchNorm``, whose statistics are
    those of the whole batch across processes (``Trainer(sync_batchnorm=True)`` in Lightning)."""

    name = "sync-batchnorm"

    @hookimpl(wrapper=True)
    def wrap_model(self, trainer: Any, model: nn.Module):
        if trainer.world_size > 1 and trainer.device.type == "cpu" and any(
                isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            raise ConfigError(
                "TorchSyncBatchNorm under several processes on the CPU: torch's "
                "DistributedDataParallel takes SyncBatchNorm layers on GPUs only. Train on "
                "CUDA devices, or leave TorchSyncBatchNorm out (each process then normalizes "
                "with its own batch's statistics).")
        return (yield from LayerSync.wrap_model(self, trainer, model))

    def apply(self, model: nn.Module) -> nn.Module:
        for name, child in list(model.named_children()):
            setattr(model, name, nn.SyncBatchNorm.convert_sync_batchnorm(child))
        return model

    def revert(self, model: nn.Module) -> nn.Module:
        """The ``SyncBatchNorm`` layers back to batch normalization of any input rank (their
        weights, buffers and settings kept)."""
        if isinstance(model, nn.SyncBatchNorm):
            plain = _AnyRankBatchNorm(model.num_features, model.eps, model.momentum,
                                      model.affine, model.track_running_stats)
            if model.affine:
                plain.weight, plain.bias = model.weight, model.bias
            plain.running_mean, plain.running_var = model.running_mean, model.running_var
            plain.num_batches_tracked = model.num_batches_tracked
            plain.train(model.training)
            model_children = list(model.named_children())
            model = plain
        else:
            model_children = list(model.named_children())
        for name, child in model_children:
            setattr(model, name, self.revert(child))
        return model


class _AnyRankBatchNorm(nn.modules.batchnorm._BatchNorm):
    """Batch normalization over inputs of any rank (what a ``SyncBatchNorm`` converted back is:
    it no longer knows whether it was 1-d, 2-d or 3-d)."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        return None
