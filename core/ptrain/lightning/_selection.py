"""Lightning's ``Trainer(accelerator=, strategy=, plugins=, profiler=)`` -> the ptrain plugins
they select and those plugins' options.

Each accepts what Lightning accepts there: names (Lightning's and ptrain's), and Lightning's
objects from ``ptrain.lightning.accelerators``, ``.strategies``, ``.plugins`` and
``.profilers``, which stand for ptrain plugins with options (see each module). A combination
Lightning refuses (two precisions), or one ptrain can't run, is a :class:`ptrain.ConfigError`
naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ptrain.lightning._common import refuse
from ptrain.lightning.plugins.precision import TRANSFORMER_ENGINE, TRANSFORMER_ENGINE_INSTEAD

#: Lightning's strategy names that are ptrain's under another name, without options
_RENAMED_STRATEGIES = {"single_device": "single-device"}
#: ptrain's strategies that write their own sharded checkpoints
_SHARDED = ("fsdp", "zero2", "zero3")


@dataclass
class Selection:
    """The ptrain choices: ``accelerator``, ``strategy`` and ``precision`` (names or plugin
    objects; ``precision`` ``None`` when the Trainer's own argument decides), ``devices``,
    ``callbacks`` to add (names or objects; always the one that reads several training loaders
    as Lightning does) and ``implied`` plugin options (name -> options)."""

    accelerator: Any
    strategy: Any
    precision: Any
    devices: Any
    callbacks: list[Any] = field(default_factory=list)
    implied: dict[str, dict[str, Any]] = field(default_factory=dict)


#: ptrain's precisions that autocast (the ``autocast_cache`` option of ``ptrain-mixed-precision``)
_AUTOCAST_PRECISIONS = ("16-mixed", "bf16-mixed")


def _accelerator_name(value: Any) -> str | None:
    if isinstance(value, str):
        from ptrain.config import canonical_plugin_name

        return canonical_plugin_name("accelerator", value)
    return None


def _callback_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def select(given: dict[str, Any]) -> Selection:
    """The ptrain choices for Lightning's Trainer arguments ``given``. A profiler given by name
    is made here and put back in ``given["profiler"]``, so that ``trainer.profiler`` is the
    object the run reports with."""
    from ptrain.lightning.accelerators import ptrain_accelerator
    from ptrain.lightning.plugins import CheckpointIO, LayerSync, MixedPrecision, Precision
    from ptrain.lightning.plugins.environments import ClusterEnvironment
    from ptrain.lightning.strategies import lightning_strategy

    from ptrain.lightning._checkpointing import LightningCheckpointKeys, default_checkpoint
    from ptrain.lightning._seeding import ReseedEachStage
    from ptrain.lightning._validation_grad import FitValidationNoGrad
    from ptrain.lightning.utilities.combined_loader import CombinedTrainingData

    chosen = Selection(ptrain_accelerator(given["accelerator"]), given["strategy"],
                       None, given["devices"],
                       callbacks=[CombinedTrainingData(), LightningCheckpointKeys(),
                                  ReseedEachStage(), FitValidationNoGrad(),
                                  *default_checkpoint(given)])
    if given["precision"] in TRANSFORMER_ENGINE:
        raise refuse("Trainer", "precision", given["precision"], TRANSFORMER_ENGINE_INSTEAD)
    precisions: list[Precision] = []
    ios: list[CheckpointIO] = []

    def implied(name: str, options: dict[str, Any]) -> None:
        if options:
            chosen.implied[name] = {**chosen.implied.get(name, {}), **options}

    from ptrain.builtins.model_summary import ModelSummary

    if given["enable_model_summary"] is not False and not any(
            isinstance(c, ModelSummary) for c in _callback_list(given["callbacks"])):
        # Lightning's summary runs the example_input_array through the module (for its In/Out
        # sizes), drawing what the forward draws: the default summary does it too
        implied("model-summary", {"example_sizes": True})

    # -- strategy --------------------------------------------------------------------------
    strategy = given["strategy"]
    lightning = None if strategy in _RENAMED_STRATEGIES else lightning_strategy(strategy)
    if lightning is not None:
        choice = lightning.ptrain_choice()
        chosen.strategy = choice.name
        implied(choice.name, choice.options)
        if choice.accelerator is not None:
            carried = ptrain_accelerator(choice.accelerator)
            asked = _accelerator_name(given["accelerator"])
            if asked not in (None, "auto") and asked != _accelerator_name(carried):
                raise refuse("Trainer", "accelerator", given["accelerator"],
                             f"the strategy object carries accelerator {carried!r}; give the "
                             f"accelerator once, to the Trainer or to the strategy")
            if asked in (None, "auto"):
                chosen.accelerator = carried
        if choice.devices is not None and given["devices"] == "auto":
            chosen.devices = choice.devices
        if choice.precision_plugin is not None:
            precisions.append(choice.precision_plugin)
        if choice.checkpoint_io is not None:
            ios.append(choice.checkpoint_io)
        for entry in choice.callbacks:
            chosen.callbacks.append(entry)
        for name, options in choice.callback_options.items():
            implied(name, options)
    elif isinstance(strategy, str):
        chosen.strategy = _RENAMED_STRATEGIES.get(strategy, strategy)

    # -- plugins ---------------------------------------------------------------------------
    entries = given["plugins"]
    entries = [] if entries is None else list(entries) if isinstance(entries, (list, tuple)) \
        else [entries]
    for entry in entries:
        if isinstance(entry, Precision):
            precisions.append(entry)
        elif isinstance(entry, CheckpointIO):
            ios.append(entry)
        elif isinstance(entry, LayerSync):
            chosen.callbacks.append(entry)
        elif isinstance(entry, ClusterEnvironment):
            for name, options in entry.ptrain_options.items():
                implied(name, options)
        else:
            raise refuse("Trainer", "plugins", given["plugins"],
                         f"{entry!r} is not one of Lightning's plugin objects ptrain takes: a "
                         f"precision (ptrain.lightning.plugins.MixedPrecision, ...), a "
                         f"checkpoint IO, a layer sync (TorchSyncBatchNorm) or a cluster "
                         f"environment (ptrain.lightning.plugins.environments)")
    if len(precisions) > 1:
        raise refuse("Trainer", "plugins", given["plugins"],
                     "give one precision plugin (to the Trainer's plugins or the strategy)")
    if precisions:
        precision = precisions[0]
        if given["precision"] is not None:
            raise refuse("Trainer", "precision", given["precision"],
                         f"a precision plugin ({type(precision).__name__}) was given too; "
                         f"give the precision once")
        precision.check_usable()
        chosen.precision = precision.ptrain_name
        implied(precision.ptrain_name, precision.ptrain_options)
        if isinstance(precision, MixedPrecision):
            asked = _accelerator_name(chosen.accelerator)
            device = _accelerator_name(str(precision.device).split(":")[0])
            if asked not in (None, "auto") and asked != device:
                raise refuse("MixedPrecision", "device", precision.device,
                             f"autocast runs on the run's device; give "
                             f"device={asked!r}, the accelerator's")
    precision_name = chosen.precision if chosen.precision is not None else given["precision"]
    if isinstance(precision_name, (str, int)) and not isinstance(precision_name, bool):
        from ptrain.config import canonical_plugin_name

        name = canonical_plugin_name("precision", precision_name)
        if name in _AUTOCAST_PRECISIONS:  # Lightning's autocast keeps no weight cache
            implied(name, {"autocast_cache": False})
    if len(ios) > 1:
        raise refuse("Trainer", "plugins", given["plugins"], "give one checkpoint IO plugin")
    for io in ios:
        needed = getattr(io, "requires_accelerator", None)
        if needed is not None and _accelerator_name(chosen.accelerator) != needed:
            raise refuse("Trainer", "plugins", given["plugins"],
                         f"{type(io).__name__} is what ptrain's {needed!r} accelerator does; "
                         f"use it with accelerator={needed!r}, or leave it out")
        plugin = io.ptrain_plugin()
        if plugin is not None:
            if chosen.strategy in _SHARDED:
                raise refuse("Trainer", "plugins", given["plugins"],
                             f"ptrain's {chosen.strategy} writes and reads its own sharded "
                             f"checkpoints (every rank its shards), which a checkpoint IO that "
                             f"rank 0 writes with can't hold; leave {type(io).__name__} out")
            chosen.callbacks.append(plugin)

    # -- profiler ----------------------------------------------------------------------------
    profiler = given["profiler"]
    if isinstance(profiler, str):
        from ptrain.lightning.profilers import PROFILERS

        if profiler not in PROFILERS:
            raise refuse("Trainer", "profiler", profiler,
                         f"choose one of {', '.join(map(repr, PROFILERS))} or a profiler object")
        profiler = given["profiler"] = PROFILERS[profiler]()
    if profiler is not None:
        if not hasattr(profiler, "ptrain_plugin"):
            raise refuse("Trainer", "profiler", profiler,
                         "give one of ptrain.lightning.profilers' objects or names")
        entry = profiler.ptrain_plugin()
        if isinstance(entry, tuple):
            name, options = entry
            chosen.callbacks.append(name)
            implied(name, options)
        elif entry is not None:
            chosen.callbacks.append(entry)
    return chosen
