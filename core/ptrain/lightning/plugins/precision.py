"""Lightning's precision plugin objects: each selects ptrain's precision plugin of the same
name (``MixedPrecision("bf16-mixed", "cpu")`` is ``precision="bf16-mixed"``); see
:mod:`ptrain.lightning.plugins`."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn

from ptrain.errors import ConfigError
from ptrain.lightning._common import refuse

__all__ = ["BitsandbytesPrecision", "DeepSpeedPrecision", "DoublePrecision", "FSDPPrecision",
           "HalfPrecision", "MixedPrecision", "Precision", "TransformerEnginePrecision",
           "XLAPrecision"]

_DTYPES = {"32-true": torch.float32, "64-true": torch.float64, "16-true": torch.float16,
           "bf16-true": torch.bfloat16, "16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}


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
                            dtype=_DTYPES[self.precision], cache_enabled=False):
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


#: Lightning's precision names for FP8 through NVIDIA's Transformer Engine
TRANSFORMER_ENGINE = ("transformer-engine", "transformer-engine-float16")
#: why they are refused, and ptrain's FP8 precision
TRANSFORMER_ENGINE_INSTEAD = (
    "Lightning's Transformer Engine precisions replace layers with NVIDIA's and keep the weights "
    "in bfloat16 or float16, which ptrain does not do; ptrain's FP8 precision is fp8-mixed "
    "(torchao's float8 matmuls for the Linear layers, float32 weights, bfloat16 autocast for the "
    "rest, on GPUs of compute capability 8.9 and newer): Trainer(precision='fp8-mixed'), with "
    "ptrain-fp8-precision installed")


class TransformerEnginePrecision(Precision):
    """Lightning's FP8 training through NVIDIA's Transformer Engine: refused when made (see
    :data:`TRANSFORMER_ENGINE_INSTEAD`; ptrain's FP8 is the ``fp8-mixed`` precision)."""

    def __init__(self, *, weights_dtype: Any, recipe: Any = None, replace_layers: Any = None,
                 fallback_compute_dtype: Any = None) -> None:
        super().__init__()
        raise refuse("TransformerEnginePrecision", "weights_dtype", weights_dtype,
                     TRANSFORMER_ENGINE_INSTEAD)