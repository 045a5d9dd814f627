"""The ``ptrain`` command: ``fit``, ``validate``, ``test``, ``predict``, ``example``, ``plugins``,
``new-plugin``, ``export``, ``--version``.

Errors caused by input (:class:`ptrain.PtrainError`) print one paragraph and exit with code 2;
a traceback means a bug. ``ptrain --help`` and ``ptrain plugins`` import neither torch nor any
plugin.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import sys
import warnings
from pathlib import Path
from dataclasses import dataclass
from typing import Any, NoReturn, Sequence

from ptrain.catalog import EXCLUSIVE_KINDS, GROUPS, Catalog
from ptrain.config import (DEFAULT_CALLBACKS, core_options, dump_config, load_config_file,
                           misplaced_key_hint, parse_value)
from ptrain.errors import (ConfigError, Interrupted, ModelError, PluginError, PtrainError,
                           WorkerError)
from ptrain.options import OptionGroup, closest

USAGE_EXIT = 2
STAGES = ("fit", "validate", "test", "predict")
_STAGE_DESCRIPTIONS = {
    "fit": "Train",
    "validate": "Run one validation pass of",
    "test": "Run one test pass (test_step over the test dataloader) of",
    "predict": "Run predict_step over the predict dataloader of",
}


class _Parser(argparse.ArgumentParser):
    """argparse that raises :class:`ConfigError` instead of printing its own usage error, and
    refuses an option it does not know by naming the closest it knows (``--chek``: "Did you
    mean '--check'?"), as every ``ptrain`` command does; a command name likewise."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message}. Run `{self.prog} --help` for the options.")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.refuse(extras)
        return namespace

    def refuse(self, extras: list[str], also: Sequence[argparse.ArgumentParser] = ()
               ) -> NoReturn:
        """Refuse the arguments the command line has left over: the first unknown option by
        its closest known one (of ``also``'s and this parser's), else all of them."""
        flag = next((a for a in extras if self.unknown_option(a)), None)
        if flag is None:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        name = flag.split("=")[0]
        parsers = [*also, self]
        flags = [s for parser in parsers for action in parser._actions
                 for s in action.option_strings]
        helps = " and ".join(f"`{parser.prog} --help`" for parser in parsers)
        raise ConfigError(f"unknown option {name}.{closest(name, flags)} Run {helps} for the "
                          f"options.")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """argparse's check of a value against ``choices``; a command name that is none of the
        commands is refused as an unknown option is, by the closest one (``plugns``: "Did you
        mean 'plugins'?"), where argparse says "invalid choice" and lists them."""
        if action.nargs == argparse.PARSER and value not in action.choices:
            commands = list(action.choices)
            raise ConfigError(f"unknown command {value!r}.{closest(value, commands)} Run "
                              f"`{self.prog} --help` for the commands: {', '.join(commands)}.")
        super()._check_value(action, value)

    def unknown_option(self, arg: str) -> bool:
        """Whether ``arg`` is an option (``--name``, ``--name=value``, ``-x``) that this parser
        does not take, by its full name or, where abbreviations are allowed, a prefix of one."""
        if len(arg) < 2 or arg[0] not in self.prefix_chars or arg == "--":
            return False
        if arg[1:].replace(".", "", 1).isdigit():  # -1, -0.5: a negative number, a value
            return False
        name = arg.split("=")[0]
        flags = [s for action in self._actions for s in action.option_strings]
        if name in flags or arg[:2] in flags:  # arg[:2]: -xVALUE
            return False
        return not (self.allow_abbrev and name.startswith("--")
                    and any(f.startswith(name) for f in flags))


class _Command(_Parser):
    """The parser of a command that is a subparser (``ptrain plugins``): it refuses what it
    does not know itself, naming its own options and ``--help``, where argparse would hand the
    leftovers up to ``ptrain``'s parser. An unknown option is named before a missing required
    argument it may have been meant to be (``export C --outptu F``)."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        args = list(sys.argv[1:] if args is None else args)
        try:
            namespace, extras = super().parse_known_args(args, namespace)
        except ConfigError:
            options = args[:args.index("--")] if "--" in args else args
            unknown = [a for a in options if self.unknown_option(a)]
            if unknown:
                self.refuse(unknown)
            raise
        if extras:
            self.refuse(extras)
        return namespace, []


class _Once(argparse.Action):
    """``--ckpt-path`` given twice with different values is refused, rather than the first
    silently dropped (which checkpoint a run starts from decides what it overwrites). Other
    flags keep argparse's rule, the last one wins, which tests and scripts use to override."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        if before is not None and before != values:
            parser.error(f"{option_string} was given twice ({before!r}, then {values!r}); only "
                         f"one is used, so give the one you mean once")
        setattr(namespace, self.dest, values)


# ---------------------------------------------------------------------------------------------
# ptrain plugins / --version


def _plugin_rows(catalog: Catalog, check: bool) -> list[dict[str, Any]]:
    from ptrain.loading import check_available, import_target

    rows = []
    for info in catalog.infos:
        row = {"kind": info.kind, "name": info.name, "distribution": info.distribution,
               "version": info.version, "target": info.target}
        others = [c for c in catalog.claims(info.kind, info.name) if c != info]
        if others:
            row["status"] = "conflict: also claimed by " + ", ".join(
                f"{c.distribution} {c.version}" for c in others)
        elif check:
            try:
                target = import_target(info)
            except PluginError as exc:
                row["status"] = f"broken: {exc}"
            else:
                reason = check_available(target, info.name)
                row["status"] = "ok" if reason is None else f"unavailable: {reason}"
        rows.append(row)
    return rows


def cmd_plugins(args: argparse.Namespace) -> int:
    rows = _plugin_rows(Catalog.discover(), args.check)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    columns = ["kind", "name", "distribution", "version"] + (["status"] if args.check else [])
    if any("status" in r for r in rows) and "status" not in columns:
        columns.append("status")
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns[:-1]}
    lines = ["  ".join(c.upper().ljust(widths.get(c, 0)) for c in columns).rstrip()]
    for row in rows:
        lines.append("  ".join(str(row.get(c, "")).ljust(widths.get(c, 0))
                               for c in columns).rstrip())
    print("\n".join(lines))
    return 0


def version_text() -> str:
    dists = Catalog.discover().distributions()
    return "\n".join(f"{name} {version}" for name, version in dists.items())


# ---------------------------------------------------------------------------------------------
# ptrain new-plugin


def cmd_new_plugin(args: argparse.Namespace) -> int:
    from ptrain.scaffold import new_plugin, next_steps

    print(next_steps(new_plugin(args.name, args.kind, args.dir)))
    return 0


# ---------------------------------------------------------------------------------------------
# ptrain example


def cmd_example(argv: list[str]) -> int:
    """``ptrain example``: the examples that ship with the core; ``ptrain example NAME [fit
    options]``: ``ptrain fit --config`` with the example's config, the options on top. A
    ``--config`` among them is refused: it would replace the example's (files are not layered).
    """
    from ptrain.examples import EXAMPLES, config_path

    if not argv or argv[0] in ("-h", "--help"):
        import textwrap

        print(textwrap.fill(
            "usage: ptrain example NAME [fit options]  (ptrain example NAME --help: the "
            "options). Trains an example that ships with ptrain-core: `ptrain fit --config` "
            "with its config, the options on top (flags; a config of your own starts from "
            "`ptrain example NAME --print-config`, run with `ptrain fit --config FILE`). The "
            "examples' data comes from scikit-learn: "
            "pip install \"ptrain-core[examples]\".", 88, break_on_hyphens=False) + "\n\nexamples:")
        for name, what in EXAMPLES.items():
            print(textwrap.fill(what, 88, initial_indent=f"  {name}: ",
                                subsequent_indent="    "))
            print(f"    config: {config_path(name)}")
        return 0
    path = config_path(argv[0])
    given = _preparse(_split_init_args(argv[1:])[0])[0].config
    if given is not None:  # the last --config wins: the user's would replace the example's
        raise ConfigError(
            f"ptrain example {argv[0]} runs the example's own config ({path}), and a run reads "
            f"one config file: --config {given} would replace it, model included (config files "
            f"are not layered). Give your settings as flags on top (ptrain example {argv[0]} "
            f"--max-epochs 3), or start a config of your own from the example's: `ptrain "
            f"example {argv[0]} --print-config > {argv[0]}.toml`, add your settings to it, and "
            f"run `ptrain fit --config {argv[0]}.toml`.")
    return cmd_run("fit", ["--config", path, *argv[1:]])


# ---------------------------------------------------------------------------------------------
# ptrain fit / validate


def _preparse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    pre = _Parser(add_help=False)
    pre.add_argument("-h", "--help", action="store_true")
    pre.add_argument("--help-all", action="store_true")
    pre.add_argument("--config")
    pre.add_argument("--print-config", action="store_true")
    pre.add_argument("-p", dest="plugins", action="append", default=[])
    pre.add_argument("--no-progress-bar", action="store_true")
    for kind in EXCLUSIVE_KINDS:
        pre.add_argument(f"--{kind}", action="append", default=[])
    args, rest = pre.parse_known_args(argv)
    for kind in EXCLUSIVE_KINDS:
        given = getattr(args, kind)
        if len(set(given)) > 1:
            raise PluginError(f"one {kind} at a time: --{kind} was given {len(given)} times "
                              f"({', '.join(given)}); keep one.")
        setattr(args, kind, given[-1] if given else None)
    return args, rest


def _split_init_args(argv: list[str]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Take ``--model.KEY VALUE`` / ``--data.KEY=VALUE`` out of ``argv``."""
    rest, init_args = [], {"model": {}, "data": {}}
    i = 0
    while i < len(argv):
        token = argv[i]
        table = next((t for t in init_args if token.startswith(f"--{t}.")), None)
        if table is None:
            rest.append(token)
            i += 1
            continue
        key, eq, value = token[len(table) + 3:].partition("=")
        if not eq:
            if i + 1 >= len(argv):
                raise ConfigError(f"{token} needs a value.")
            value = argv[i + 1]
            i += 1
        init_args[table][key.replace("-", "_")] = parse_value(value)
        i += 1
    return rest, init_args


def _add_group(parser: argparse.ArgumentParser, group: OptionGroup, title: str,
               description: str = "") -> None:
    arg_group = parser.add_argument_group(title, description or None)
    for opt in group.options.values():
        if opt.owner == "trainer" and opt.name == "callbacks":
            continue  # its flag is -p (NAME or no:NAME), repeatable
        help_text = opt.help + (f" (default: {opt.default})" if opt.default not in (None, []) else "")
        if opt.choices:
            help_text += f" {{{', '.join(map(str, opt.choices))}}}"
        if opt.type.__name__ == "to_bool":
            arg_group.add_argument(opt.flag, dest=f"{group.owner}\0{opt.name}",
                                   action=argparse.BooleanOptionalAction,
                                   default=argparse.SUPPRESS, help=help_text)
        else:
            arg_group.add_argument(opt.flag, dest=f"{group.owner}\0{opt.name}",
                                   default=argparse.SUPPRESS, metavar=opt.name.upper(),
                                   help=help_text)


def _build_parser(stage: str, groups: list[tuple[OptionGroup, str, str]]) -> _Parser:
    parser = _Parser(prog=f"ptrain {stage}", allow_abbrev=False,
                     description=f"{_STAGE_DESCRIPTIONS[stage]} a ptrain.TrainModule with "
                                 f"the selected plugins.")
    run = parser.add_argument_group("run")
    run.add_argument("--help-all", action="store_true",
                     help="show the options of every installed plugin, selected or not")
    run.add_argument("--model", help="the TrainModule class, as MODULE:CLASS; init arguments "
                                     "with --model.KEY VALUE (optional with --ckpt-path: the "
                                     "checkpoint says how to rebuild the model)")
    run.add_argument("--data", help="a DataModule class, as MODULE:CLASS (optional); init "
                                    "arguments with --data.KEY VALUE")
    run.add_argument("--config", help="a TOML config file; flags override it")
    run.add_argument("--print-config", action="store_true",
                     help="print the resolved configuration (plugin options included) and exit")
    run.add_argument("--ckpt-path", action=_Once,
                     help="resume (fit) or evaluate from this checkpoint: a path, 'last', 'best', "
                          "'last-intact' (the newest that passes its integrity check, saying "
                          "what it passed over), or for fit 'auto' ('last' when there is one, "
                          "else from the start: for jobs that are restarted)")
    run.add_argument("-p", dest="plugins", action="append", default=[], metavar="NAME",
                     help="enable callback plugin NAME; -p no:NAME blocks one before it is "
                          "imported (repeatable)")
    run.add_argument("--no-progress-bar", action="store_true", help="same as -p no:progress-bar")
    run.add_argument("--trace", action="store_true",
                     help="print every hook call to stderr: each implementation that ran, its "
                          "time and result type (same as PTRAIN_TRACE=1; slows every step)")
    all_groups = [(core_options(), "trainer options", "")] + groups
    owners = {flag: "ptrain" for action in parser._actions for flag in action.option_strings}
    for group, _, _ in all_groups:
        for opt in group.options.values():
            if opt.flag in owners:
                raise PluginError(f"option {opt.flag} is declared by both {owners[opt.flag]!r} "
                                  f"and {group.owner!r}; rename one of them.")
            owners[opt.flag] = group.owner
    for group, title, description in all_groups:
        _add_group(parser, group, title, description)
    return parser


#: the annotations an init argument's value is checked against, and what each accepts (not
#: str: ``--model.name 123`` reads as an int, which such a model may well take)
_SIMPLE_TYPES = {int: (int,), float: (int, float), bool: (bool,)}


def _check_init_types(cls: Any, init_args: dict[str, Any], what: str) -> None:
    """Refuse an init argument whose value is not of the plain type (int, float, bool,
    optionally ``| None``) its parameter is annotated with: ``--model.hidden abc`` for
    ``hidden: int`` failed deep inside the model ("empty(): argument 'size' must be tuple of
    ints"). Other annotations, and ones that do not resolve, are not checked."""
    import types
    import typing

    try:
        params = inspect.signature(cls, eval_str=True).parameters
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: nothing to check
        return
    for key, value in init_args.items():
        annotation = params[key].annotation if key in params else inspect.Parameter.empty
        options = (typing.get_args(annotation)
                   if typing.get_origin(annotation) in (typing.Union, types.UnionType)
                   else (annotation,))
        plain = [t for t in options if t is not type(None)]
        if len(plain) != 1 or plain[0] not in _SIMPLE_TYPES:
            continue
        if value is None and len(options) > 1:
            continue
        accepted = _SIMPLE_TYPES[plain[0]]
        if isinstance(value, accepted) and (plain[0] is bool or not isinstance(value, bool)):
            continue
        shown = getattr(annotation, "__name__", None) or str(annotation)
        raise ModelError(
            f"--{what}.{key} (or {key} in [{what}.init_args]) is {type(value).__name__} "
            f"{value!r}, but {cls.__qualname__}'s argument {key} is annotated {shown}. Values "
            f"are read as TOML: 64 is an int, 0.5 a float, true a bool, anything else text.")


def _instantiate(cls: Any, init_args: dict[str, Any], what: str,
                 check_types: bool = True, build: bool = True) -> Any:
    params = inspect.signature(cls).parameters
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for key in init_args:
        if key not in params and not takes_kwargs:
            raise ModelError(f"{cls.__qualname__} has no init argument {key!r} (from --{what}.{key}"
                             f" or [{what}.init_args]); its arguments: "
                             f"{', '.join(params) or '(none)'}.{closest(key, params)}")
    if check_types:
        _check_init_types(cls, init_args, what)
    if not build:
        return None
    try:
        return cls(**init_args)
    except TypeError as exc:
        raise ModelError(f"{cls.__qualname__}(**{init_args}) failed: {exc}.") from None


def _help_groups(catalog: Catalog) -> tuple[list[tuple[OptionGroup, str, str]], list[str]]:
    """Every installed plugin's options for ``--help``; broken plugins are listed apart."""
    from ptrain.loading import declare_options, import_target

    groups, broken = [], []
    for info in catalog.infos:
        try:
            group = declare_options(import_target(info), info.name)
        except PluginError as exc:
            broken.append(str(exc))
            continue
        if group.options:
            how = f"enable with -p {info.name}" if info.kind == "callback" else \
                f"active with --{info.kind} {info.name}"
            if info.kind == "callback" and info.name in DEFAULT_CALLBACKS:
                how = "on by default"
            groups.append((group, _group_title(info.name, info.kind, info), how))
    return groups, broken


@dataclass
class RunSpec:
    """Everything a ``fit``/``validate`` command resolved from its config file and flags."""

    trainer_options: dict[str, Any]
    plugin_options: dict[str, dict[str, Any]]
    model: dict[str, Any]
    data: dict[str, Any]
    ckpt_path: str | None
    print_config: bool
    trace: bool


def _selection(pre: argparse.Namespace, catalog: Catalog):
    """The run's config file, its accelerator/strategy/precision, its callbacks and the plugins
    they select (imported; nothing else is), from the config file and the flags."""
    from ptrain.selection import select_plugins

    file_config = load_config_file(pre.config) if pre.config else {}
    file_trainer = dict(file_config.get("trainer", {}))
    core = core_options()
    core.check_config_file(file_trainer, pre.config)  # an error names the file and its key
    callbacks = core.options["callbacks"].convert(file_trainer.get("callbacks", []), "",
                                                  pre.config)
    callbacks = [*callbacks, *pre.plugins] + (["no:progress-bar"] if pre.no_progress_bar else [])
    selection = {k: getattr(pre, k) or file_trainer.get(k) or core.options[k].default
                 for k in EXCLUSIVE_KINDS}
    selected = select_plugins(catalog, selection["accelerator"], selection["strategy"],
                              selection["precision"], callbacks)
    return file_config, selection, callbacks, selected


def _selected_groups(selected: list[Any]) -> list[tuple[OptionGroup, str, str]]:
    return [(p.options, _group_title(p.name, p.kind, p.info), "")
            for p in selected if p.options.options]


def _group_title(name: str, kind: str, info: Any) -> str:
    """``--help``'s heading of a plugin's options: ``ddp (strategy, ptrain-ddp)``."""
    return f"{name} ({kind}, {info.distribution})" if info is not None else f"{name} ({kind})"


def resolve_run(stage: str, argv: list[str], catalog: Catalog,
                also: Sequence[argparse.ArgumentParser] = ()) -> RunSpec:
    """Merge option defaults < config file < flags; imports only the selected plugins.
    ``also``: the parser of a command that took its own options out of ``argv`` first (``ptrain
    tune``), whose options an unknown one may be a slip of too."""
    argv, init_args = _split_init_args(argv)
    pre, _ = _preparse(argv)
    file_config, selection, callbacks, selected = _selection(pre, catalog)
    _refuse_misplaced_trainer_keys(file_config, selected, pre.config)
    groups = {"trainer": core_options(), **{p.name: p.options for p in selected}}
    for name, table in file_config.get("plugins", {}).items():
        if name in groups:  # a bad value is named by the file and its key, not by the flag
            groups[name].check_config_file(table, pre.config)
    file_trainer = dict(file_config.get("trainer", {}))
    parser = _build_parser(stage, _selected_groups(selected))
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _unknown_flag(unknown[0], parser, catalog, {p.name for p in selected}, also)

    trainer_options = dict(file_trainer)
    plugin_options = {name: dict(values)
                      for name, values in file_config.get("plugins", {}).items()}
    for dest, value in vars(args).items():
        if "\0" in dest:  # an option of the core or a plugin (see _add_group)
            owner, name = dest.split("\0")
            # checked here, so a bad value is named by its flag, not blamed on Trainer(...) or
            # on the config file it overrides
            groups[owner].options[name].convert(value, "")
            target = trainer_options if owner == "trainer" else plugin_options.setdefault(owner, {})
            target[name] = value
    trainer_options.update(selection, callbacks=callbacks)

    components = {}
    for table, class_path in (("model", args.model), ("data", args.data)):
        cfg = dict(file_config.get(table, {}))
        if class_path:
            cfg["class_path"] = class_path
        if cfg or init_args[table]:
            cfg["init_args"] = {**cfg.get("init_args", {}), **init_args[table]}
        components[table] = cfg
    if components["data"] and not components["data"].get("class_path"):
        raise ModelError("--data.KEY arguments were given without --data MODULE:CLASS.")
    return RunSpec(trainer_options, plugin_options, components["model"], components["data"],
                   args.ckpt_path if args.ckpt_path is not None else file_config.get("ckpt_path"),
                   args.print_config or pre.print_config, args.trace)


def _refuse_misplaced_trainer_keys(file_config: dict[str, Any], selected: list[Any],
                                   path: str | None) -> None:
    """A [trainer] option in a selected plugin's table of the config file is named as one,
    with where it belongs: ``max_epochs = 10`` appended to a ``--print-config`` file lands in
    its last table, ``[plugins.stop-signals]``, where it was refused as an unknown option of
    stop-signals, a plugin the user never wrote about."""
    tables = file_config.get("plugins", {})
    for plugin in selected:
        for key in tables.get(plugin.name, {}):
            if key in plugin.options.options or key in plugin.options.instead:
                continue
            hint = misplaced_key_hint(key, f"[plugins.{plugin.name}]")
            if hint:
                raise ConfigError(f"{key!r} in [plugins.{plugin.name}] of {path!r}{hint}")


def build_component(cfg: dict[str, Any], base: type, flag: str,
                    init_args: dict[str, Any] | None = None, build: bool = True) -> Any:
    """Import ``cfg["class_path"]``, check it subclasses ``base`` and instantiate it with
    ``init_args`` (by default ``cfg["init_args"]``); without ``build``, only the checks."""
    cls = _component_class(cfg["class_path"], base, flag)
    # the arguments that rebuild a checkpoint's model were valid when it was built
    return _instantiate(cls, cfg.get("init_args", {}) if init_args is None else init_args,
                        flag.lstrip("-"), check_types=init_args is None, build=build)


def _component_class(class_path: str, base: type, flag: str) -> type:
    """The class ``class_path`` names, imported, checked to subclass ``base``."""
    from ptrain.loading import import_object

    cls = import_object(class_path, flag, ModelError, "ptrain.examples.digits:DigitsClassifier")
    if not (inspect.isclass(cls) and issubclass(cls, base)):
        raise ModelError(f"{flag} {class_path!r} is not a ptrain.{base.__name__} subclass "
                         f"(it is {cls!r}).")
    return cls


def _add_init_arguments(parser: argparse.ArgumentParser, argv: list[str],
                        file_config: dict[str, Any]) -> list[str]:
    """For ``--help``: a group of the ``--model.KEY`` arguments of the class that ``--model``
    (or ``[model]``'s class_path in the config file) names, and one of ``--data.KEY``'s; the
    tables without a class are returned. A class that can't be imported or whose arguments
    can't be read gets a group that says why, in place of its arguments."""
    given = _Parser(add_help=False, allow_abbrev=False)
    given.add_argument("--model")
    given.add_argument("--data")
    classes = vars(given.parse_known_args(argv)[0])
    missing = []
    for table in ("model", "data"):
        class_path = classes[table] or file_config.get(table, {}).get("class_path")
        if not class_path:
            missing.append(table)
            continue
        from ptrain.init_help import init_arguments  # torch: only with a class to show
        from ptrain.module import DataModule, TrainModule

        base = TrainModule if table == "model" else DataModule
        group = parser.add_argument_group(f"{class_path} ({table})")
        try:
            cls = _component_class(class_path, base, f"--{table}")
            arguments, takes_kwargs = init_arguments(cls, base)
        except (PtrainError, TypeError, ValueError) as exc:
            group.description = f"its init arguments are not listed: {exc}"
            continue
        if not arguments and not takes_kwargs:
            group.description = f"{cls.__qualname__} takes no init arguments"
            continue
        group.description = (
            f"the init arguments of {cls.__qualname__}: --{table}.KEY VALUE (read as TOML: 64 "
            f"is an int, 0.5 a float, true a bool), or KEY = VALUE in [{table}.init_args] of "
            f"--config" + ("; it also takes other keys (**kwargs)" if takes_kwargs else ""))
        for argument in arguments:
            group.add_argument(f"--{table}.{argument.name}", metavar=argument.name.upper(),
                               required=argument.required,
                               help=argument.help().replace("%", "%%"))
    return missing


def freeze_imported() -> None:
    """Leave every object that exists by now (what the command imported: torch's, ptrain's,
    hundreds of thousands of objects that live until exit) out of the garbage collector's
    passes (:func:`gc.freeze`). Python's last pass, as the process ends, walked them all: 0.3
    to 1 s at the end of every command that imported torch (docs/benchmarks.md). Called before
    the trainer, the plugins and the user's model exist, so what those make is collected as
    before (a file left open in a reference cycle is still closed at exit)."""
    import gc

    gc.freeze()


def cmd_run(stage: str, argv: list[str]) -> int:
    catalog = Catalog.discover()
    pre = _preparse(_split_init_args(argv)[0])[0]
    if pre.help_all:
        groups, broken = _help_groups(catalog)
        _build_parser(stage, groups).print_help()
        if broken:
            print("\nplugins that failed to import (their options are not shown):")
            print("\n".join(f"  {b}" for b in broken))
        return 0
    if pre.help:
        file_config, _, _, selected = _selection(pre, catalog)
        parser = _build_parser(stage, _selected_groups(selected))
        missing = _add_init_arguments(parser, _split_init_args(argv)[0], file_config)
        parser.print_help()
        others = len({(i.kind, i.name) for i in catalog.infos}) - len(selected)
        import textwrap

        print("\n" + textwrap.fill(
            f"Shown: the core's options and those of the {len(selected)} plugins this run "
            f"selects (with --config and the flags given). The other {others} installed "
            f"plugins' options: ptrain {stage} --help-all; one plugin's: select it (-p NAME, "
            f"--strategy NAME, ...) with --help."
            + (" A model's init arguments (--model.KEY): give --model MODULE:CLASS with --help."
               if "model" in missing else ""), 80))
        return 0
    spec = resolve_run(stage, argv, catalog)

    from ptrain.hook_calls import TRACE_ENV
    from ptrain.module import DataModule, TrainModule
    from ptrain.trainer import Trainer

    freeze_imported()
    if spec.trace:  # in the environment, so that the processes a strategy starts trace too
        os.environ[TRACE_ENV] = "1"
    trainer = Trainer(plugin_options=spec.plugin_options, catalog=catalog,
                      **spec.trainer_options)
    trainer.config.update(model=spec.model, data=spec.data)
    if spec.print_config:  # what it prints must run: its model and data classes are checked
        for cfg, base, flag in ((spec.model, TrainModule, "--model"),
                                (spec.data, DataModule, "--data")):
            if cfg.get("class_path"):
                build_component(cfg, base, flag, build=False)
        resume = f"ckpt_path = {json.dumps(spec.ckpt_path)}\n\n" if spec.ckpt_path else ""
        print(resume + dump_config(trainer.config), end="")
        return 0
    ckpt_path = spec.ckpt_path
    rebuild: dict[str, dict[str, Any]] = {}
    if not spec.model.get("class_path"):
        if not ckpt_path:
            raise ModelError("no model given: pass --model MODULE:CLASS (a ptrain.TrainModule), "
                             "set class_path in the [model] table of --config, or give "
                             "--ckpt-path of a checkpoint to rebuild it from.")
        ckpt_path = str(trainer.resolve_ckpt_path(ckpt_path))
        spec.model, spec.data, rebuild = _components_from_checkpoint(ckpt_path, spec.model,
                                                                     spec.data)
        trainer.config.update(model=spec.model, data=spec.data)
    # the trainer seeded when it was made (--seed): the model is built after it, as from Python
    module = build_component(spec.model, TrainModule, "--model", rebuild.get("model"))
    datamodule = (build_component(spec.data, DataModule, "--data", rebuild.get("data"))
                  if spec.data else None)
    run = {"fit": trainer.fit, "validate": trainer.validate, "test": trainer.test,
           "predict": trainer.predict}[stage]
    result = run(module, datamodule=datamodule, ckpt_path=ckpt_path)
    if stage == "predict" and result is not None and not trainer.fast_dev_run \
            and trainer.is_global_zero:  # rank 0 holds every rank's predictions
        import torch

        path = _unused_path(trainer.log_dir / "predictions.pt")
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(result, path)
        print(f"Predictions of {len(result)} batch(es) written to {path} (torch.load(path, "
              f"weights_only=True) reads them).", flush=True)
    return 0


def _unused_path(path: Path) -> Path:
    """``path``, or where it exists (an earlier prediction into the same run folder) the first
    of ``NAME-1.pt``, ``NAME-2.pt``... that does not: nothing written before is replaced."""
    candidate, number = path, 0
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.stem}-{number}{path.suffix}")
    return candidate


def _components_from_checkpoint(path: str, model: dict[str, Any], data: dict[str, Any]
                                ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The ``[model]`` (and, when none was given, ``[data]``) recipe a checkpoint carries: the
    CLI's own, or the classes and saved hyperparameters of a run from Python; and, by table,
    the init arguments that rebuild each (:func:`_rebuild_arguments`). ``model`` may hold init
    arguments given on the command line: they override the saved ones."""
    from ptrain.checkpoint_io import safe_load, sharded_meta
    from ptrain.hyperparameters import DATAMODULE_KEYS, MODULE_KEYS, restored_hyperparameters
    from ptrain.loading import import_saved_class

    # a sharded folder's meta.pt holds what a single file does, but the tensors
    checkpoint = sharded_meta(path) if Path(path).is_dir() else safe_load(path)
    saved = checkpoint.get("config", {}).get("model") or {}
    if not saved.get("class_path") and checkpoint.get("module_class"):
        saved = {"class_path": checkpoint["module_class"],
                 "init_args": restored_hyperparameters(checkpoint.get("hyper_parameters"))}
    if not saved.get("class_path"):
        raise ModelError(f"checkpoint {path!r} does not say how to build its model (it was "
                         f"written by an older ptrain); pass --model MODULE:CLASS and its init "
                         f"arguments.")
    given = model.get("init_args", {})
    model = {"class_path": saved["class_path"],
             "init_args": {**saved.get("init_args", {}), **given}}
    rebuild = {}
    if not data:
        data = checkpoint.get("config", {}).get("data") or {}
        if not data.get("class_path") and checkpoint.get("datamodule_class"):
            data = {"class_path": checkpoint["datamodule_class"],
                    "init_args": restored_hyperparameters(
                        checkpoint.get("datamodule_hyper_parameters"))}
        if data.get("class_path"):
            cls = import_saved_class(data["class_path"], path, "--data", data.get("init_args"))
            rebuild["data"] = _rebuild_arguments(cls, checkpoint, DATAMODULE_KEYS, "data", {})
    cls = import_saved_class(model["class_path"], path, "--model", saved.get("init_args"))
    rebuild["model"] = _rebuild_arguments(cls, checkpoint, MODULE_KEYS, "model", given)
    return model, data, rebuild


def _rebuild_arguments(cls: type, checkpoint: dict[str, Any], keys: tuple[str, str],
                       table: str, given: dict[str, Any]) -> dict[str, Any]:
    """The init arguments that rebuild ``cls`` (the ``table`` component) from ``checkpoint``, as
    ``load_from_checkpoint`` does: the run's recorded ``--TABLE.KEY`` arguments, then the
    hyperparameters saved in the checkpoint (those ``cls`` takes), then ``given`` (today's
    command line). The saved values, not today's defaults, so a default changed since the run
    does not build another model; without saved ones, today's defaults fill in (and a model
    that no longer fits is refused naming the old ones)."""
    from ptrain.hyperparameters import init_arguments_from

    recorded = (checkpoint.get("config", {}).get(table) or {}).get("init_args") or {}
    return {**recorded, **init_arguments_from(cls, checkpoint, keys, {}), **given}


def _unknown_flag(flag: str, parser: _Parser, catalog: Catalog, active: set[str],
                  also: Sequence[argparse.ArgumentParser] = ()) -> NoReturn:
    name = flag.split("=")[0]
    owner = catalog.owner_of_flag(name)
    if owner is not None and owner.name not in active:
        how = f"-p {owner.name}" if owner.kind == "callback" else f"--{owner.kind} {owner.name}"
        raise ConfigError(f"{name} is an option of the {owner.kind} plugin {owner.name!r}, which "
                          f"is not part of this run; add {how}.")
    parser.refuse([flag], also)


# ---------------------------------------------------------------------------------------------


def _main_parser() -> _Parser:
    parser = _Parser(prog="ptrain", description="Train PyTorch models; the loop is a pluggy "
                                                "hook specification and everything else a plugin.")
    parser.add_argument("--version", action="store_true",
                        help="name the core and every plugin distribution with versions")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Command)
    sub.add_parser("fit", help="train a model (ptrain fit --help for its options)",
                   add_help=False)
    sub.add_parser("validate", help="run one validation pass", add_help=False)
    sub.add_parser("test", help="run one test pass (test_step) and report its metrics",
                   add_help=False)
    sub.add_parser("predict", help="run predict_step and write the predictions",
                   add_help=False)
    sub.add_parser("tune", help="measure every installed speed-up on your model and write the "
                                "fastest configuration (ptrain tune --help)", add_help=False)
    sub.add_parser("example", help="train an example that ships with ptrain (ptrain example "
                                   "lists them)", add_help=False)
    plugins = sub.add_parser("plugins", help="list installed plugins (reads metadata only)")
    plugins.add_argument("--check", action="store_true",
                         help="also import each plugin and say whether it can run here")
    plugins.add_argument("--json", action="store_true", help="print the listing as JSON")
    kinds = ",".join(GROUPS)
    new = sub.add_parser("new-plugin", help="write a new plugin distribution to start from",
                         description="Write the distribution ptrain-NAME: pyproject.toml (entry "
                                     "point NAME), a README card, a working plugin of the kind "
                                     "and its tests. Nothing existing is overwritten.")
    new.add_argument("name", metavar="NAME", help="the name users will select it by: lowercase "
                                                   "letters, digits and '-' (e.g. my-xpu)")
    # not `choices=`: the scaffold's own check gives the better message, also from Python
    new.add_argument("--kind", required=True, metavar=f"{{{kinds}}}", help="the plugin kind")
    new.add_argument("--dir", metavar="PATH", help="the folder to create (new or empty; "
                                                   "default: ./ptrain-NAME)")
    export = sub.add_parser("export", help="write a checkpoint's module weights to a "
                                           ".safetensors file, for inference",
                            description="Write the module's weights (state dict) of CHECKPOINT "
                                        "(a .ckpt file or a sharded checkpoint folder) to one "
                                        "safetensors file, with the module class and its "
                                        "hyperparameters in the file's metadata.")
    export.add_argument("checkpoint", metavar="CHECKPOINT", help="a ptrain checkpoint")
    export.add_argument("--output", required=True, metavar="FILE",
                        help="the file to write, e.g. model.safetensors")
    export.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    return parser


@contextlib.contextmanager
def _warnings_as_sentences():
    """While the CLI runs, a warning is one line on stderr, once per process, as a sentence for
    a person: ``ptrain: warning: ...`` (``ptrain: warning from torch: ...`` when another package
    raised it), without Python's file name, line number, category and source-line echo."""
    shown: set[str] = set()
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        text = " ".join(str(message).split())
        if text in shown:
            return
        shown.add(text)
        source = _package_of(filename)
        mine = source is None or source == "ptrain" or source.startswith("ptrain_")
        prefix = "ptrain: warning" if mine else f"ptrain: warning from {source}"
        print(f"{prefix}: {text}", file=file or sys.stderr, flush=True)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = previous


def _package_of(filename: str) -> str | None:
    """The top-level package of the loaded module whose file is ``filename``, if any."""
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) == filename:
            return module.__name__.split(".")[0]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _printable_in_any_encoding()
    with _warnings_as_sentences():
        return _main(argv)


def _printable_in_any_encoding() -> None:
    """A character the terminal's encoding lacks (``±`` under ``PYTHONIOENCODING=ascii``) is
    printed escaped (``\\xb1``), as Python prints it on stderr, instead of failing the
    command after its work is done."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            reconfigure(errors="backslashreplace")


def _main(argv: list[str]) -> int:
    try:
        if argv and argv[0] in STAGES:
            return cmd_run(argv[0], argv[1:])
        if argv and argv[0] == "example":
            return cmd_example(argv[1:])
        if argv and argv[0] == "tune":
            from ptrain.tuning.command import cmd_tune

            return cmd_tune(argv[1:])
        args = _main_parser().parse_args(argv)
        if args.version:
            print(version_text())
            return 0
        if args.command == "plugins":
            return cmd_plugins(args)
        if args.command == "new-plugin":
            return cmd_new_plugin(args)
        if args.command == "export":
            from ptrain.export import run_export

            print(run_export(args.checkpoint, args.output, args.force))
            return 0
        _main_parser().print_help()
        return 0
    except PtrainError as exc:
        if not getattr(exc, "ptrain_reported_to_launcher", False):  # else rank 0 prints it
            print(f"ptrain: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    except WorkerError as exc:  # a worker's bug: its traceback is in the message
        print(f"ptrain: {exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:  # stopped by a signal, the checkpoint written and said where
        return exc.exit_code
    except BrokenPipeError:  # the reader went away (`ptrain plugins | head -1`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("ptrain: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the traceback follows; say first whose code raised
        if not getattr(exc, "ptrain_reported_to_launcher", False):
            death = _worker_death(exc)
            if death is not None:  # torch's traceback here shows only the loader's machinery
                print(death, file=sys.stderr, flush=True)
                return 1
            header = _error_header(exc)
            if header is not None:
                print(header, file=sys.stderr, flush=True)
        raise


def _worker_death(exc: BaseException) -> str | None:
    """The whole report when a DataLoader worker process died without a Python error, else
    ``None``: torch can only say that it died, so its traceback has nothing to add."""
    from ptrain.frames import dataloader_worker_death

    death = dataloader_worker_death(exc)
    if death is None:
        return None
    return (f"ptrain: error: a DataLoader worker process died without a Python error ({death}): "
            f"the code it runs (the dataset's __getitem__, a collate_fn, a worker_init_fn) "
            f"crashed in native code, or the process was killed (out of memory). Give the "
            f"DataLoader num_workers=0 to run that code in this process, where the error can "
            f"be seen.{_resume_note(exc)}")


def _resume_note(exc: BaseException) -> str:
    """" Checkpoints saved so far are intact: ..." when the failed fit wrote one, else ""."""
    from ptrain.frames import fit_checkpoint

    checkpoint = fit_checkpoint(exc)
    if checkpoint is None:
        return ""
    return (f" Checkpoints saved so far are intact: resume with --ckpt-path last "
            f"({checkpoint}).")


def _error_header(exc: BaseException) -> str | None:
    """The line above the traceback of an exception that is not ptrain's own error: whose code
    raised it (the user's, or a plugin's hook), and the checkpoint to resume from when the
    failed fit wrote one."""
    from ptrain.frames import PLUGIN_BLAME, error_origin

    origin = error_origin(exc)
    if origin is None:
        return None
    said, by_plugin = origin
    blame = PLUGIN_BLAME if by_plugin else ""
    return f"ptrain: {said}; its traceback follows.{blame}" + _resume_note(exc)


if __name__ == "__main__":
    sys.exit(main())

