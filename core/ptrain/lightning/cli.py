"""``lightning.pytorch.cli``: ``LightningCLI`` over ptrain, built on jsonargparse.

A Lightning program that starts with ``LightningCLI(MyModel, MyDataModule)`` keeps its command
line: the subcommands ``fit``, ``validate``, ``test`` and ``predict`` with their own arguments
(``--ckpt_path``), ``--config`` YAML files, ``--print_config``, ``--trainer.*``, ``--model.*``,
``--data.*``, ``class_path``/``init_args``, ``--optimizer``/``--lr_scheduler`` and the subclass
hooks (``add_arguments_to_parser``, ``before_fit``, ...). The trainer it makes is
:class:`ptrain.lightning.Trainer`, so the run is ptrain's; :class:`SaveConfigCallback` writes the
resolved ``config.yaml`` into ptrain's run folder.

jsonargparse comes with the ``cli`` extra (``pip install "ptrain-core[cli]"``). This module
imports without it; using the CLI then raises an error naming that command. The deliberate
differences from Lightning are listed in docs/from-lightning.md, "LightningCLI".
"""

import contextlib
import importlib
import importlib.util
import inspect
import sys
import typing
import warnings
from collections.abc import Iterable, Iterator
from functools import partial, update_wrapper
from pathlib import Path
from types import MethodType
from typing import Any, Callable, Optional, TypeVar, Union

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from ptrain._version import __version__
from ptrain.lightning import __version__ as _LIGHTNING_API
from ptrain.errors import ConfigError, PtrainError
from ptrain.hook_methods import Callback
from ptrain.lightning.trainer import Trainer
from ptrain.module import DataModule as LightningDataModule
from ptrain.module import TrainModule as LightningModule
from ptrain.trainer import Trainer as _NativeTrainer
from ptrain.lightning.utilities.seed import seed_everything

try:
    import jsonargparse
    from jsonargparse import ActionConfigFile, ArgumentParser, Namespace
except ImportError:  # the cli extra is not installed: the error comes when the CLI is used
    jsonargparse = None

    class ArgumentParser:  # type: ignore[no-redef]
        """Stands in for jsonargparse's parser while jsonargparse is missing."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            _require_jsonargparse()

    class Namespace:  # type: ignore[no-redef]
        """Stands in for jsonargparse's Namespace while jsonargparse is missing."""
else:
    # torch's classes whose __module__ is not where they import from print as torch.X
    jsonargparse.register_unresolvable_import_paths(torch)
    if importlib.util.find_spec("fsspec") is not None:  # --config s3://..., as Lightning reads
        if hasattr(jsonargparse, "set_parsing_settings"):
            jsonargparse.set_parsing_settings(config_read_mode_fsspec_enabled=True)
        else:
            jsonargparse.set_config_read_mode(fsspec_enabled=True)

#: what to install for this module
INSTALL = 'pip install "ptrain-core[cli]"'

#: whether jsonargparse is importable here (Lightning's name for the same question; a program
#: checks it before importing jsonargparse's ``Namespace``/``lazy_instance``)
_JSONARGPARSE_SIGNATURES_AVAILABLE = jsonargparse is not None


def _require_jsonargparse() -> None:
    if jsonargparse is None:
        raise ModuleNotFoundError(
            f"ptrain.lightning.cli needs jsonargparse (with its signatures extra), which is not "
            f"installed: {INSTALL}, or pip install \"jsonargparse[signatures]>=4.39,<5\".")


ModuleType = TypeVar("ModuleType")


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """torch's ``ReduceLROnPlateau`` that also names the logged metric it steps on
    (``monitor``), so a scheduler chosen on the command line (``--lr_scheduler``) carries it
    to ``configure_optimizers``."""

    def __init__(self, optimizer: Optimizer, monitor: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, *args, **kwargs)
        self.monitor = monitor


#: the schedulers ``--lr_scheduler`` takes (torch's ReduceLROnPlateau has no ``monitor``; a
#: scheduler without it can't step on a metric, so the one above is named beside the base)
LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerTypeUnion = Union[LRScheduler, ReduceLROnPlateau]
LRSchedulerType = Union[type[LRScheduler], type[ReduceLROnPlateau]]

#: what ``LightningCLI(args=...)`` takes: command-line words, or a parsed or plain config
ArgsType = Optional[Union[list[str], dict[str, Any], Namespace]]
#: an argument type for a model that makes its own optimizer from its parameters
OptimizerCallable = Callable[[Iterable], Optimizer]
#: an argument type for a model that makes its own scheduler from its optimizer
LRSchedulerCallable = Callable[[Optimizer], Union[LRScheduler, ReduceLROnPlateau]]

#: arguments of ptrain's own Trainer the CLI does not offer: ``seed`` would be a second seed
#: beside the CLI's ``seed_everything``, and ``catalog`` is the plugins found, not a setting
_HIDDEN_TRAINER_ARGUMENTS = frozenset({"seed", "catalog"})


# -- the trainer's argument types ---------------------------------------------------------------

def _exported_classes(module_name: str) -> list[type]:
    """The public classes of ``module_name`` (its ``__all__``, else its names without a
    leading underscore), those of a distribution that is not installed left out, each once: a
    class whose base class is already listed is covered by it."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
    found: list[type] = []
    for name in names:
        try:
            value = getattr(module, name)
        except ImportError:
            continue
        if inspect.isclass(value) and value.__module__.startswith("ptrain") \
                and value not in found:
            found.append(value)
    # a real base only: a virtual subclass (``Checkpoint.register``) is not one to jsonargparse
    return [c for c in found if not any(c is not o and o in c.__mro__ for o in found)]


def _one_of(classes: list[type]) -> Any:
    return Union[tuple(classes)] if classes else Any


def _callback_type() -> Any:
    """What an entry of ``trainer.callbacks`` may be: a :class:`Callback` subclass (Lightning's
    rule) or one of ptrain.lightning.callbacks' classes."""
    classes = _exported_classes("ptrain.lightning.callbacks")
    return _one_of([Callback] + [c for c in classes if not issubclass(c, Callback)])


def _logger_type() -> Any:
    """What one logger in ``trainer.logger`` may be: a class of ptrain.lightning.loggers."""
    return _one_of(_exported_classes("ptrain.lightning.loggers"))


def _trainer_argument_types() -> dict[str, Any]:
    """Lightning's types for the trainer arguments ptrain's Trainer takes as ``Any``, where the
    type decides what the command line accepts (``--trainer.callbacks+=EarlyStopping``,
    ``--trainer.logger=CSVLogger``)."""
    one_callback, one_logger = _callback_type(), _logger_type()
    return {"callbacks": Optional[Union[list[one_callback], one_callback]],
            "logger": Optional[Union[one_logger, Iterable[one_logger], bool]]}


def _trainer_signature(trainer_class: type) -> Optional[Callable[..., Any]]:
    """A function taking ``trainer_class``'s init arguments, typed as the CLI reads them: the
    annotations evaluated, and Lightning's types where ptrain's are ``Any`` (see
    :func:`_trainer_argument_types`). ``None`` when the init takes ``*args``/``**kwargs``
    (jsonargparse then follows them through the class itself) or its annotations can't be
    evaluated."""
    init = trainer_class.__init__
    parameters = list(inspect.signature(init).parameters.values())[1:]
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
        return None
    try:
        hints = typing.get_type_hints(init)
    except Exception:  # an annotation that can't be evaluated here: jsonargparse reads the class
        return None
    lightning_types = _trainer_argument_types()
    typed = []
    for p in parameters:
        if p.name in _HIDDEN_TRAINER_ARGUMENTS:
            continue
        hint = hints.get(p.name, Any)
        if hint is Any:
            hint = lightning_types.get(p.name, Any)
        typed.append(p.replace(annotation=hint))

    def make_trainer(**kwargs: Any) -> Any:
        return trainer_class(**kwargs)

    make_trainer.__signature__ = inspect.Signature(typed, return_annotation=trainer_class)
    make_trainer.__name__ = make_trainer.__qualname__ = trainer_class.__name__
    make_trainer.__doc__ = None
    return make_trainer


def _is_callback_class(cls: type) -> bool:
    return issubclass(cls, Callback) or any(
        issubclass(cls, c) for c in _exported_classes("ptrain.lightning.callbacks"))


# -- the parser -------------------------------------------------------------------------------

class LightningArgumentParser(ArgumentParser):
    """jsonargparse's ``ArgumentParser`` with the groups a Lightning program is made of: a
    trainer, a module, a data module, callbacks, an optimizer and a scheduler.

    ``env_prefix`` and ``default_env`` are jsonargparse's: with ``default_env=True`` every
    option also reads an environment variable (``PL_FIT__TRAINER__MAX_EPOCHS``)."""

    def __init__(self, *args: Any, description: str = "A Lightning program's command line, "
                 "run by ptrain", env_prefix: str = "PL", default_env: bool = False,
                 **kwargs: Any) -> None:
        _require_jsonargparse()
        super().__init__(*args, description=description, env_prefix=env_prefix,
                         default_env=default_env, **kwargs)
        #: the keys of the callback groups added with add_lightning_class_args
        self.callback_keys: list[str] = []
        # key -> (class or classes, link target or "AUTOMATIC")
        self._optimizers: dict[str, tuple[Any, str]] = {}
        self._lr_schedulers: dict[str, tuple[Any, str]] = {}

    def add_lightning_class_args(self, lightning_class: Any, nested_key: str,
                                 subclass_mode: bool = False, required: bool = True) -> list[str]:
        """Add the init arguments of ``lightning_class`` (a Trainer, LightningModule,
        LightningDataModule or callback class, or a function returning one) under
        ``nested_key``; ``subclass_mode``: any subclass, chosen with ``class_path``. A callback
        group's object joins the trainer's callbacks. Returns the names added."""
        if callable(lightning_class) and not inspect.isclass(lightning_class):
            lightning_class = jsonargparse.class_from_function(lightning_class)
        if not inspect.isclass(lightning_class) or not (
                issubclass(lightning_class, (_NativeTrainer, LightningModule,
                                             LightningDataModule))
                or _is_callback_class(lightning_class)):
            raise ConfigError(
                f"add_lightning_class_args({lightning_class!r}, {nested_key!r}): the class must "
                f"be a subclass of Trainer, LightningModule, LightningDataModule or a callback "
                f"class (ptrain.lightning.Callback or one of ptrain.lightning.callbacks), or a "
                f"function returning one; add other arguments with parser.add_argument or "
                f"parser.add_class_arguments.")
        if _is_callback_class(lightning_class):
            self.callback_keys.append(nested_key)
        if subclass_mode:
            return self.add_subclass_arguments(lightning_class, nested_key, fail_untyped=False,
                                               required=required)
        if issubclass(lightning_class, _NativeTrainer):
            typed = _trainer_signature(lightning_class)
            if typed is not None:
                return self.add_function_arguments(typed, nested_key, fail_untyped=False,
                                                   sub_configs=True)
            return self.add_class_arguments(lightning_class, nested_key, fail_untyped=False,
                                            instantiate=False, sub_configs=True,
                                            skip=set(_HIDDEN_TRAINER_ARGUMENTS))
        return self.add_class_arguments(lightning_class, nested_key, fail_untyped=False,
                                        instantiate=True, sub_configs=True)

    def add_optimizer_args(self, optimizer_class: Any = (Optimizer,),
                           nested_key: str = "optimizer", link_to: str = "AUTOMATIC") -> None:
        """Add an optimizer group: one class (its arguments directly under ``nested_key``) or a
        tuple of base classes (any subclass, chosen with ``class_path``). The optimizer is made
        later from the model's parameters, so ``params`` is not an option. ``link_to``: a
        parser key that receives the group's ``class_path``/``init_args`` (a model argument
        typed :data:`OptimizerCallable`...), or ``"AUTOMATIC"``: the CLI writes the model's
        ``configure_optimizers`` (see :meth:`LightningCLI.configure_optimizers`)."""
        classes = optimizer_class if isinstance(optimizer_class, tuple) else (optimizer_class,)
        if not all(inspect.isclass(c) and issubclass(c, Optimizer) for c in classes):
            raise ConfigError(f"add_optimizer_args({optimizer_class!r}): give a subclass of "
                              f"torch.optim.Optimizer, or a tuple of them.")
        self._add_configurable(optimizer_class, nested_key, "params")
        self._optimizers[nested_key] = (optimizer_class, link_to)

    def add_lr_scheduler_args(self, lr_scheduler_class: Any = LRSchedulerTypeTuple,
                              nested_key: str = "lr_scheduler",
                              link_to: str = "AUTOMATIC") -> None:
        """Add a learning-rate scheduler group, as :meth:`add_optimizer_args` does for
        optimizers (``optimizer`` is not an option: it is the one the optimizer group makes)."""
        classes = lr_scheduler_class if isinstance(lr_scheduler_class, tuple) \
            else (lr_scheduler_class,)
        if not all(inspect.isclass(c) and issubclass(c, LRSchedulerTypeTuple) for c in classes):
            raise ConfigError(f"add_lr_scheduler_args({lr_scheduler_class!r}): give a subclass "
                              f"of torch.optim.lr_scheduler.LRScheduler (or "
                              f"ptrain.lightning.cli.ReduceLROnPlateau), or a tuple of them.")
        self._add_configurable(lr_scheduler_class, nested_key, "optimizer")
        self._lr_schedulers[nested_key] = (lr_scheduler_class, link_to)

    def _add_configurable(self, classes: Any, nested_key: str, made_from: str) -> None:
        options = {"instantiate": False, "fail_untyped": False, "skip": {made_from}}
        if isinstance(classes, tuple):
            self.add_subclass_arguments(classes, nested_key, **options)
        else:
            self.add_class_arguments(classes, nested_key, sub_configs=True, **options)


# -- the callback that saves the config ---------------------------------------------------------

class ConfigFileExists(ConfigError, RuntimeError):
    """The run folder already holds a config file from another run (a RuntimeError, as
    Lightning's, and a :class:`ConfigError`)."""


class SaveConfigCallback(Callback):
    """Writes the CLI's resolved configuration to ``<run folder>/config.yaml`` (``trainer.log_dir``
    as the stage chose it: ``lightning_logs/version_N``) when the first stage starts, on global
    rank 0. A file of that name already there is an error unless ``overwrite=True``, except in
    a run folder the stage continues from one of its own checkpoints (ptrain resumes in the
    run's folder, where Lightning would open a new one): the config then goes beside the
    earlier one as ``config-1.yaml``, ``config-2.yaml``, ..., and a warning says so.

    ``multifile``: keep the structure of several input config files. ``save_to_log_dir=False``
    writes nothing there; then override :meth:`save_config` to save it elsewhere.
    """

    def __init__(self, parser: LightningArgumentParser, config: Any,
                 config_filename: str = "config.yaml", overwrite: bool = False,
                 multifile: bool = False, save_to_log_dir: bool = True) -> None:
        self.parser = parser
        self.config = config
        self.config_filename = config_filename
        self.overwrite = overwrite
        self.multifile = multifile
        self.save_to_log_dir = save_to_log_dir
        self.already_saved = False
        if not save_to_log_dir and type(self).save_config is SaveConfigCallback.save_config:
            raise ConfigError(
                "SaveConfigCallback(save_to_log_dir=False) would save the config nowhere: "
                "subclass SaveConfigCallback and implement save_config(trainer, pl_module, "
                "stage) to save it elsewhere, or pass LightningCLI(save_config_callback=None) "
                "to save none.")

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.already_saved:
            return
        if self.save_to_log_dir:
            self._save_to_log_dir(trainer)
        if trainer.is_global_zero:
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = _rank_zero_value(trainer, self.already_saved)

    def _save_to_log_dir(self, trainer: Any) -> None:
        folder = Path(trainer.log_dir)
        target = folder / self.config_filename
        if not self.overwrite:
            exists = _rank_zero_value(trainer, trainer.is_global_zero and target.is_file())
            if exists and not _continues_run_folder(trainer):
                raise ConfigFileExists(
                    f"{type(self).__name__} will not overwrite {target}, which holds the config "
                    f"of an earlier run. Delete it, or pass LightningCLI(save_config_kwargs="
                    f"{{'overwrite': True}}) to overwrite it, or LightningCLI("
                    f"save_config_callback=None) to save no config.")
            if exists:
                target = _free_numbered(target)
                if trainer.is_global_zero:
                    warnings.warn(f"this stage continues the run in {folder}, whose "
                                  f"{self.config_filename} holds the config of an earlier "
                                  f"invocation: this one's config is saved as {target.name}.",
                                  stacklevel=2)
        if trainer.is_global_zero:
            folder.mkdir(parents=True, exist_ok=True)
            # every value, None ones included (the flag's name since jsonargparse 4.49)
            keep_none = {"skip_unset" if "skip_unset" in inspect.signature(
                self.parser.save).parameters else "skip_none": False}
            self.parser.save(self.config, str(target), overwrite=self.overwrite,
                             multifile=self.multifile, **keep_none)

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Override to save the config somewhere else too (a logger, a tracking service). Runs
        on global rank 0 only, so it must not start a collective; ``self.parser.dump(
        self.config, skip_none=False)`` gives the YAML text."""


def _rank_zero_value(trainer: Any, value: Any) -> Any:
    """Global rank 0's ``value`` on every process (a collective under several processes)."""
    if getattr(trainer, "world_size", 1) == 1:
        return value
    return trainer.hook.all_gather_object(trainer=trainer, obj=value)[0]


def _continues_run_folder(trainer: Any) -> bool:
    """Whether the stage works in the run folder of the checkpoint it started from."""
    if not trainer.ckpt_path:
        return False
    try:
        return Path(trainer.ckpt_path).resolve().is_relative_to(Path(trainer.log_dir).resolve())
    except OSError:
        return False


def _free_numbered(path: Path) -> Path:
    number = 1
    while (candidate := path.with_name(f"{path.stem}-{number}{path.suffix}")).exists():
        number += 1
    return candidate


# -- the CLI ----------------------------------------------------------------------------------

#: the subcommands' one-line help where the trainer's method has no docstring
_SUBCOMMAND_HELP = {"fit": "Train the model (and validate it, with validation data).",
                    "validate": "Run one pass over the validation data.",
                    "test": "Run one pass over the test data.",
                    "predict": "Run the model's predict_step over the prediction data."}


#: the function of the partial jsonargparse makes for a class given by ``class_path`` to a
#: callable argument (``OptimizerCallable``): ``partial(it, instantiator, cls, **init_args)``
_JSONARGPARSE_CALL = "jsonargparse._instantiation:call_without_instantiate_context"


def _as_config(saved: Any) -> Any:
    """A saved hyperparameter (ptrain's saved form, see :mod:`ptrain.hyperparameters`) as the
    config the parser reads: the partial jsonargparse made of a class given by ``class_path``
    (an ``OptimizerCallable``) as that ``class_path`` and its ``init_args``, as Lightning's CLI
    saves it, so that ``--ckpt_path`` parses it back."""
    from ptrain.hyperparameters import PARTIAL, REFERENCE, restored

    if isinstance(saved, list):
        return [_as_config(v) for v in saved]
    if not isinstance(saved, dict):
        return saved
    args = saved.get("args")
    if saved.get(PARTIAL) == _JSONARGPARSE_CALL and isinstance(args, list) and len(args) == 2 \
            and isinstance(args[1], dict) and set(args[1]) == {REFERENCE}:
        return {"class_path": _shortest_path(restored(args[1])),
                "init_args": _as_config(saved.get("kwargs") or {})}
    if PARTIAL in saved or REFERENCE in saved:
        return saved
    return {key: _as_config(value) for key, value in saved.items()}


def _shortest_path(cls: type) -> str:
    """The shortest dotted path ``cls`` is imported by (``torch.optim.Adam``, not
    ``torch.optim.adam.Adam``), as jsonargparse writes a ``class_path``."""
    parts = cls.__module__.split(".")
    for end in range(1, len(parts) + 1):
        module = sys.modules.get(".".join(parts[:end]))
        if module is not None and getattr(module, cls.__qualname__, None) is cls:
            return f"{module.__name__}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


class LightningCLI:
    """Lightning's command line for a training program, running on ptrain.

    ``LightningCLI(MyModel, MyDataModule)`` parses the command line (or ``args``: a list of
    words, or a dict/Namespace of config), seeds, makes the model, data module and trainer
    from it, and runs the subcommand (``fit``/``validate``/``test``/``predict``). Without
    ``model_class`` (or with ``subclass_mode_model=True``) the model is chosen with
    ``--model=CLASS``/``class_path``; the same for the data. ``run=False``: no subcommands;
    the program drives ``cli.trainer``, ``cli.model`` and ``cli.datamodule`` itself.

    Arguments as Lightning's: ``save_config_callback``/``save_config_kwargs`` (see
    :class:`SaveConfigCallback`), ``trainer_class`` (a ptrain.lightning.Trainer subclass, or a
    function returning one), ``trainer_defaults`` (``callbacks`` there, objects or
    ``class_path``/``init_args`` configs, are always added and not configurable),
    ``seed_everything_default`` (``True``: the seed the process already has from an earlier
    ``seed_everything``, else 0 as in Lightning, recorded in the config; ``False``: no seeding),
    ``parser_kwargs`` (for every parser, or per subcommand under its name), ``parser_class``,
    ``auto_configure_optimizers`` (add ``--optimizer`` and ``--lr_scheduler`` and write the
    model's ``configure_optimizers`` when one is given),
    ``load_from_checkpoint_support`` (see docs/from-lightning.md, "LightningCLI").

    A subclass may override :meth:`add_arguments_to_parser` (add arguments, link them),
    :meth:`before_instantiate_classes`, :meth:`instantiate_classes`,
    :meth:`after_instantiate_classes`, :meth:`configure_optimizers` and define
    ``before_<subcommand>``/``after_<subcommand>`` methods, or a ``<subcommand>`` method that
    replaces the trainer's.

    A ptrain error (a Trainer value ptrain refuses) while the objects are made from the config
    is printed as ``error: ...`` and exits with code 2, as a parse error does, unless
    ``parser_kwargs={"exit_on_error": False}``. An error while the subcommand runs is raised as
    it is, as in Lightning.
    """

    def __init__(self, model_class: Any = None, datamodule_class: Any = None,
                 save_config_callback: Optional[type[SaveConfigCallback]] = SaveConfigCallback,
                 save_config_kwargs: Optional[dict[str, Any]] = None,
                 trainer_class: Any = Trainer, trainer_defaults: Optional[dict[str, Any]] = None,
                 seed_everything_default: Union[bool, int] = True,
                 parser_kwargs: Optional[dict[str, Any]] = None,
                 parser_class: type[LightningArgumentParser] = LightningArgumentParser,
                 subclass_mode_model: bool = False, subclass_mode_data: bool = False,
                 args: ArgsType = None, run: bool = True, auto_configure_optimizers: bool = True,
                 load_from_checkpoint_support: bool = True) -> None:
        _require_jsonargparse()
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = save_config_kwargs or {}
        self.trainer_class = trainer_class
        self.trainer_defaults = trainer_defaults or {}
        self.seed_everything_default = seed_everything_default
        self.parser_kwargs = parser_kwargs or {}
        self.parser_class = parser_class
        self.auto_configure_optimizers = auto_configure_optimizers
        self.load_from_checkpoint_support = load_from_checkpoint_support
        self.model_class = model_class
        self._model_class = model_class or LightningModule
        self.subclass_mode_model = model_class is None or subclass_mode_model
        self.datamodule_class = datamodule_class
        self._datamodule_class = datamodule_class or LightningDataModule
        self.subclass_mode_data = datamodule_class is None or subclass_mode_data

        names = self.subcommands()
        main_kwargs = {k: v for k, v in self.parser_kwargs.items() if k not in names}
        sub_kwargs = {k: v for k, v in self.parser_kwargs.items() if k in names}
        self.setup_parser(run, main_kwargs, sub_kwargs)
        self.parse_arguments(self.parser, args)
        self._parse_ckpt_path()
        self.subcommand = self.config["subcommand"] if run else None
        self._set_seed()
        self.before_instantiate_classes()
        with self._ptrain_errors_exit():
            self.instantiate_classes()
        self.after_instantiate_classes()
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    # -- the parser ---------------------------------------------------------------------------

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """A new parser (``kwargs``: the parser's arguments) with ``-c/--config``, which also
        brings ``--print_config``."""
        kwargs.setdefault("dump_header", [f"ptrain.lightning=={_LIGHTNING_API} "
                                          f"(ptrain-core=={__version__})"])
        parser = self.parser_class(**kwargs)
        parser.add_argument("-c", "--config", action=ActionConfigFile,
                            help="A YAML or JSON configuration file; give several to merge them "
                                 "in order.")
        return parser

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict[str, Any],
                     subparser_kwargs: dict[str, Any]) -> None:
        """Make ``self.parser``: with a parser per subcommand, or (``run=False``) one parser
        holding every argument."""
        self.parser = self.init_parser(**main_kwargs)
        if add_subcommands:
            self._subcommand_method_arguments: dict[str, list[str]] = {}
            self._add_subcommands(self.parser, **subparser_kwargs)
        else:
            self._add_arguments(self.parser)

    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """``--seed_everything``."""
        parser.add_argument("--seed_everything", type=Union[bool, int],
                            default=self.seed_everything_default,
                            help="An int seeds every generator with it before the model is "
                                 "made; true seeds with the seed of an earlier seeding "
                                 "(PL_GLOBAL_SEED), else 0 (recorded in the saved config); "
                                 "false does not seed.")

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """The ``trainer``, ``model`` and ``data`` groups (``trainer_defaults`` as the
        trainer's defaults)."""
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        parser.set_defaults({f"trainer.{k}": v for k, v in self.trainer_defaults.items()
                             if k != "callbacks"})
        parser.add_lightning_class_args(self._model_class, "model",
                                        subclass_mode=self.subclass_mode_model)
        parser.add_lightning_class_args(self._datamodule_class, "data",
                                        subclass_mode=self.subclass_mode_data,
                                        required=self.datamodule_class is not None)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Override to add arguments (``parser.add_argument``, ``add_lightning_class_args``,
        ``add_optimizer_args``) or link them (``parser.link_arguments(source, target)``)."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """The subcommands, each with the trainer method arguments the CLI fills itself."""
        return {"fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
                "validate": {"model", "dataloaders", "datamodule"},
                "test": {"model", "dataloaders", "datamodule"},
                "predict": {"model", "dataloaders", "datamodule"}}

    def _add_arguments(self, parser: LightningArgumentParser) -> None:
        self.add_default_arguments_to_parser(parser)
        self.add_core_arguments_to_parser(parser)
        self.add_arguments_to_parser(parser)
        if self.auto_configure_optimizers:
            if not parser._optimizers:
                parser.add_optimizer_args((Optimizer,))
            if not parser._lr_schedulers:
                parser.add_lr_scheduler_args(LRSchedulerTypeTuple)
        self.link_optimizers_and_lr_schedulers(parser)

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        self._subcommand_parsers: dict[str, LightningArgumentParser] = {}
        group = parser.add_subcommands()
        trainer_class = self.trainer_class if inspect.isclass(self.trainer_class) \
            else jsonargparse.class_from_function(self.trainer_class)
        for name in self.subcommands():
            doc = inspect.getdoc(getattr(trainer_class, name)) or ""
            description = doc.strip().split("\n\n")[0].replace("\n", " ") or \
                _SUBCOMMAND_HELP.get(name)
            options = dict(kwargs.get(name, {}))
            options.setdefault("description", description)
            subparser = self._prepare_subcommand_parser(trainer_class, name, **options)
            self._subcommand_parsers[name] = subparser
            group.add_subcommand(name, subparser, help=description)

    def _prepare_subcommand_parser(self, klass: type, subcommand: str,
                                   **kwargs: Any) -> LightningArgumentParser:
        parser = self.init_parser(**kwargs)
        self._add_arguments(parser)
        added = parser.add_method_arguments(klass, subcommand,
                                            skip=set(self.subcommands()[subcommand]))
        self._subcommand_method_arguments[subcommand] = added
        return parser

    @staticmethod
    def link_optimizers_and_lr_schedulers(parser: LightningArgumentParser) -> None:
        """Link each optimizer/scheduler group added with a ``link_to`` to its target."""
        for key, (classes, link_to) in {**parser._optimizers, **parser._lr_schedulers}.items():
            if link_to == "AUTOMATIC":
                continue
            if isinstance(classes, tuple):
                parser.link_arguments(key, link_to)
            else:
                parser.link_arguments(key, link_to, compute_fn=partial(_with_class_path, classes))

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parse ``args`` (``None``: ``sys.argv``) into ``self.config``."""
        if args is not None and len(sys.argv) > 1:
            warnings.warn(f"LightningCLI was given args={args!r} and the command line has "
                          f"arguments too ({sys.argv[1:]}); only args is parsed.", stacklevel=3)
        if isinstance(args, (dict, Namespace)):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    def _parse_ckpt_path(self) -> None:
        """With ``--ckpt_path`` naming a checkpoint file, its saved hyperparameters become the
        model's arguments (as the trained model had them), over those given."""
        if not self.config.get("subcommand"):
            return
        ckpt_path = self.config[self.config.subcommand].get("ckpt_path")
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        from ptrain.checkpoint_io import safe_load

        checkpoint = safe_load(ckpt_path)
        hparams = {key: _as_config(value)
                   for key, value in (checkpoint.get("hyper_parameters") or {}).items()}
        if not hparams:
            return
        if self.subclass_mode_model and checkpoint.get("module_class"):
            hparams = {"class_path": checkpoint["module_class"].replace(":", "."),
                       "init_args": hparams}
        try:
            self.config = self.parser.parse_object(
                {self.config.subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write(f"The hyperparameters saved in {ckpt_path} do not fit the model's "
                             f"arguments (see above).\n")
            raise

    # -- making the objects -------------------------------------------------------------------

    def before_instantiate_classes(self) -> None:
        """Override to act on ``self.config`` before the objects are made."""

    def instantiate_classes(self) -> None:
        """Make ``self.config_init`` (the config with its objects made), ``self.datamodule``,
        ``self.model`` and ``self.trainer``."""
        self.config_init = _instantiate(self.parser, self.config)
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")
        self._add_configure_optimizers_method_to_model(self.subcommand)
        self.trainer = self.instantiate_trainer()

    def after_instantiate_classes(self) -> None:
        """Override to act once the objects are made, before the subcommand runs."""

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Make the trainer from the config (``kwargs`` over it), with the callbacks of the
        config, of the callback groups, of ``trainer_defaults`` and the config saver."""
        extra = [self._get(self.config_init, key)
                 for key in self._parser(self.subcommand).callback_keys]
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        return self._instantiate_trainer(config, extra)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Trainer:
        if "callbacks" not in inspect.signature(self.trainer_class).parameters:
            warnings.warn(f"{getattr(self.trainer_class, '__qualname__', self.trainer_class)} "
                          f"takes no callbacks argument: the CLI's callbacks (config saving "
                          f"included) are left out.", stacklevel=2)
            return self.trainer_class(**config)
        given = config.get("callbacks")
        given = [] if given is None else list(given) if isinstance(given, (list, tuple)) \
            else [given]
        given.extend(callbacks)
        defaults = self.trainer_defaults.get("callbacks")
        if defaults is not None:
            given.extend(_made_callback(entry) for entry in (
                defaults if isinstance(defaults, (list, tuple)) else [defaults]))
        if self.save_config_callback and not config.get("fast_dev_run", False):
            given.append(self.save_config_callback(
                self._parser(self.subcommand),
                self.config.get(str(self.subcommand), self.config), **self.save_config_kwargs))
        config["callbacks"] = given
        return self.trainer_class(**config)

    def _parser(self, subcommand: Optional[str]) -> LightningArgumentParser:
        return self.parser if subcommand is None else self._subcommand_parsers[subcommand]

    def _get(self, config: Any, key: str, default: Any = None) -> Any:
        """``key`` of ``config``, inside the subcommand's part when there is one."""
        return config.get(str(self.subcommand), config).get(key, default)

    # -- optimizers ---------------------------------------------------------------------------

    @staticmethod
    def configure_optimizers(lightning_module: LightningModule, optimizer: Optimizer,
                             lr_scheduler: Optional[LRSchedulerTypeUnion] = None) -> Any:
        """What the model's ``configure_optimizers`` returns when the CLI writes it: the
        optimizer, with the scheduler when one was given (a :class:`ReduceLROnPlateau` steps
        on its ``monitor``). Override to return something else."""
        if lr_scheduler is None:
            return optimizer
        if isinstance(lr_scheduler, ReduceLROnPlateau):
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": lr_scheduler, "monitor": lr_scheduler.monitor}}
        return [optimizer], [lr_scheduler]

    def _add_configure_optimizers_method_to_model(self, subcommand: Optional[str]) -> None:
        """With one ``AUTOMATIC`` optimizer group given a value, make the optimizer (and the
        scheduler) from the config and give the model a ``configure_optimizers`` returning
        :meth:`configure_optimizers`'s answer. A scheduler given without an optimizer is not
        used, as in Lightning, and a warning says so."""
        if not self.auto_configure_optimizers:
            return
        parser = self._parser(subcommand)
        optimizers = _automatic(parser._optimizers, (Optimizer,))
        schedulers = _automatic(parser._lr_schedulers, LRSchedulerTypeTuple)
        if not optimizers:
            return
        if len(optimizers) > 1 or len(schedulers) > 1:
            raise ConfigError(
                f"{type(self).__name__} can write configure_optimizers for one optimizer and "
                f"one lr_scheduler group, but {optimizers + schedulers} are all 'AUTOMATIC'. "
                f"Give the groups link_to=... targets and implement configure_optimizers in "
                f"the model.")
        optimizer_init = self._init_of(parser._optimizers, optimizers[0])
        scheduler_init = self._init_of(parser._lr_schedulers, schedulers[0]) \
            if schedulers else None
        if not optimizer_init:
            if scheduler_init:  # Lightning runs on without it, silently
                warnings.warn(
                    f"--{schedulers[0]} was given without --{optimizers[0]}, so it is not used: "
                    f"the CLI makes a scheduler only for the optimizer it makes, and the "
                    f"model's own configure_optimizers runs as written. Give --{optimizers[0]} "
                    f"too, or leave --{schedulers[0]} out and return the scheduler from the "
                    f"model's configure_optimizers.", stacklevel=2)
            return
        if type(self.model).configure_optimizers is not LightningModule.configure_optimizers:
            warnings.warn(f"{type(self.model).__qualname__}.configure_optimizers is replaced by "
                          f"{type(self).__name__}.configure_optimizers, since "
                          f"--{optimizers[0]} was given.", stacklevel=2)
        optimizer = instantiate_class(self.model.parameters(), optimizer_init)
        scheduler = instantiate_class(optimizer, scheduler_init) if scheduler_init else None
        method = partial(self.configure_optimizers, optimizer=optimizer, lr_scheduler=scheduler)
        update_wrapper(method, self.configure_optimizers)
        self.model.configure_optimizers = MethodType(method, self.model)

    def _init_of(self, groups: dict[str, tuple[Any, str]], key: str) -> Optional[dict]:
        """The ``{"class_path", "init_args"}`` of group ``key`` in the config, or ``None``."""
        init = self._get(self.config_init, key)
        classes = groups[key][0]
        if not isinstance(classes, tuple):
            init = _with_class_path(classes, init)
        elif isinstance(init, Namespace):
            init = init.as_dict()
        return init or None

    # -- running ------------------------------------------------------------------------------

    def _run_subcommand(self, subcommand: str) -> None:
        before = getattr(self, f"before_{subcommand}", None)
        if callable(before):
            before()
        run = getattr(self, subcommand, getattr(self.trainer, subcommand))
        run(**self._prepare_subcommand_kwargs(subcommand))
        after = getattr(self, f"after_{subcommand}", None)
        if callable(after):
            after()

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        wanted = self._subcommand_method_arguments[subcommand]
        kwargs = {k: v for k, v in self.config_init[subcommand].items() if k in wanted}
        kwargs["model"] = self.model
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        return kwargs

    def _set_seed(self) -> None:
        """Seed as ``seed_everything`` says: an int seeds with it; ``True`` keeps the seed this
        process already has (an earlier ``seed_everything(...)``, or one given by the process
        that started it), else 0, as Lightning's does; the seed used is recorded in the
        config."""
        seed = self._get(self.config, "seed_everything")
        if seed is False:
            return
        seed = seed_everything(None if seed is True else seed, workers=True)
        if self.subcommand:
            self.config[self.subcommand]["seed_everything"] = seed
        else:
            self.config["seed_everything"] = seed

    @contextlib.contextmanager
    def _ptrain_errors_exit(self) -> Iterator[None]:
        """Inside (while the objects are made from the config), a ptrain error (a value the
        Trainer refuses) ends the program as a parse error does: its message and exit code 2,
        unless the parser was made with ``exit_on_error=False``. An error while the subcommand
        runs is raised as it is (the program's own included), as in Lightning."""
        try:
            yield
        except PtrainError as exc:
            if not getattr(self._parser(self.subcommand), "exit_on_error", True):
                raise
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)


def _automatic(groups: dict[str, tuple[Any, str]], bases: tuple[type, ...]) -> list[str]:
    """The keys of ``groups`` linked ``AUTOMATIC`` whose classes are among ``bases``."""
    found = []
    for key, (classes, link_to) in groups.items():
        classes = classes if isinstance(classes, tuple) else (classes,)
        if link_to == "AUTOMATIC" and any(issubclass(c, bases) for c in classes):
            found.append(key)
    return found


def _made_callback(entry: Any) -> Any:
    """A callback of ``trainer_defaults``: an object as it is, or one made from its config
    (``{"class_path": ..., "init_args": ...}``, checked as ``--trainer.callbacks`` is)."""
    if not isinstance(entry, (dict, Namespace)) or "class_path" not in entry:
        return entry
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--callback", type=_callback_type())
    value = entry.as_dict() if isinstance(entry, Namespace) else dict(entry)
    return _instantiate(parser, parser.parse_object({"callback": value})).callback


def _with_class_path(class_type: type, init_args: Any) -> dict[str, Any]:
    """``{"class_path": ..., "init_args": ...}`` for a group of one fixed class."""
    if isinstance(init_args, Namespace):
        init_args = init_args.as_dict()
    return {"class_path": f"{class_type.__module__}.{class_type.__qualname__}",
            "init_args": dict(init_args or {})}


def instantiate_class(args: Any, init: dict[str, Any]) -> Any:
    """Make ``init["class_path"]`` with ``args`` (one value or a tuple) as its positional
    arguments and ``init["init_args"]`` as its keyword arguments."""
    module_name, _, name = init["class_path"].rpartition(".")
    if not module_name:
        raise ConfigError(f"instantiate_class: class_path {init['class_path']!r} is not an "
                          f"import path (module.Class).")
    cls = getattr(importlib.import_module(module_name), name)
    positional = args if isinstance(args, tuple) else (args,)
    return cls(*positional, **(init.get("init_args") or {}))


def instantiate_module(class_type: type, config: dict[str, Any]) -> Any:
    """Make ``class_type`` (or, with a ``"_class_path"`` entry, that subclass of it) from
    ``config``, its init arguments as a CLI config holds them: nested objects as
    ``class_path``/``init_args``, checked against the signature as the CLI checks them."""
    _require_jsonargparse()
    parser = ArgumentParser(exit_on_error=False)
    arguments = dict(config)
    if "_class_path" in arguments:
        class_path = arguments.pop("_class_path")
        parser.add_subclass_arguments(class_type, "module", fail_untyped=False)
        arguments = {"class_path": class_path, "dict_kwargs": arguments}
    else:
        parser.add_class_arguments(class_type, "module", fail_untyped=False)
    return _instantiate(parser, parser.parse_object({"module": arguments})).module


def _instantiate(parser: Any, config: Any) -> Any:
    """``config`` with its objects made (jsonargparse's ``instantiate``, named
    ``instantiate_classes`` before 4.49)."""
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    return instantiate(config)


__all__ = ["ArgsType", "LRSchedulerCallable", "LRSchedulerType", "LRSchedulerTypeTuple",
           "LRSchedulerTypeUnion", "LightningArgumentParser", "LightningCLI", "ModuleType",
           "OptimizerCallable", "ReduceLROnPlateau", "SaveConfigCallback", "instantiate_class",
           "instantiate_module"]
