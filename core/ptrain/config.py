"""The core's options and the run configuration: TOML in, TOML out.

A config file has four tables, each optional::

    [trainer]                      # the core's options (same names as Trainer(...) keywords)
    max_epochs = 3
    callbacks = ["early-stopping", "no:tensorboard"]   # the -p values

    [model]                        # what `--model` and `--model.KEY VALUE` give
    class_path = "ptrain.examples.digits:DigitsClassifier"
    init_args = { hidden = 64 }

    [data]                         # likewise for `--data`

    [plugins.early-stopping]       # each active plugin's options
    monitor = "val_loss"

Precedence: option defaults < config file < flags.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, as a package (a dependency on 3.10 only)
    import tomli as tomllib

from ptrain.errors import ConfigError
from ptrain.options import (
    OptionGroup, closest, to_bool, to_float, to_int, to_int_or_float, to_str_list,
)

TABLES = ("trainer", "model", "data", "plugins")
TOP_LEVEL_KEYS = ("ckpt_path",)  # a scalar before the tables: where to resume from
#: The callbacks every run has unless blocked with ``no:NAME``.
DEFAULT_CALLBACKS = ("checkpoint", "tensorboard", "progress-bar", "results", "dataloading",
                     "model-summary", "stop-signals")


#: Lightning's other spellings of plugin names -> ptrain's (``Trainer(precision=16)``).
PLUGIN_ALIASES: dict[str, dict[str, str]] = {
    "precision": {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true",
                  "half": "16-true"},
    "accelerator": {"gpu": "cuda"},
    "strategy": {},
}


def canonical_plugin_name(kind: str, value: Any) -> str:
    """The plugin name ``value`` selects for ``kind``: text, or Lightning's int precisions
    (16, 32, 64), with Lightning's aliases mapped to ptrain's names (``16`` -> ``16-mixed``,
    ``"bf16"`` -> ``bf16-mixed``, ``"gpu"`` -> ``cuda``)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"expected a plugin name, got {type(value).__name__} {value!r}")
    text = str(value)
    return PLUGIN_ALIASES.get(kind, {}).get(text, text)


def _plugin_name(kind: str):
    def convert(value: Any) -> str:
        return canonical_plugin_name(kind, value)

    convert.__doc__ = f"a {kind} plugin name"
    return convert


def to_devices(value: Any) -> int | str | list[int]:
    """A device count (``2``), ``"auto"``, or a list of indices (``[0, 2]``, ``"[0, 2]"`` or
    ``"0,2"``)."""
    if value == "auto":
        return "auto"
    if isinstance(value, (list, tuple)):
        return [to_int(v) for v in value]
    if isinstance(value, str) and value.strip().startswith("[") and value.strip().endswith("]"):
        return [to_int(v) for v in value.strip()[1:-1].split(",") if v.strip()]
    if isinstance(value, str) and "," in value:
        return [to_int(v) for v in value.split(",") if v.strip()]
    count = to_int(value)
    if count < 1:
        raise ValueError(f"expected a positive device count, 'auto' or a list, got {count}")
    return count


_DURATION = re.compile(r"^(?:(\d+):)?(\d+):(\d+):(\d+)$")
#: a number of seconds, minutes, hours or days: ``90s``, ``10m``, ``1.5h``, ``2d``
_WITH_UNIT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


#: the seeds torch's generator takes, less the room a distributed sampler needs to add the
#: epoch (it seeds with seed + epoch: 2**64 - 1 would overflow in the second epoch);
#: seed_everything gives NumPy's generator the seed modulo 2**32
SEED_RANGE = (0, 2**63 - 1)


def to_seed(value: Any) -> int:
    """A seed: an integer from 0 to 2**63 - 1."""
    seed = to_int(value)
    if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ValueError(f"a seed must be from {SEED_RANGE[0]} to {SEED_RANGE[1]} (what torch's "
                         f"generator takes, with room for the epoch a distributed sampler adds "
                         f"to it), got {seed}")
    return seed


#: what :func:`to_seconds` takes, for its messages
DURATION_FORMS = ("seconds (3600), a number with s, m, h or d (90s, 10m, 1.5h, 2d) or "
                  "DD:HH:MM:SS (00:01:00:00)")


def to_seconds(value: Any) -> float:
    """A duration: seconds (``90``), a number with a unit (``90s``, ``10m``, ``1.5h``, ``2d``)
    or ``"DD:HH:MM:SS"`` (``"00:12:00:00"``; days optional), above 0."""
    if isinstance(value, str) and ":" in value:
        match = _DURATION.match(value.strip())
        if not match:
            raise ValueError(f"expected {DURATION_FORMS}, got {value!r}")
        days, hours, minutes, secs = (int(g) if g else 0 for g in match.groups())
        seconds = float(((days * 24 + hours) * 60 + minutes) * 60 + secs)
    else:
        unit = _WITH_UNIT.fullmatch(value.strip()) if isinstance(value, str) else None
        try:
            seconds = float(unit[1]) * _UNIT_SECONDS[unit[2]] if unit else to_float(value)
        except ValueError:
            raise ValueError(f"expected {DURATION_FORMS}, got {value!r}") from None
    if not seconds > 0:  # NaN too
        raise ValueError(f"expected a duration above 0, got {value!r}")
    return seconds


def positive(convert):
    """``convert`` that also refuses a number <= 0 (``positive(to_int)``: a count >= 1)."""

    def positive_number(value: Any):
        number = convert(value)
        if not number > 0:  # NaN too
            raise ValueError(f"expected a positive number, got {value!r}")
        return number

    positive_number.__doc__ = convert.__doc__
    return positive_number


def _batch_limit(value: Any) -> int | float:
    """A number of batches (int; a whole float above 1.0 is taken as one), or a fraction of
    them (float in [0, 1]; 0 turns the stage off)."""
    limit = to_int_or_float(value)
    if isinstance(limit, float) and limit > 1.0 and limit.is_integer():
        return int(limit)  # as Lightning: 10.0 batches is 10
    if isinstance(limit, float) and not 0.0 <= limit <= 1.0:
        raise ValueError(f"a fraction must be in [0, 1], got {limit}; give a whole number for "
                         f"a count")
    if isinstance(limit, int) and limit < 0:
        raise ValueError(f"a batch count must be >= 0, got {limit}")
    return limit


def _non_negative_int(value: Any) -> int:
    """A whole number >= 0."""
    number = to_int(value)
    if number < 0:
        raise ValueError(f"expected a whole number >= 0, got {number}")
    return number


def _sanity_steps(value: Any) -> int:
    """A number of validation batches, or -1 for all of them."""
    steps = to_int(value)
    if steps < -1:
        raise ValueError(f"expected a batch count >= 0, or -1 for all, got {steps}")
    return steps


def _fast_dev_run(value: Any) -> bool | int:
    """``true`` (one batch), ``false``, or a positive number of batches."""
    if isinstance(value, bool) or (isinstance(value, str) and not value.strip().isdigit()):
        return to_bool(value)
    batches = to_int(value)
    if batches < 0:
        raise ValueError(f"expected true, false or a number of batches >= 0, got {batches}")
    return batches


def _deterministic(value: Any) -> bool | str:
    """``true``, ``false`` or ``"warn"``."""
    if isinstance(value, str) and value.strip().lower() == "warn":
        return "warn"
    try:
        return to_bool(value)
    except ValueError:
        raise ValueError(f"expected true, false or 'warn', got {value!r}") from None


def _overfit(value: Any) -> int | float:
    """0 (off), a number of batches, or a fraction in (0, 1]."""
    limit = to_int_or_float(value)
    return 0 if limit == 0 else _batch_limit(limit)


def _toml_context(path: Path, text: str, error: str) -> str:
    """What helps to find a TOML error: the line it names, and for a YAML or JSON file that
    ptrain reads TOML only."""
    said = ""
    line = re.search(r"\(at line (\d+), column \d+\)", error)
    lines = text.splitlines()
    if line and 0 < int(line[1]) <= len(lines) and lines[int(line[1]) - 1].strip():
        said = f"; line {line[1]} reads {lines[int(line[1]) - 1].strip()[:80]!r}"
    if Path(path).suffix.lower() in (".yaml", ".yml", ".json"):
        said += (f". ptrain reads config files in TOML only (`ptrain fit --print-config` prints "
                 f"one to start from), not {Path(path).suffix[1:].upper()}")
    return said


def _folder(value: Any) -> str:
    """A folder's path: not empty (which would put the run folders in the working directory
    without saying so; give '.' for that) and without a NUL character."""
    path = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    if not path.strip():
        raise ValueError("expected a folder's path, got an empty one (give '.' for the working "
                         "directory)")
    if "\0" in path:
        raise ValueError(f"a path can't hold a NUL character: {path!r}")
    return path


def core_options() -> OptionGroup:
    """The core's own options: the ``[trainer]`` table, the flags without a plugin prefix, and the
    keyword arguments of :class:`ptrain.Trainer`."""
    g = OptionGroup("trainer")
    g.add("accelerator", _plugin_name("accelerator"), default="auto",
          help="accelerator plugin by name; 'auto' picks the best available one ('gpu': cuda)")
    g.add("strategy", _plugin_name("strategy"), default="single-device",
          help="strategy plugin by name")
    g.add("precision", _plugin_name("precision"), default="32-true",
          help="precision plugin by name (Lightning's 16, 32, 64 and 'bf16' mean 16-mixed, "
               "32-true, 64-true and bf16-mixed)")
    g.add("callbacks", to_str_list, default=[],
          help=f"callback plugins to enable (NAME) or block (no:NAME); on by default: "
               f"{', '.join(DEFAULT_CALLBACKS)}")
    g.add("devices", to_devices, default=1, help="device count, 'auto' or a list of indices")
    g.add("num_nodes", positive(to_int), default=1, help="number of machines")
    g.add("max_epochs", to_int, help="stop after this many epochs (default: 1000 when no other "
          "limit is set)")
    g.add("min_epochs", to_int, help="train at least this many epochs before a stop takes effect")
    g.add("max_steps", to_int, help="stop after this many optimizer steps")
    g.add("min_steps", to_int, help="train at least this many optimizer steps")
    g.add("max_time", to_seconds, help="stop after this long of training (counted from after "
                                       "the sanity check): seconds or DD:HH:MM:SS")
    g.add("val_check_interval", positive(to_int_or_float), default=1.0,
          help="validate every this fraction of an epoch (float) or this many batches (int)")
    g.add("check_val_every_n_epoch", positive(to_int), default=1,
          help="validate at the end of every n-th epoch (from Python, None: every "
               "val_check_interval training batches counted across epochs, an int)")
    g.add("limit_train_batches", _batch_limit, default=1.0,
          help="train on this many batches (int) or this fraction (float) of each epoch; 0: "
               "fit trains nothing (said in a warning)")
    g.add("limit_val_batches", _batch_limit, default=1.0,
          help="validate on this many batches (int) or this fraction (float); 0 turns it off")
    g.add("limit_test_batches", _batch_limit, default=1.0,
          help="test on this many batches (int) or this fraction (float)")
    g.add("limit_predict_batches", _batch_limit, default=1.0,
          help="predict on this many batches (int) or this fraction (float)")
    g.add("reload_dataloaders_every_n_epochs", _non_negative_int, default=0,
          help="ask the module (or datamodule) for the training dataloader again every n "
               "epochs, and for the validation dataloader before a validation n epochs after it "
               "was last asked for (0: once per stage)")
    g.add("num_sanity_val_steps", _sanity_steps, default=2,
          help="validation batches run before training, so a broken validation_step fails in "
               "seconds (-1: all, 0: none); nothing is logged and the random state is kept")
    g.add("fast_dev_run", _fast_dev_run, default=False,
          help="debugging: run 1 (or this many) batch(es) of each stage, one epoch, with nothing "
               "written (no checkpoints, no logs)")
    g.add("overfit_batches", _overfit, default=0,
          help="debugging: train and validate on the same first batches (int) or fraction "
               "(float) of the data, unshuffled, to check the model can fit them")
    g.add("deterministic", _deterministic, default=False,
          help="use only deterministic algorithms (torch.use_deterministic_algorithms); an op "
               "without one is an error naming it, or with 'warn' a warning")
    g.add("accumulate_grad_batches", positive(to_int), default=1,
          help="accumulate gradients over this many batches per optimizer step")
    g.add("gradient_clip_val", positive(to_float), help="clip gradients at this norm or value")
    g.add("gradient_clip_algorithm", str, default="norm", choices=("norm", "value"),
          help="how gradient_clip_val clips")
    g.add("log_every_n_steps", positive(to_int), default=50,
          help="write step metrics (and check the loss is finite) every n optimizer steps")
    g.add("default_root_dir", _folder, default="runs",
          help="directory for run folders (version_N: logs and checkpoints)")
    g.add("save_on_each_node", to_bool, default=False,
          help="a job across machines whose run root is on each machine's own disk: the first "
               "process of every machine writes the checkpoints there, so each machine "
               "resumes from its own copy (default: global rank 0 only, into a shared "
               "filesystem)")
    g.add("seed", to_seed, help="seed Python, NumPy and torch once, when the trainer is made "
                               "(before the model is built), for a reproducible run")
    g.add("detect_anomaly", to_bool, default=False,
          help="debugging: name the forward operation whose backward produced a NaN/Inf "
               "(torch.autograd anomaly mode; slower: see \"Configuration\" in the docs)")
    g.add("inference_mode", to_bool, default=True,
          help="run validation, test and predict under torch.inference_mode (false: "
               "torch.no_grad, for a step that turns gradients on or keeps its tensors for "
               "training)")
    g.instead.update(_LIGHTNING_SWITCHES)
    return g


#: Lightning's Trainer arguments that switch a default callback off, and ptrain's way to say it
#: (ptrain.lightning.Trainer takes them as they are)
_LIGHTNING_SWITCHES = {
    f"enable_{name}": (f"Lightning's switch for a default callback; ptrain's Trainer turns it "
                       f"off with callbacks=[\"no:{plugin}\"] (on the command line: "
                       f"-p no:{plugin}). ptrain.lightning.Trainer takes enable_{name} as "
                       f"Lightning does.")
    for name, plugin in (("progress_bar", "progress-bar"), ("model_summary", "model-summary"),
                         ("checkpointing", "checkpoint"))
}
_LIGHTNING_SWITCHES["logger"] = (
    "Lightning's logger argument; ptrain's loggers are callbacks: callbacks=[\"no:tensorboard\"] "
    "turns the default one off, callbacks=[\"csv\"] (or a logger object) adds one. "
    "ptrain.lightning.Trainer takes logger= as Lightning does.")


# ---------------------------------------------------------------------------------------------
# TOML in


#: the largest config file read (a config is a few kilobytes)
MAX_CONFIG_BYTES = 1 << 20


def misplaced_key_hint(key: str, table: str) -> str:
    """Where ``key``, found in ``table`` where it is unknown, is an option of [trainer]: the
    rest of a sentence that says so and why TOML put it there (a line appended at the end of
    a file goes into the file's last table), else ``""``."""
    if key not in core_options().options:
        return ""
    return (f" is an option of [trainer], not of {table}: in TOML a key belongs to the table "
            f"whose header is above it, so a line added at the end of a file goes into its last "
            f"table. Move it under [trainer].")


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a config file and check its layout (not yet its values)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file {str(path)!r} is {size:,} bytes; a config is a few "
                              f"kilobytes, and files above {MAX_CONFIG_BYTES:,} bytes are not "
                              f"read (is it the right file?).")
        # utf-8-sig: the byte-order mark some editors write is not TOML. A FIFO or a device
        # has no size: read a bounded amount either way
        with open(path, encoding="utf-8-sig") as f:
            text = f.read(MAX_CONFIG_BYTES + 1)
        if len(text) > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file {str(path)!r} holds more than "
                              f"{MAX_CONFIG_BYTES:,} bytes; a config is a few kilobytes (is it "
                              f"the right file?).")
        data = tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {str(path)!r} can't be read: {exc}.") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}"
                          f"{_toml_context(path, text, str(exc))}.") from None
    for key, value in data.items():
        if key in TOP_LEVEL_KEYS:
            if not isinstance(value, str):
                raise ConfigError(f"{key!r} in {str(path)!r} must be text (a path or 'last').")
            continue
        if key not in TABLES:
            if key in core_options().options:
                raise ConfigError(
                    f"{key!r} in {str(path)!r} is an option of [trainer], but it stands above "
                    f"every table header, at the top level (where only "
                    f"{', '.join(TOP_LEVEL_KEYS)} goes). Move it under [trainer].")
            raise ConfigError(
                f"unknown key or table {key!r} in {str(path)!r}; valid tables: "
                f"{', '.join(TABLES)}; valid top-level keys: {', '.join(TOP_LEVEL_KEYS)}."
                f"{closest(key, TABLES + TOP_LEVEL_KEYS)}"
            )
        if not isinstance(value, dict):
            raise ConfigError(f"{key!r} in {str(path)!r} must be a table ([{key}]).")
    for name, table in data.get("plugins", {}).items():
        if not isinstance(table, dict):
            raise ConfigError(f"[plugins] {name!r} in {str(path)!r} must be a table "
                              f"([plugins.{name}]).")
    for key in ("model", "data"):
        table = data.get(key, {})
        unknown = set(table) - {"class_path", "init_args"}
        for name in sorted(unknown):
            hint = misplaced_key_hint(name, f"[{key}]")
            if hint:
                raise ConfigError(f"{name!r} in [{key}] of {str(path)!r}{hint}")
        if unknown:
            first = sorted(unknown)[0]
            hint = closest(first, ["class_path", "init_args"]) or (
                f" An init argument of the class goes in init_args: init_args = {{ {first} = "
                f"... }}, or the line `{first} = ...` under a [{key}.init_args] header.")
            raise ConfigError(f"unknown key(s) {sorted(unknown)} in [{key}] of {str(path)!r}; "
                              f"valid keys: class_path, init_args.{hint}")
        if "class_path" in table and not isinstance(table["class_path"], str):
            raise ConfigError(f"class_path in [{key}] of {str(path)!r} must be text "
                              f"(\"module:Class\"), got {table['class_path']!r}.")
        if "init_args" in table and not isinstance(table["init_args"], dict):
            raise ConfigError(f"init_args in [{key}] of {str(path)!r} must be a table "
                              f"([{key}.init_args] with one key per argument), got "
                              f"{table['init_args']!r}.")
    return data


def parse_value(text: str) -> Any:
    """A value given on the command line, read as TOML (``64``, ``0.1``, ``true``, ``[1, 2]``,
    ``"x"``); anything that is not a TOML value is taken as text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


# ---------------------------------------------------------------------------------------------
# TOML out


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) \
            + " }"
    return json.dumps(str(value))


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def dump_config(config: dict[str, Any]) -> str:
    """The resolved configuration as TOML that :func:`load_config_file` reads back; unset values
    (``None``) are written as comments."""
    lines: list[str] = []

    def table(header: str, values: dict[str, Any]) -> None:
        lines.append(f"[{header}]")
        for key, value in values.items():
            if value is None:
                lines.append(f"# {_toml_key(key)} = (unset)")
            else:
                lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
        lines.append("")

    table("trainer", config.get("trainer", {}))
    for key in ("model", "data"):
        if config.get(key):
            table(key, config[key])
    for name, values in config.get("plugins", {}).items():
        table(f"plugins.{_toml_key(name)}", values)
    return "\n".join(lines)


def dump_hyperparameters(hyperparameters: dict[str, Any]) -> str:
    """Hyperparameters as a TOML document that ``tomllib`` reads back to the same dict, except
    that TOML has no null: a top-level ``None`` is written as a comment (``# name = (unset)``, so
    the key is absent when read back) and a ``None`` inside a list or table as the text
    ``"None"``."""
    lines = []
    for key, value in hyperparameters.items():
        if value is None:
            lines.append(f"# {_toml_key(key)} = (unset)")
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
