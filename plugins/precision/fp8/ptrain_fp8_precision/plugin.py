"""The ``fp8-mixed`` precision plugin."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ptrain import ConfigError, hookimpl
from ptrain.options import to_bool, to_str_list
from ptrain.tuning import precision_candidate
from ptrain_fp8_precision._torchao import float8_training
from ptrain_fp8_precision.layers import choose_layers
from ptrain_mixed_precision import BF16MixedPrecision

RECIPES = ("tensorwise", "rowwise")
#: the attribute of a module whose layers this plugin converted: their LayerChoice (a later
#: stage, e.g. validate after fit, trains or evaluates them as they are)
CONVERTED = "_ptrain_fp8_mixed_layers"
#: the first NVIDIA architecture with float8 tensor cores (Ada; Hopper is 9.0)
FLOAT8_CAPABILITY = (8, 9)


class FP8MixedPrecision(BF16MixedPrecision):
    """``fp8-mixed``: the matmuls of the model's Linear layers in float8 (torchao's float8
    training, dynamic scaling), everything else as ``bf16-mixed`` does it (float32 weights and
    optimizer state, bfloat16 autocast). Weights stay float32 Parameters of the same names, so
    checkpoints load into any precision.

    The layers are converted in ``wrap_model`` before the strategy wraps or shards the model;
    which ones is said in one line at start-up (see :func:`choose_layers`)."""

    name = "fp8-mixed"
    alternative = "32-true"

    def __init__(self, recipe: str = "tensorwise", emulate: bool = False,
                 keep_ends: bool = True, skip: list[str] | None = None,
                 all_gather: bool = False) -> None:
        self.recipe, self.emulate, self.keep_ends = recipe, emulate, keep_ends
        self.skip, self.all_gather = list(skip or []), all_gather
        if all_gather and recipe != "tensorwise":
            raise ConfigError(
                f"--fp8-mixed-all-gather gathers each weight in float8 with one scale per "
                f"tensor, which only the tensorwise recipe has; this run asks for "
                f"--fp8-mixed-recipe {recipe}. Use --fp8-mixed-recipe tensorwise, or leave "
                f"--fp8-mixed-all-gather off.")
        self.layers = None  # the LayerChoice, once the model is converted

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("recipe", str, default="tensorwise", choices=RECIPES,
                    help="how float8 scales are taken: tensorwise (one scale per tensor, the "
                         "fastest) or rowwise (one per row: more accurate, a little slower)")
        options.add("emulate", to_bool, default=False,
                    help="emulate float8 matmuls in high precision, on any device (tests and "
                         "debugging: same numbers, slower than bf16-mixed)")
        options.add("keep_ends", to_bool, default=True,
                    help="keep the model's first and last Linear layers in high precision")
        options.add("skip", to_str_list, default=[],
                    help="Linear layers to keep in high precision: names or * patterns, "
                         "comma-separated (e.g. 'lm_head,*.router')")
        options.add("all_gather", to_bool, default=False,
                    help="under a sharding strategy (fsdp, model-parallel), all-gather the "
                         "converted weights in float8: half the traffic of bfloat16 "
                         "(tensorwise recipe only)")

    @classmethod
    @hookimpl
    def tune_candidates(cls, trainer):
        """Offered on a run that trains on a CUDA GPU with float8 tensor cores."""
        if "cuda" not in trainer.plugins or not torch.cuda.is_available() or \
                torch.cuda.get_device_capability() < FLOAT8_CAPABILITY:
            return []
        return precision_candidate(trainer, cls.name)

    def device_setup(self, device: torch.device) -> None:
        if self.emulate:
            return
        if device.type != "cuda":
            raise ConfigError(
                f"--precision fp8-mixed computes matmuls in float8, which needs an NVIDIA GPU "
                f"of compute capability {_dotted(FLOAT8_CAPABILITY)} or newer (Ada, Hopper, "
                f"Blackwell); this run trains on the {device.type!r} device. Use --precision "
                f"bf16-mixed, or add --fp8-mixed-emulate to emulate float8 in high "
                f"precision (for tests and debugging: slower than bf16-mixed).")
        capability = torch.cuda.get_device_capability(device)
        if capability < FLOAT8_CAPABILITY:
            raise ConfigError(
                f"--precision fp8-mixed needs float8 tensor cores, from compute capability "
                f"{_dotted(FLOAT8_CAPABILITY)} (Ada, Hopper, Blackwell); "
                f"{torch.cuda.get_device_name(device)} has {_dotted(capability)}. Use "
                f"--precision bf16-mixed on this GPU.")

    @hookimpl(wrapper=True)
    def wrap_model(self, trainer, model: nn.Module):
        torchao = float8_training()
        # the user's module (``model`` holds it as ``model.module``): layer names as the user
        # sees them; its layers are swapped in place, so ``model`` holds the converted ones
        module = trainer.module
        self.layers = module.__dict__.get(CONVERTED)
        if self.layers is None:  # not converted by an earlier stage
            _refuse_converted_or_parallel(module, torchao.Float8Linear)
            self.layers = choose_layers(module, self.keep_ends, self.skip)
            chosen = set(self.layers.convert)
            config = dataclasses.replace(
                torchao.Float8LinearConfig.from_recipe_name(self.recipe), emulate=self.emulate,
                enable_fsdp_float8_all_gather=self.all_gather)
            torchao.convert_to_float8_training(module, config=config,
                                               module_filter_fn=lambda _, name: name in chosen)
            module.__dict__[CONVERTED] = self.layers  # a plain attribute: not a submodule
        # torchao's float8 tensors can't take the dtype cast autocast makes under
        # inference_mode ("aten.to.dtype ... not supported"): evaluation runs under no_grad,
        # as the inference_mode option documents for such plugins
        trainer.inference_mode = False
        wrapped = yield
        if self.all_gather and not _sharded_by_fsdp(wrapped):
            raise ConfigError(
                f"--fp8-mixed-all-gather all-gathers sharded weights in float8, and --strategy "
                f"{trainer.options['strategy']} does not shard them with FSDP. Use --strategy "
                f"fsdp or model-parallel, or leave --fp8-mixed-all-gather off.")
        if trainer.is_global_zero:
            how = self.recipe + (", emulated" if self.emulate else "")
            print(f"fp8-mixed ({how}): {self.layers.summary()}", flush=True)
        return wrapped


def _refuse_converted_or_parallel(model: nn.Module, float8_linear: type) -> None:
    """A model that converted layers itself, or applied a tensor-parallel plan to them, is
    refused: converting again would nest torchao's layers, and a tensor-parallel plan needs
    torchao's float8 plan styles, which this plugin does not apply yet."""
    from torch.distributed.tensor import DTensor

    for name, module in model.named_modules():
        if isinstance(module, float8_linear):
            raise ConfigError(
                f"{type(model).__name__}.{name} is already a torchao Float8Linear: convert "
                f"the layers either in the model (then train with --precision bf16-mixed) or "
                f"with --precision fp8-mixed, not both.")
        if isinstance(module, nn.Linear) and isinstance(module.weight, DTensor):
            raise ConfigError(
                f"{type(model).__name__}.{name} has a tensor-parallel plan applied (its weight "
                f"is a DTensor), and fp8-mixed does not convert tensor-parallel layers yet: they "
                f"need torchao's Float8ColwiseParallel and Float8RowwiseParallel plan styles. "
                f"Use --precision bf16-mixed with tensor parallelism; with "
                f"--model-parallel-tensor 1, apply no plan in configure_model and fp8-mixed "
                f"converts the layers.")


def _sharded_by_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(module, FSDPModule) for module in model.modules())


def _dotted(capability: tuple[int, int]) -> str:
    return ".".join(map(str, capability))
