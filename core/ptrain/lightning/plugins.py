"""``lightning.pytorch.plugins``' names over ptrain's plugins.

- Precision objects select ptrain's precision plugin of the same name:
  ``MixedPrecision("bf16-mixed", "cpu")`` is ``precision="bf16-mixed"``, ``DoublePrecision()``
  is ``"64-true"``, ``HalfPrecision("bf16-true")`` is ``"bf16-true"``; a ``GradScaler`` given to
  ``MixedPrecision("16-mixed", ...)`` gives its initial scale and growth interval to ptrain's
  loss scaler. ``FSDPPrecision``/``DeepSpeedPrecision``/``XLAPrecision`` select their precision
  under whichever strategy runs. A program's own subclass of ``Precision``, and quantized or
  FP8 training (``BitsandbytesPrecision``, ``TransformerEnginePrecision``), are refused.
- ``TorchCheckpointIO`` is what ptrain does anyway (``torch.save``, atomically). A program's
  own ``CheckpointIO`` subclass writes and reads the checkpoints of the run (its
  ``save_checkpoint``/``load_checkpoint``/``remove_checkpoint`` are called). ``AsyncCheckpointIO``
  is refused: ptrain's checkpoint callback relies on a finished file.
- ``TorchSyncBatchNorm`` (and a program's own ``LayerSync``) converts the model's layers
  before the strategy wraps it, when several processes train.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from ptrain.errors import ConfigError
from ptrain.hookspecs import hookimpl
from ptrain.lightning._common import refuse

__all__ = ["AsyncCheckpointIO", "BitsandbytesPrecision", "CheckpointIO", "DeepSpeedPrecision",
           "DoublePrecision", "FSDPPrecision", "HalfPrecision", "LayerSync", "MixedPrecision",
           "Precision", "TorchCheckpointIO", "TorchSyncBatchNorm", "TransformerEnginePrecision",
           "XLACheckpointIO", "XLAPrecision"]

_DTYPES = {"32-true": torch.float32, "64-true": torch.float64, "16-true": torch.float16,
           "bf16-true": torch.bfloat16, "16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}


# -- precision -----------------------------------------------------------------------------------


class Precision:
    """Full float32 precision, ptrain's ``32-true``; the base of Lightning's precision plugins.
    ``ptrain_name`` is the ptrain precision plugin an object selects and ``ptrain_options`` its
    options. A program's own subclass (with its own ``backward``, ``optimizer_step``...) is
    refused by the Trainer: ptrain's precision plugins run through ptrain's hooks."""

    precision: str = "32-true"

    def __init__(self) -> None:
        self.ptrain_options: dict[str, Any] = {}

    @property
    def ptrain_name(self) -> str:
        return self.precision

    def check_usable(self) -> None:
        """Raise the refusal of an object ptrain can't run (a program's own subclass that
        overrides Lightning's precision methods)."""
        own = [name for name in ("backward", "pre_backward", "optimizer_step", "forward_context",
                                 "convert_module", "convert_input", "clip_gradients")
               if _overrides(type(self), name)]
        if own:
            raise ConfigError(
                f"{type(self).__name__} overrides {', '.join(own)} of Lightning's Precision, "
                f"which ptrain does not call: its precision plugins run through ptrain's hooks "
                f"(precision_policy, model_step, backward, optimizer_step). Choose one of "
                f"ptrain's precisions ('32-true', '16-mixed', 'bf16-mixed', '16-true', "
                f"'bf16-true', '64-true'), or write yours as a ptrain precision plugin "
                f"(docs/plugins.md). See \"Coming from Lightning\" in ptrain's documentation.")

    # Lightning's helpers a program may call itself

    def convert_module(self, module: nn.Module) -> nn.Module:
        """``module`` in this precision's parameter format (cast for the ``-true`` ones)."""
        if self.precision.endswith("-true") and self.precision != "32-true":
            return module.to(dtype=_DTYPES[self.precision])
        return module

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        """Where the forward pass runs: under autocast for the ``-mixed`` ones."""
        yield

    def convert_input(self, data: Any) -> Any:
        """``data``'s floating-point tensors in the compute format (``-true`` precisions)."""
        if not self.precision.endswith("-true") or self.precision == "32-true":
            return data
        from ptrain.data import apply_to_tensors

        dtype = _DTYPES[self.precision]
        return apply_to_tensors(data, lambda t: t.to(dtype) if t.is_floating_point() else t)


def _overrides(cls: type, name: str) -> bool:
    """Whether ``cls`` defines ``name`` itself, outside this module's classes."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass.__module__ != __name__
    return False


class DoublePrecision(Precision):
    """ptrain's ``64-true``."""

    precision = "64-true"


class HalfPrecision(Precision):
    """ptrain's ``16-true`` or ``bf16-true``: the whole model in half precision."""

    def __init__(self, precision: str = "16-true") -> None:
        super().__init__()
        if precision not in ("16-true", "bf16-true"):
            raise refuse("HalfPrecision", "precision", precision,
                         "choose '16-true' or 'bf16-true'")
        self.precision = precision


class MixedPrecision(Precision):
    """ptrain's ``16-mixed`` or ``bf16-mixed`` (autocast on the run's device). ``device`` must be
    that of the run's accelerator. A ``torch.amp.GradScaler`` for ``16-mixed`` gives ptrain's
    loss scaler its ``init_scale`` and ``growth_interval``; its growth and backoff factors must
    be torch's defaults (2 and 0.5), which ptrain's scaler uses."""

    def __init__(self, precision: str, device: str, scaler: Any = None) -> None:
        super().__init__()
        owner = "MixedPrecision"
        if precision not in ("16-mixed", "bf16-mixed"):
            raise refuse(owner, "precision", precision, "choose '16-mixed' or 'bf16-mixed'")
        if scaler is not None and precision == "bf16-mixed":
            raise refuse(owner, "scaler", scaler, "bf16-mixed needs no loss scaling; leave it out")
        self.precision, self.device, self.scaler = precision, device, scaler
        if scaler is not None:
            if not isinstance(scaler, torch.amp.GradScaler):
                raise refuse(owner, "scaler", scaler, "pass a torch.amp.GradScaler")
            for attribute, default in (("_growth_factor", 2.0), ("_backoff_factor", 0.5),
                                       ("_enabled", True)):
                if getattr(scaler, attribute) != default:
                    raise refuse(owner, f"scaler.{attribute.lstrip('_')}",
                                 getattr(scaler, attribute),
                                 f"ptrain's loss scaler uses {default}; build the GradScaler "
                                 f"with only init_scale and growth_interval")
            self.ptrain_options = {"init_scale": float(scaler._init_scale),
                                   "growth_interval": int(scaler._growth_interval)}

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        with torch.autocast(device_type=torch.device(self.device).type,
                            dtype=_DTYPES[self.precision]):
            yield


class FSDPPrecision(Precision):
    """``precision`` under ptrain's sharding strategies, which apply the precision plugin's
    formats themselves (Lightning's FSDP-specific plugin)."""

    def __init__(self, precision: str, scaler: Any = None) -> None:
        super().__init__()
        if precision not in _DTYPES:
            raise refuse("FSDPPrecision", "precision", precision,
                         f"choose one of {', '.join(_DTYPES)}")
        if scaler is not None:
            raise refuse("FSDPPrecision", "scaler", scaler,
                         "ptrain's sharded strategies take no loss scaler (their overflow "
                         "check would see one shard): use 'bf16-mixed'")
        self.precision = precision


class DeepSpeedPrecision(Precision):
    """``precision`` under ptrain's ZeRO stages (``DeepSpeedStrategy``)."""

    def __init__(self, precision: str) -> None:
        super().__init__()
        if precision not in _DTYPES:
            raise refuse("DeepSpeedPrecision", "precision", precision,
                         f"choose one of {', '.join(_DTYPES)}")
        self.precision = precision


class XLAPrecision(Precision):
    """``precision`` on TPUs (``ptrain-xla``): ``32-true``, ``16-true`` or ``bf16-true``."""

    def __init__(self, precision: str = "32-true") -> None:
        super().__init__()
        if precision not in ("32-true", "16-true", "bf16-true"):
            raise refuse("XLAPrecision", "precision", precision,
                         "choose '32-true', '16-true' or 'bf16-true'")
        self.precision = precision


class BitsandbytesPrecision(Precision):
    """Lightning's quantized-weights training through bitsandbytes. ptrain has no quantizing
    precision plugin: made, it is refused."""

    def __init__(self, mode: str, dtype: Any = None, ignore_modules: Any = None) -> None:
        super().__init__()
        raise refuse("BitsandbytesPrecision", "mode", mode,
                     "ptrain has no quantizing precision plugin; quantize the layers yourself "
                     "(bitsandbytes' Linear4bit/Linear8bitLt) in configure_model and train with "
                     "precision='bf16-mixed' or '32-true'")


class TransformerEnginePrecision(Precision):
    """Lightning's FP8 training through NVIDIA's Transformer Engine. ptrain has no FP8 precision
    plugin: made, it is refused."""

    def __init__(self, *, weights_dtype: Any, recipe: Any = None, replace_layers: Any = None,
                 fallback_compute_dtype: Any = None) -> None:
        super().__init__()
        raise refuse("TransformerEnginePrecision", "weights_dtype", weights_dtype,
                     "ptrain has no FP8 precision plugin; train with precision='bf16-mixed', "
                     "or convert the layers to FP8 yourself in configure_model (torchao's "
                     "float8 training)")


# -- checkpoint IO -------------------------------------------------------------------------------


class CheckpointIO:
    """How checkpoints are written and read: ``save_checkpoint(checkpoint, path,
    storage_options=None)``, ``load_checkpoint(path, map_location=None)``,
    ``remove_checkpoint(path)``, ``teardown()``. Given to the Trainer (in ``plugins``, or a
    strategy's ``checkpoint_io``), a subclass writes and reads the run's checkpoints on global
    rank 0 through ptrain's ``save_checkpoint``/``load_checkpoint`` hooks; the checkpoint it
    gets is ptrain's dict (``"model"``, ``"optimizers"``, ``"loop"``, ... see
    docs/checkpoints.md), not Lightning's."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any = None) -> None:
        raise NotImplementedError

    def load_checkpoint(self, path: Any, map_location: Any = None) -> dict[str, Any]:
        raise NotImplementedError

    def remove_checkpoint(self, path: Any) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        """Clean up at the end of a stage."""

    def ptrain_plugin(self) -> Any:
        """This object as a ptrain plugin (``None``: ptrain's own writing does the same)."""
        return _CheckpointIOPlugin(self)


class TorchCheckpointIO(CheckpointIO):
    """``torch.save``/``torch.load`` of the checkpoint dict: what ptrain does without a
    checkpoint plugin (ptrain writes through a temporary file, so a crash never leaves a half
    file, and reads with ``weights_only=True``)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any = None) -> None:
        if storage_options is not None:
            raise refuse("TorchCheckpointIO.save_checkpoint", "storage_options",
                         storage_options, "torch.save takes no storage options; leave it out")
        from ptrain import checkpoint_io

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        checkpoint_io.atomic_save(checkpoint, str(path))

    def load_checkpoint(self, path: Any, map_location: Any = None) -> dict[str, Any]:
        return torch.load(path, map_location=map_location or "cpu", weights_only=True)

    def remove_checkpoint(self, path: Any) -> None:
        Path(path).unlink(missing_ok=True)

    def ptrain_plugin(self) -> Any:
        return None if type(self) is TorchCheckpointIO else super().ptrain_plugin()


class AsyncCheckpointIO(CheckpointIO):
    """Lightning's background-thread checkpoint writer. Refused when made: ptrain's checkpoint
    callback ranks, links and prunes checkpoint files right after each save, and a resume
    relies on a finished file."""

    def __init__(self, checkpoint_io: Any = None) -> None:
        raise ConfigError(
            "AsyncCheckpointIO() is not supported by ptrain: its checkpoint callback ranks, "
            "prunes and points 'last' at each file right after saving it, and exact resume "
            "relies on a finished file, so writes are synchronous (and atomic: a crash never "
            "leaves half a file). Leave it out; to save less often, use ModelCheckpoint's "
            "every_n_train_steps or train_time_interval. See \"Coming from Lightning\" in "
            "ptrain's documentation.")


class XLACheckpointIO(CheckpointIO):
    """Checkpoints written with ``torch_xla``'s ``xm.save``: what ptrain's ``tpu`` accelerator
    does (``ptrain-xla``); with another accelerator the Trainer refuses it."""

    requires_accelerator = "tpu"

    def ptrain_plugin(self) -> Any:
        return None


class _CheckpointIOPlugin:
    """A program's :class:`CheckpointIO` as a ptrain plugin: global rank 0 writes through it,
    every rank reads through it."""

    name = "checkpoint-io"

    def __init__(self, io: CheckpointIO):
        self.io = io

    @hookimpl(tryfirst=True)
    def save_checkpoint(self, trainer: Any, checkpoint: dict[str, Any], path: str) -> bool:
        if trainer.is_global_zero:
            self.io.save_checkpoint(checkpoint, path)
        return True

    @hookimpl(tryfirst=True)
    def load_checkpoint(self, path: str) -> dict[str, Any]:
        return self.io.load_checkpoint(path)

    @hookimpl(tryfirst=True)
    def verify_checkpoint(self, path: str) -> bool:
        self.io.load_checkpoint(path)
        return True

    @hookimpl
    def teardown(self) -> None:
        self.io.teardown()


# -- layer synchronisation -----------------------------------------------------------------------


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
