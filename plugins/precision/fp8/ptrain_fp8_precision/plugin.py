"""The ``fp8-mixed`` precision plugin."""

from __future__ import annotations

import dataclasses
import fnmatch

import torch
from torch import nn

from ptrain import ConfigError, hookimpl
from ptrain.options import to_bool, to_str_list
from ptrain.tuning import precision_candidate
from ptrain_fp8_precision._torchao import float8_training
from ptrain_fp8_precision.layers import LayerChoice, choose_layers
from ptrain_mixed_precision import BF16MixedPrecision

RECIPES = ("tensorwise", "rowwise")
#: the attribute of a module whose layers this plugin converted: their LayerChoice (a later
#: stage, e.g. validate after fit, trains or evaluates them as they are)
CONVERTED = "_ptrain_fp8_mixed_layers"
#: the first NVIDIA architecture with float8 tensor cores (Ada; Hopper is 9.0)
FLOAT8_CAPABILITY = (8, 9)
#: the attribute of a module whose state dict gives its float8 all-gather weights as the
#: weights they wrap (see _plain_weights)
PLAIN_WEIGHTS = "_ptrain_fp8_mixed_plain_weights"


class FP8MixedPrecision(BF16MixedPrecision):
    """``fp8-mixed``: the matmuls of the model's Linear layers in float8 (torchao's float8
    training, dynamic scaling), everything else as ``bf16-mixed`` does it (float32 weights and
    optimizer state, bfloat16 autocast). Weights stay float32 Parameters of the same names, so
    checkpoints load into any precision.

    The layers are converted in ``wrap_model`` before the strategy wraps or shards the model,
    or, under a tensor-parallel plan, as ``TrainModule.parallelize`` applies it (before torch
    splits them); which ones is said in one line at start-up (see :func:`choose_layers`)."""

    name = "fp8-mixed"
    alternative = "32-true"

    def __init__(self, recipe: str = "tensorwise", emulate: bool = False,
                 keep_ends: bool = True, skip: list[str] | None = None,
                 all_gather: bool = False, autocast_cache: bool = True) -> None:
        super().__init__(autocast_cache)
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
        BF16MixedPrecision.add_options(options)
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
                f"bf16-mixed, or add --fp8-mixed-emulate (in Python: plugin_options="
                f"{{'fp8-mixed': {{'emulate': True}}}}) to emulate float8 in high precision "
                f"(for tests and debugging: slower than bf16-mixed).")
        capability = torch.cuda.get_device_capability(device)
        if capability < FLOAT8_CAPABILITY:
            raise ConfigError(
                f"--precision fp8-mixed needs float8 tensor cores, from compute capability "
                f"{_dotted(FLOAT8_CAPABILITY)} (Ada, Hopper, Blackwell); "
                f"{torch.cuda.get_device_name(device)} has {_dotted(capability)}. Use "
                f"--precision bf16-mixed on this GPU.")

    @hookimpl
    def modify_parallel_plan(self, trainer, module: nn.Module, plan: dict) -> None:
        """Converts the chosen layers under ``module`` before the plan makes their weights
        DTensors (converting after it fails in the forward), and, with the tensorwise recipe,
        gives the plan's column- and row-wise entries for them torchao's float8 styles, which
        cast a layer's input to float8 before it is redistributed (as torchtitan does; the
        rowwise recipe keeps torch's styles, which torchao's float8 ones do not support)."""
        prefix = _path_in(trainer.module, module)
        if prefix is None:
            if any(isinstance(layer, nn.Linear) for layer in module.modules()):
                raise ConfigError(
                    f"self.parallelize was given a {type(module).__name__} that is not (yet) a "
                    f"part of {type(trainer.module).__name__}, and fp8-mixed chooses the "
                    f"layers to convert by their place in the model. Attach it to the model "
                    f"first (e.g. self.layers.append(block)), then apply its plan.")
            return  # no layer this plugin would convert
        torchao = float8_training()
        choice = self._choice(trainer.module, torchao.Float8Linear)
        if prefix in choice.convert and prefix not in choice.converted:
            raise ConfigError(
                f"self.parallelize was given the layer {prefix} itself, which fp8-mixed "
                f"converts to a torchao Float8Linear: a new layer, which can't take the place "
                f"of the one passed in. Give its parent module and the layer's path in the "
                f"plan: self.parallelize(parent, mesh, {{'{prefix.rpartition('.')[2]}': "
                f"style}}).")
        inside = prefix + "." if prefix else ""
        self._convert(trainer.module, [name for name in choice.convert
                                       if name.startswith(inside) and name not in choice.converted])
        if self.recipe == "tensorwise":
            _give_float8_styles(module, plan, torchao)

    @hookimpl(wrapper=True)
    def wrap_model(self, trainer, model: nn.Module):
        torchao = float8_training()
        # the user's module (``model`` holds it as ``model.module``): layer names as the user
        # sees them; its layers are swapped in place, so ``model`` holds the converted ones
        module = trainer.module
        choice = self._choice(module, torchao.Float8Linear)
        self._convert(module, [name for name in choice.convert if name not in choice.converted])
        self.layers = choice
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

    def _choice(self, module: nn.Module, float8_linear: type) -> LayerChoice:
        """The module's LayerChoice: made once, over the whole module (the first and last
        layers are the model's), and kept on it, so that a later stage (validate after fit)
        finds its layers converted; the model is checked for layers it can't convert."""
        choice = module.__dict__.get(CONVERTED)
        if choice is None:
            # layers the model converted itself would be named as kept subclasses: said first
            _refuse_converted_or_parallel(module, LayerChoice(), float8_linear)
            choice = choose_layers(module, self.keep_ends, self.skip, self.all_gather)
            choice.options = self._options()
            module.__dict__[CONVERTED] = choice  # a plain attribute: not a submodule
        elif choice.options != self._options():  # left converted by an earlier stage
            raise ConfigError(
                f"{type(module).__name__}'s layers were converted to float8 by an earlier "
                f"fp8-mixed stage with {_described(choice.options)}, and stay so (their "
                f"weights were sharded or split in place); this stage asks for "
                f"{_described(self._options())}. Give this stage the same fp8-mixed options, "
                f"or load the checkpoint into a new {type(module).__name__} to convert it "
                f"otherwise.")
        late = [name for name, layer in module.named_modules() if isinstance(layer, nn.Linear)
                and name not in choice.convert and name not in choice.kept]
        if late:
            raise ConfigError(
                f"{type(module).__name__} made Linear layers after fp8-mixed chose which to "
                f"convert, at the first self.parallelize call: {', '.join(late[:6])}"
                f"{' ...' if len(late) > 6 else ''}. Make all of the model's layers in "
                f"configure_model before applying a plan.")
        _refuse_converted_or_parallel(module, choice, float8_linear)
        return choice

    def _options(self) -> dict[str, object]:
        return {"recipe": self.recipe, "emulate": self.emulate, "keep_ends": self.keep_ends,
                "skip": self.skip, "all_gather": self.all_gather}

    @hookimpl
    def teardown(self, trainer, stage: str) -> None:
        """The module leaves the stage with its own Linear modules back in their places,
        holding the Parameters they trained, so that a later stage under another precision
        computes as it asks, and a later fp8-mixed stage converts them anew, with its own
        options. Layers whose weights
        were sharded or split in place (a sharding strategy in this process, a tensor-parallel
        plan) can't go back: they stay converted, and a later stage must ask for the same
        options (:meth:`_choice`)."""
        module = trainer.module
        choice = None if module is None else module.__dict__.get(CONVERTED)
        if choice is not None and _unconvert(module, choice):
            del module.__dict__[CONVERTED]

    def _convert(self, module: nn.Module, names: list[str]) -> None:
        """Swaps the Linear layers ``names`` of ``module`` for torchao's float8 layers."""
        if not names:
            return
        torchao = float8_training()
        config = dataclasses.replace(
            torchao.Float8LinearConfig.from_recipe_name(self.recipe), emulate=self.emulate,
            enable_fsdp_float8_all_gather=self.all_gather)
        wanted = set(names)
        choice = module.__dict__[CONVERTED]
        originals = {name: module.get_submodule(name) for name in names}
        torchao.convert_to_float8_training(module, config=config,
                                           module_filter_fn=lambda _, name: name in wanted)
        choice.originals.update(originals)
        if self.all_gather and not module.__dict__.get(PLAIN_WEIGHTS):
            module.register_state_dict_post_hook(_plain_weights)
            module.__dict__[PLAIN_WEIGHTS] = True


def _plain_weights(module: nn.Module, state_dict: dict, prefix: str, metadata: dict) -> None:
    """A state-dict hook: under float8 all-gather torchao wraps each converted layer's weight
    (``WeightWithDynamicFloat8CastTensor``), a class only a process that imported torchao may
    unpickle; the state dict holds the float32 weight it wraps instead (as a DTensor of the
    same layout where the weight is one), so that checkpoints load, resume and export without
    torchao. It shares the weight's memory: loading into the state dict loads the weight."""
    from torch.distributed.tensor import DTensor

    wrapper = float8_training().WeightWithDynamicFloat8CastTensor
    for key, value in state_dict.items():
        local = value.to_local() if isinstance(value, DTensor) else value
        if not isinstance(local, wrapper):
            continue
        state_dict[key] = local._tensor if not isinstance(value, DTensor) else \
            DTensor.from_local(local._tensor, value.device_mesh, value.placements,
                               run_check=False, shape=value.shape, stride=value.stride())


def _unconvert(model: nn.Module, choice: LayerChoice) -> bool:
    """Puts each converted layer's own Linear module back in its place (its hooks and
    identity), holding the float8 layer's Parameters as they are now (a strategy may have
    given them memory: a model built on the meta device); ``False``, changing nothing, where
    a weight was sharded or split in place (a DTensor) or is wrapped in another way."""
    layers = [(name, model.get_submodule(name)) for name in choice.converted]
    weights = [_own_parameter(layer.weight) for _, layer in layers]
    if any(weight is None for weight in weights):
        return False
    for (name, layer), weight in zip(layers, weights):
        original = choice.originals[name]
        original.weight, original.bias = weight, layer.bias
        original.train(layer.training)
        parent, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent), attribute, original)
    return True


def _own_parameter(weight: nn.Parameter) -> nn.Parameter | None:
    """A float8 layer's weight as a plain Parameter: itself, or the Parameter the float8
    all-gather's wrapper holds; ``None`` for a DTensor or another wrapper."""
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if isinstance(weight, DTensor):
        return None
    inner = getattr(weight, "_tensor", None) if is_traceable_wrapper_subclass(weight) else weight
    return inner if isinstance(inner, nn.Parameter) else None


def _described(options: dict[str, object]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in options.items())


def _refuse_converted_or_parallel(model: nn.Module, choice: LayerChoice,
                                  float8_linear: type) -> None:
    """A model that converted layers itself, or applied a tensor-parallel plan with torch's
    ``parallelize_module`` to layers this plugin converts, is refused: converting again would
    nest torchao's layers, and a layer converted after its plan fails in the forward (mixed
    Tensor and DTensor); ``TrainModule.parallelize`` converts before the plan is applied."""
    from torch.distributed.tensor import DTensor

    for name, module in model.named_modules():
        if isinstance(module, float8_linear) and name not in choice.converted:
            raise ConfigError(
                f"{type(model).__name__}.{name} is already a torchao Float8Linear: convert "
                f"the layers either in the model (then train with --precision bf16-mixed) or "
                f"with --precision fp8-mixed, not both.")
        if name in choice.convert and name not in choice.converted and \
                isinstance(module.weight, DTensor):
            raise ConfigError(
                f"{type(model).__name__}.{name} had a tensor-parallel plan applied by torch's "
                f"parallelize_module (its weight is a DTensor), and fp8-mixed must convert a "
                f"layer before its plan is applied. In configure_model, call "
                f"self.parallelize(module, mesh, plan) instead of parallelize_module(module, "
                f"mesh, plan): the same arguments, with fp8-mixed taking part.")


def _path_in(model: nn.Module | None, module: nn.Module) -> str | None:
    """``module``'s path in ``model`` ("" for ``model`` itself), ``None`` if not a part of it
    (or no model is set: a module given a trainer by hand, outside a stage)."""
    parts = model.named_modules() if model is not None else ()
    return next((name for name, part in parts if part is module), None)


def _give_float8_styles(module: nn.Module, plan: dict, torchao) -> None:
    """Each plan entry in torch's ``ColwiseParallel`` or ``RowwiseParallel`` (those types
    exactly: a subclass's behaviour is its own) whose layers are float8 layers gets torchao's
    float8 style of the same layouts. An entry whose pattern reaches float8 layers and others
    becomes one entry per layer, in its place."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    float8_styles = {ColwiseParallel: torchao.Float8ColwiseParallel,
                     RowwiseParallel: torchao.Float8RowwiseParallel}
    entries = list(plan.items())
    plan.clear()
    for key, style in entries:
        float8_style = float8_styles.get(type(style))
        layers = _planned(module, key) if float8_style else []
        float8 = [isinstance(layer, torchao.Float8Linear) for _, layer in layers]
        if not any(float8):
            plan[key] = style
        elif all(float8):
            plan[key] = _restyled(style, float8_style)
        else:
            for (path, _), is_float8 in zip(layers, float8):
                plan[path] = _restyled(style, float8_style) if is_float8 else style


def _planned(module: nn.Module, key: str) -> list[tuple[str, nn.Module]]:
    """The submodules of ``module`` a plan key names, with their paths, as torch's
    ``parallelize_module`` matches it (each dot-separated part an ``fnmatch`` pattern)."""
    found = [("", module)]
    for token in key.split(".") if key else []:
        found = [(f"{path}.{name}" if path else name, child) for path, parent in found
                 for name, child in parent.named_children() if fnmatch.fnmatch(name, token)]
    return found


def _restyled(style, float8_style):
    """``float8_style`` with ``style``'s layouts."""
    return float8_style(input_layouts=style.input_layouts[0],
                        output_layouts=style.output_layouts[0],
                        use_local_output=style.use_local_output)


def _sharded_by_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(module, FSDPModule) for module in model.modules())


def _dotted(capability: tuple[int, int]) -> str:
    return ".".join(map(str, capability))
