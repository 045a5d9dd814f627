"""The ``ptrain`` command, run for real in subprocesses: training and resuming, the config file and
its precedence, and every usage error (exit code 2, one message, no traceback).

Each CLI run costs a Python start and a torch import (~2 s), so the module's independent runs are
started up front by the ``runs`` fixture, two at a time, and each test checks its own run's result.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import re
import shutil
import tomllib
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import ptrain
from _cli_util import CLIRuns, assert_ok, assert_usage_error, installed_names
from conftest import TinyRegressor, run_cli

pytestmark = pytest.mark.slow

TINY = "tests.conftest:TinyRegressor"
MODEL = ["--model", TINY, "--accelerator", "cpu"]
BATCHES_PER_EPOCH = 8  # TinyRegressor: 64 samples in batches of 8
NAN_FROM = 5  # NaNRegressor's first NaN loss: the 6th training batch (epoch 0, batch 5)


class Opaque:
    """A custom class: a checkpoint holding an instance needs arbitrary unpickling to load."""

    def __init__(self):
        self.payload = [1, 2, 3]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): digest(p) for p in sorted(root.rglob("*")) if p.is_file()}


def final_val_loss(stdout: str) -> float:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "nothing was printed"
    match = re.search(r"val_loss=(\S+)", lines[-1])
    assert match, f"the last line does not give val_loss: {lines[-1]!r}"
    return float(match.group(1))


# ---------------------------------------------------------------------------------------------
# What the module runs. Tables of cases, then the fixture that starts them all.

UNKNOWN_PLUGINS = [
    # flag, kind, typed, intended
    ("--accelerator", "accelerator", "cpuu", "cpu"),
    ("--strategy", "strategy", "single-devise", "single-device"),
    ("--precision", "precision", "32-tru", "32-true"),
    ("-p", "callback", "chekpoint", "checkpoint"),
    # The examples; the intended plugins are other distributions of this repository,
    # so "Did you mean" is only required when they are installed.
    ("--strategy", "strategy", "ddpp", "ddp"),
    ("--precision", "precision", "16-mixd", "16-mixed"),
    ("-p", "callback", "early-stoping", "early-stopping"),
]

BAD_MODELS = {
    "not-importable": (["--model", "tests.no_such_module:Model"],
                       ["tests.no_such_module", "could not be imported"]),
    "no-such-class": (["--model", "tests.conftest:NoSuchClass"], ["NoSuchClass"]),
    "no-colon": (["--model", "tests.conftest"], ["MODULE:CLASS"]),
    "not-a-trainmodule": (["--model", "tests._cli_models:NotAModule"],
                          ["NotAModule", "not a ptrain.TrainModule"]),
    "unknown-init-arg": (["--model", TINY, "--model.lrr", "0.3"], ["'lrr'", "Did you mean 'lr'?"]),
    "no-model": ([], ["--model"]),
}

BAD_CONFIGS = {  # key: (file text or None for no file, what the message must say)
    "unknown-trainer-key": ("[trainer]\nmax_epoch = 3\n",
                            ["'max_epoch'", "Did you mean 'max_epochs'?"]),
    "wrong-type": ('[trainer]\nmax_epochs = "three"\n', ["max_epochs", "three"]),
    "unknown-table": ("[trainr]\nmax_epochs = 3\n",
                      ["{file}", "'trainr'", "Did you mean 'trainer'?"]),
    "invalid-toml": ("[trainer\nmax_epochs = 3\n", ["{file}", "not valid TOML"]),
    "unknown-plugin-key": ("[plugins.checkpoint]\nevery_n_epoch = 3\n",
                           ["'every_n_epoch'", "Did you mean 'every_n_epochs'?"]),
    "plugin-not-in-run": ("[plugins.nope]\nvalue = 3\n", ["'nope'"]),
    "unknown-model-key": ('[model]\nclass_pth = "x:Y"\n', ["{file}", "class_pth", "class_path"]),
    "missing-file": (None, ["{file}", "does not exist"]),
}

CONFIG = """\
[trainer]
accelerator = "cpu"
max_epochs = 3
seed = 7
log_every_n_steps = 5
callbacks = ["no:tensorboard"]

[model]
class_path = "tests.conftest:TinyRegressor"
init_args = { lr = 0.05, batch_size = 16 }

[plugins.checkpoint]
every_n_epochs = 2
"""
SAME_AS_CONFIG = ["--accelerator", "cpu", "--max-epochs", "3", "--seed", "7",
                  "--log-every-n-steps", "5", "-p", "no:tensorboard", "--model", TINY,
                  "--model.lr", "0.05", "--model.batch_size", "16",
                  "--checkpoint-every-n-epochs", "2"]
OVERRIDES = ["--max-epochs", "5", "--checkpoint-every-n-epochs", "4", "--model.lr", "0.2"]

BAD_CHECKPOINTS = {
    "missing": ["does not exist"],
    "truncated": ["corrupt"],
    "random-bytes": ["corrupt"],
    "foreign": ["not a ptrain checkpoint"],
    "pickled-object": ["pickled"],
}


CHECKPOINT_TESTS = ("test_fit_trains_and_writes_last_checkpoint",
                    "test_resume_from_last_continues_in_the_same_run_folder",
                    "test_unusable_checkpoint_is_a_usage_error_and_leaves_the_run_alone",
                    "test_random_bytes_are_reported_as_corrupt_not_as_unsafe",
                    "test_missing_checkpoint_with_default_callbacks_is_a_usage_error")
CONFIG_TESTS = ("test_print_config_shows_plugin_options_and_does_not_train",
                "test_config_file_gives_the_same_settings_as_flags",
                "test_flags_override_the_config_file_and_the_output_reads_back")


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """Starts every run of this module that depends on nothing but its arguments (those of the
    selected tests); ``runs.dirs[key]`` is the run's own scratch folder."""
    pool = CLIRuns(request)

    def start(key: str, *args: str, used_by: tuple[str, ...]) -> None:
        pool.start(key, *args, used_by=used_by)

    def scratch(key: str) -> Path:
        folder = pool.dirs[key] = tmp_path_factory.mktemp(key)
        return folder

    # First, the training the checkpoint tests build on.
    start("trained", "fit", *MODEL, "--max-epochs", "2", "--default-root-dir",
          str(scratch("trained") / "runs"), used_by=CHECKPOINT_TESTS)
    start("nan", "fit", "--model", "tests._cli_models:NaNRegressor", "--accelerator", "cpu",
          "--model.nan_from", str(NAN_FROM), "--max-epochs", "2",
          "--default-root-dir", str(scratch("nan") / "runs"),
          "--checkpoint-every-n-train-steps", "1", "--log-every-n-steps", "2",
          used_by=("test_nan_loss_stops_with_the_batch_and_keeps_a_good_checkpoint",))

    config_file = scratch("config") / "run.toml"
    config_file.write_text(CONFIG)
    config_root = str(pool.dirs["config"] / "runs")
    start("from-file", "fit", "--config", str(config_file), "--default-root-dir", config_root,
          "--print-config", used_by=CONFIG_TESTS)
    start("from-flags", "fit", *SAME_AS_CONFIG, "--default-root-dir", config_root,
          "--print-config", used_by=CONFIG_TESTS)
    start("overridden", "fit", "--config", str(config_file), *OVERRIDES,
          "--default-root-dir", config_root, "--print-config", used_by=CONFIG_TESTS)

    for flag, _, typed, _ in UNKNOWN_PLUGINS:
        start(f"unknown-{typed}", "fit", "--model", TINY, "--default-root-dir",
              str(scratch(f"unknown-{typed}") / "runs"), flag, typed,
              used_by=("test_unknown_plugin_name",))
    for key, (args, _) in BAD_MODELS.items():
        start(f"model-{key}", "fit", *args, "--accelerator", "cpu", "--max-epochs", "1",
              "--default-root-dir", str(scratch(f"model-{key}") / "runs"),
              used_by=("test_bad_model_is_a_usage_error",))
    for key, (text, _) in BAD_CONFIGS.items():
        folder = scratch(f"config-{key}")
        if text is not None:
            (folder / "bad.toml").write_text(text)
        start(f"config-{key}", "fit", *MODEL, "--config", str(folder / "bad.toml"),
              "--default-root-dir", str(folder / "runs"),
              used_by=("test_bad_config_file_is_a_usage_error",))

    flags_root = str(scratch("flags"))
    start("max-epoch", "fit", *MODEL, "--default-root-dir", flags_root, "--max-epoch", "2",
          used_by=("test_mistyped_core_flag_suggests_the_closest",))
    start("checkpoint-typo", "fit", *MODEL, "--default-root-dir", flags_root,
          "--checkpoint-every-n-epoch", "2",
          used_by=("test_mistyped_option_of_an_active_plugin_suggests_the_closest",))
    start("blocked-option", "fit", *MODEL, "--default-root-dir", flags_root,
          "-p", "no:checkpoint", "--checkpoint-every-n-epochs", "2",
          used_by=("test_option_of_a_plugin_outside_the_run_says_how_to_enable_it",))
    start("fit-help", "fit", "--help",
          used_by=("test_fit_help_shows_trainer_options_and_plugin_groups",
                   "test_fit_help_shows_only_the_selected_plugins_options"))
    start("fit-help-ddp", "fit", "--strategy", "ddp", "--help",
          used_by=("test_fit_help_shows_only_the_selected_plugins_options",))
    start("fit-help-all", "fit", "--help-all",
          used_by=("test_fit_help_shows_only_the_selected_plugins_options",))
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def trained_run(runs):
    """One real 2-epoch training with the default callbacks."""
    root = runs.dirs["trained"] / "runs"
    last = root / "version_0" / "checkpoints" / "last.ckpt"
    result = runs["trained"]
    return SimpleNamespace(result=result, root=root, last=last,
                           last_bytes=last.read_bytes() if last.is_file() else None)


def _write_bad_checkpoint(kind: str, path: Path, good: bytes) -> None:
    if kind == "missing":
        return
    if kind == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif kind == "random-bytes":
        path.write_bytes(random.Random(0).randbytes(8192))
    elif kind == "foreign":
        torch.save({"state_dict": TinyRegressor().state_dict()}, path)
    elif kind == "pickled-object":
        torch.save({"format": "ptrain-checkpoint", "format_version": 1,
                    "model": TinyRegressor().state_dict(), "extra": Opaque()}, path)
    else:
        raise AssertionError(kind)


@pytest.fixture(scope="module")
def checkpoint_runs(runs, trained_run, tmp_path_factory):
    """The runs that start from the trained run's files, each in its own copy of the run folder:
    a resume from ``last``, and one resume from each kind of unusable checkpoint (placed next to
    the good last.ckpt, so that the failed run would live in that very folder)."""
    assert trained_run.last_bytes is not None, "the training run wrote no last.ckpt"
    cases = {}

    def copy_of_run(key: str) -> Path:
        root = tmp_path_factory.mktemp(key) / "runs"
        shutil.copytree(trained_run.root, root)
        return root

    root = copy_of_run("resume")
    record = root.parent / "steps.txt"
    runs.start("resume", "fit", "--model", "tests._cli_models:RecordingRegressor",
               "--model.record", str(record), "--accelerator", "cpu", "--max-epochs", "3",
               "--default-root-dir", str(root), "--ckpt-path", "last",
               used_by=("test_resume_from_last_continues_in_the_same_run_folder",))
    cases["resume"] = SimpleNamespace(root=root, record=record)
    for kind in BAD_CHECKPOINTS:
        root = copy_of_run(f"bad-{kind}")
        bad = root / "version_0" / "checkpoints" / f"bad-{kind}.ckpt"
        _write_bad_checkpoint(kind, bad, trained_run.last_bytes)
        cases[kind] = SimpleNamespace(root=root, bad=bad, before=tree_digest(root))
        runs.start(f"bad-{kind}", "fit", *MODEL, "--max-epochs", "3", "--default-root-dir",
                   str(root), "--ckpt-path", str(bad), "--no-progress-bar",
                   used_by=("test_unusable_checkpoint_is_a_usage_error_and_leaves_the_run_alone",
                            "test_random_bytes_are_reported_as_corrupt_not_as_unsafe"))
    root = copy_of_run("missing-default-callbacks")
    cases["missing-default-callbacks"] = SimpleNamespace(
        root=root, bad=root / "version_0" / "checkpoints" / "nope.ckpt", before=tree_digest(root))
    runs.start("missing-default-callbacks", "fit", *MODEL, "--max-epochs", "3",
               "--default-root-dir", str(root), "--ckpt-path",
               str(cases["missing-default-callbacks"].bad),
               used_by=("test_missing_checkpoint_with_default_callbacks_is_a_usage_error",))
    return cases


# ---------------------------------------------------------------------------------------------
# Training, resuming, unusable checkpoints, NaN


def test_fit_trains_and_writes_last_checkpoint(trained_run):
    assert_ok(trained_run.result)
    assert math.isfinite(final_val_loss(trained_run.result.stdout))
    assert trained_run.last.is_file()
    assert sorted(p.name for p in trained_run.root.iterdir()) == ["version_0"]
    checkpoint = torch.load(trained_run.last, weights_only=True)
    assert checkpoint["format"] == "ptrain-checkpoint"
    assert checkpoint["loop"]["epoch"] == 2
    assert checkpoint["loop"]["global_step"] == 2 * BATCHES_PER_EPOCH


def test_what_the_command_imported_is_left_out_of_the_collectors_passes(cli, tmp_path):
    """``gc.freeze()`` once torch and ptrain are imported, before the trainer and the model
    exist: Python's last collection at exit walked torch's objects (0.3 to 1 s at the end of
    every command); the model (made after) is still among the objects the collector frees."""
    record = tmp_path / "frozen.txt"
    result = cli("fit", "--model", "tests._cli_models:FreezeCountRegressor", "--model.record",
                 str(record), "--accelerator", "cpu", "--max-epochs", "1", "--no-progress-bar",
                 "--default-root-dir", str(tmp_path / "runs"))
    assert_ok(result)
    frozen, collected = record.read_text().split()
    assert int(frozen) > 10_000 and collected == "True", (frozen, collected)


def test_resume_from_last_continues_in_the_same_run_folder(runs, trained_run, checkpoint_runs):
    result = runs["resume"]
    assert_ok(result)
    assert math.isfinite(final_val_loss(result.stdout))
    case = checkpoint_runs["resume"]
    # It ran the third epoch only, counting steps on from the checkpoint's.
    steps = [tuple(map(int, line.split())) for line in case.record.read_text().splitlines()]
    assert steps == [(2, b, 2 * BATCHES_PER_EPOCH + b) for b in range(BATCHES_PER_EPOCH)]
    root = case.root
    assert sorted(p.name for p in root.iterdir()) == ["version_0"]
    last = root / "version_0" / "checkpoints" / "last.ckpt"
    assert last.read_bytes() != trained_run.last_bytes
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["loop"]["epoch"] == 3
    assert checkpoint["loop"]["global_step"] == 3 * BATCHES_PER_EPOCH


@pytest.mark.campaign(sample=3)
@pytest.mark.parametrize("kind", list(BAD_CHECKPOINTS))
def test_unusable_checkpoint_is_a_usage_error_and_leaves_the_run_alone(kind, runs, trained_run,
                                                                       checkpoint_runs):
    """Missing, truncated, random bytes, a foreign torch file, a file that needs arbitrary
    unpickling: exit 2 with a message, and no file of the run changes (last.ckpt included). The
    progress bar is off; the next test runs with the default callbacks."""
    case = checkpoint_runs[kind]
    assert_usage_error(runs[f"bad-{kind}"], str(case.bad), *BAD_CHECKPOINTS[kind])
    assert tree_digest(case.root) == case.before
    assert (case.root / "version_0" / "checkpoints" / "last.ckpt").read_bytes() \
        == trained_run.last_bytes


def test_random_bytes_are_reported_as_corrupt_not_as_unsafe(runs, checkpoint_runs):
    message = assert_usage_error(runs["bad-random-bytes"], "corrupt")
    assert "arbitrary" not in message and "weights_only" not in message


def test_missing_checkpoint_with_default_callbacks_is_a_usage_error(runs, checkpoint_runs):
    case = checkpoint_runs["missing-default-callbacks"]
    assert_usage_error(runs["missing-default-callbacks"], str(case.bad), "does not exist")
    assert tree_digest(case.root) == case.before


def test_nan_loss_stops_with_the_batch_and_keeps_a_good_checkpoint(runs):
    message = assert_usage_error(runs["nan"], f"batch {NAN_FROM}")
    assert "nan" in message.lower()
    last = runs.dirs["nan"] / "runs" / "version_0" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    checkpoint = torch.load(last, weights_only=True)
    params = checkpoint["model"]
    assert params, "the checkpoint holds no parameters"
    for name, tensor in params.items():
        assert torch.isfinite(tensor).all(), name
    # Checkpoints every step: the one kept is from the step just before the NaN batch.
    assert checkpoint["loop"]["global_step"] == NAN_FROM


# ---------------------------------------------------------------------------------------------
# Unknown names and flags


@pytest.mark.campaign(sample=3)
@pytest.mark.parametrize("flag,kind,typed,intended", UNKNOWN_PLUGINS,
                         ids=[case[2] for case in UNKNOWN_PLUGINS])
def test_unknown_plugin_name(flag, kind, typed, intended, runs):
    message = assert_usage_error(runs[f"unknown-{typed}"], f"'{typed}'", kind)
    installed = installed_names(kind)
    assert installed
    for name in installed:
        assert name in message, f"installed {kind} {name!r} is not listed"
    if intended in installed:
        assert f"Did you mean '{intended}'?" in message
    assert not (runs.dirs[f"unknown-{typed}"] / "runs").exists()


def test_mistyped_core_flag_suggests_the_closest(runs):
    assert_usage_error(runs["max-epoch"], "--max-epoch", "Did you mean '--max-epochs'?")


def test_mistyped_option_of_an_active_plugin_suggests_the_closest(runs):
    message = assert_usage_error(runs["checkpoint-typo"], "--checkpoint-every-n-epoch",
                                 "Did you mean '--checkpoint-every-n-epochs'?")
    assert "not part of this run" not in message


def test_option_of_a_plugin_outside_the_run_says_how_to_enable_it(runs):
    assert_usage_error(runs["blocked-option"], "--checkpoint-every-n-epochs", "'checkpoint'")
    assert not any(runs.dirs["flags"].iterdir())


# ---------------------------------------------------------------------------------------------
# --model


@pytest.mark.campaign(sample=3)
@pytest.mark.parametrize("key", list(BAD_MODELS))
def test_bad_model_is_a_usage_error(key, runs):
    assert_usage_error(runs[f"model-{key}"], *BAD_MODELS[key][1])
    assert not (runs.dirs[f"model-{key}"] / "runs").exists()


# ---------------------------------------------------------------------------------------------
# Config file


def test_print_config_shows_plugin_options_and_does_not_train(runs):
    result = runs["from-file"]
    assert_ok(result)
    config = tomllib.loads(result.stdout)
    checkpoint = config["plugins"]["checkpoint"]
    assert checkpoint["every_n_epochs"] == 2
    assert checkpoint["every_n_train_steps"] == 0
    assert checkpoint["mode"] == "min"
    assert "refresh_rate" in config["plugins"]["progress-bar"]
    assert not config["plugins"].get("tensorboard")  # blocked in the file
    assert config["trainer"]["max_epochs"] == 3
    assert config["trainer"]["seed"] == 7
    assert config["trainer"]["callbacks"] == ["no:tensorboard"]
    assert config["model"] == {"class_path": TINY, "init_args": {"lr": 0.05, "batch_size": 16}}
    assert not (runs.dirs["config"] / "runs").exists(), "--print-config trained"
    assert "val_loss" not in result.stdout


def test_config_file_gives_the_same_settings_as_flags(runs):
    assert_ok(runs["from-flags"])
    assert tomllib.loads(runs["from-file"].stdout) == tomllib.loads(runs["from-flags"].stdout)


def test_flags_override_the_config_file_and_the_output_reads_back(runs, tmp_path):
    result = runs["overridden"]
    assert_ok(result)
    overridden = tomllib.loads(result.stdout)
    from_file = tomllib.loads(runs["from-file"].stdout)
    assert overridden["trainer"]["max_epochs"] == 5
    assert overridden["plugins"]["checkpoint"]["every_n_epochs"] == 4
    assert overridden["model"]["init_args"] == {"lr": 0.2, "batch_size": 16}
    # Everything not overridden is as in the file.
    for table in (overridden, from_file):
        table["trainer"].pop("max_epochs")
        table["plugins"]["checkpoint"].pop("every_n_epochs")
        table["model"]["init_args"].pop("lr")
    assert overridden == from_file
    # What --print-config prints is itself a config file giving the same configuration.
    printed = tmp_path / "printed.toml"
    printed.write_text(result.stdout)
    again = run_cli("fit", "--config", str(printed), "--print-config")
    assert_ok(again)
    assert again.stdout == result.stdout


@pytest.mark.campaign(sample=3)
@pytest.mark.parametrize("key", list(BAD_CONFIGS))
def test_bad_config_file_is_a_usage_error(key, runs):
    folder = runs.dirs[f"config-{key}"]
    needles = [n.format(file=folder / "bad.toml") for n in BAD_CONFIGS[key][1]]
    assert_usage_error(runs[f"config-{key}"], *needles)
    assert not (folder / "runs").exists()


@pytest.mark.parametrize("argv, needles", [
    (["plugins", "--chek"], ["unknown option --chek.", "Did you mean '--check'?",
                             "`ptrain plugins --help`"]),
    (["plugins", "--jsn"], ["Did you mean '--json'?", "`ptrain plugins --help`"]),
    (["plugins", "--kind", "nonsense"], ["unknown option --kind.", "`ptrain plugins --help`"]),
    (["export", "a.ckpt", "--outptu", "m.safetensors"],  # before "--output is required"
     ["unknown option --outptu.", "Did you mean '--output'?", "`ptrain export --help`"]),
    (["new-plugin", "demo", "--kidn", "callback"],
     ["unknown option --kidn.", "Did you mean '--kind'?", "`ptrain new-plugin --help`"]),
    (["--versoin"], ["unknown option --versoin.", "Did you mean '--version'?", "`ptrain --help`"]),
    (["tune", "--tune-budet", "10m"], ["unknown option --tune-budet.",
                                       "Did you mean '--tune-budget'?", "`ptrain tune --help`"]),
])
def test_every_command_names_the_option_a_mistyped_one_was_meant_to_be(argv, needles, capsys):
    """One mechanism for every command: an unknown option is refused with exit 2, naming the
    closest known one and the command's own --help (``ptrain plugins --chek`` said only
    "unrecognized arguments" and pointed to ``ptrain --help``)."""
    from ptrain.cli import main

    assert main(argv) == 2
    message = capsys.readouterr().err
    assert message.startswith("ptrain: error:") and "Traceback" not in message
    for needle in needles:
        assert needle in message, message


COMMANDS = "fit, validate, test, predict, tune, example, plugins, new-plugin, export"


@pytest.mark.parametrize("argv, suggestion", [
    (["plugns"], " Did you mean 'plugins'?"),
    (["fitt", "--max-epochs", "1"], " Did you mean 'fit'?"),
    (["--version", "exprot"], " Did you mean 'export'?"),
    (["train"], ""),  # nothing close: the commands alone
])
def test_a_mistyped_command_names_the_command_it_was_meant_to_be(argv, suggestion, capsys):
    """As a mistyped option does: exit 2, the closest command, and every command (``ptrain
    plugns`` listed argparse's "invalid choice" and the commands, without a suggestion)."""
    from ptrain.cli import main

    assert main(argv) == 2
    message = capsys.readouterr().err
    typed = next(a for a in argv if not a.startswith("-"))
    assert message == (f"ptrain: error: unknown command {typed!r}.{suggestion} Run `ptrain "
                       f"--help` for the commands: {COMMANDS}.\n")


@pytest.mark.parametrize("form", [["--config", "mine.toml"], ["--config=mine.toml"]])
def test_example_with_a_config_of_ones_own_says_files_are_not_layered(form, tmp_path,
                                                                       monkeypatch, capsys):
    """``ptrain example digits --config mine.toml``: the last --config won, so the example's
    config (its model included) was replaced and the run failed with "no model given". A run
    reads one config file; the message says so and how to start one's own from the
    example's."""
    from ptrain.cli import main

    (tmp_path / "mine.toml").write_text("[trainer]\nmax_epochs = 1\n")
    monkeypatch.chdir(tmp_path)
    assert main(["example", "digits", *form]) == 2
    message = capsys.readouterr().err
    assert "no model given" not in message
    assert "--config mine.toml would replace it, model included (config files are not " \
           "layered)" in message
    assert "`ptrain example digits --print-config > digits.toml`" in message
    assert "`ptrain fit --config digits.toml`" in message


# ---------------------------------------------------------------------------------------------
# --version, --help


def test_version_lists_the_core(cli):
    result = cli("--version")
    assert_ok(result)
    assert f"ptrain-core {metadata.version('ptrain-core')}" in result.stdout.splitlines()


def test_top_level_help(cli):
    result = cli("--help")
    assert_ok(result)
    for command in ("fit", "validate", "plugins", "export", "--version"):
        assert command in result.stdout


def test_fit_help_shows_trainer_options_and_plugin_groups(runs):
    result = runs["fit-help"]
    assert_ok(result)
    out = result.stdout
    assert "trainer options" in out
    for flag in ("--max-epochs", "--accelerator", "--strategy", "--precision", "--config",
                 "--ckpt-path", "--print-config", "--seed", "-p NAME"):
        assert flag in out, flag
    assert "checkpoint (callback, ptrain-core)" in out
    assert "--checkpoint-every-n-epochs" in out
    assert "progress-bar (callback, ptrain-core)" in out
    assert "model-summary (callback, ptrain-core)" in out and "--model-summary-max-depth" in out


def test_fit_help_shows_only_the_selected_plugins_options(runs):
    """--help: the core's options and the selected plugins'; --help-all: every installed one."""
    plain, with_ddp, every = (runs[k].stdout for k in ("fit-help", "fit-help-ddp", "fit-help-all"))
    assert "--ddp-stall-timeout" not in plain and "--help-all" in plain
    assert "ddp (strategy, ptrain-ddp)" in with_ddp and "--ddp-stall-timeout" in with_ddp
    assert "--fsdp-cpu-offload" not in with_ddp
    for flag in ("--ddp-stall-timeout", "--fsdp-cpu-offload", "--early-stopping-patience"):
        assert flag in every, flag
    assert len(plain.splitlines()) < len(every.splitlines()) / 2


# ---------------------------------------------------------------------------------------------
# Python API


def test_options_for_a_plugin_outside_the_run_raise_config_error(make_trainer):
    with pytest.raises(ptrain.ConfigError, match="'nope'"):
        make_trainer(plugin_options={"nope": {"value": 1}})


def test_unknown_option_of_an_active_plugin_raises_config_error(make_trainer):
    with pytest.raises(ptrain.ConfigError, match="Did you mean 'every_n_epochs'"):
        make_trainer(plugin_options={"checkpoint": {"every_n_epoch": 2}})


LOCAL_CALLBACKS = '''
import json
from pathlib import Path

import ptrain


class EpochLog:  # Lightning's method names, no @hookimpl, not packaged
    def __init__(self):
        self.epochs = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.epochs.append(trainer.current_epoch)

    def on_fit_end(self, trainer, pl_module):
        Path("epochs.json").write_text(json.dumps(self.epochs))


class StepCount:  # a ptrain plugin with an option, not packaged
    def __init__(self, out: str = "steps.txt"):
        self.out = out

    @staticmethod
    @ptrain.hookimpl
    def add_options(options):
        options.add("out", str, default="steps.txt", help="where to write the step count")

    @ptrain.hookimpl
    def teardown(self, trainer):
        Path(self.out).write_text(str(trainer.global_step))


class Mixed:  # a ptrain hook and a Lightning method on a plain object: refused
    @ptrain.hookimpl
    def teardown(self, trainer):
        pass

    def on_train_epoch_end(self, trainer, pl_module):
        pass
'''


def test_p_module_class_loads_a_local_callback_without_packaging_it(tmp_path):
    from conftest import REPO

    (tmp_path / "my_callbacks.py").write_text(LOCAL_CALLBACKS)
    result = run_cli("fit", *MODEL, "--max-epochs", "2", "--default-root-dir", "runs",
                     "-p", "my_callbacks:EpochLog", "-p", "my_callbacks:StepCount",
                     "--step-count-out", "counted.txt", "-p", "no:progress-bar",
                     cwd=tmp_path, env={"PYTHONPATH": str(REPO)})
    assert_ok(result)
    assert (tmp_path / "epochs.json").read_text() == "[0, 1]"
    assert (tmp_path / "counted.txt").read_text() == "16"
    missing = run_cli("fit", *MODEL, "-p", "my_callbacks:Nope", cwd=tmp_path,
                      env={"PYTHONPATH": str(REPO)})
    assert_usage_error(missing, "my_callbacks:Nope", "could not be imported")
    # (the PYTHONPATH given kept, so that a clone's core is the one refusing)
    mixed = run_cli("fit", *MODEL, "-p", "my_callbacks:Mixed", cwd=tmp_path,
                    env={"PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [
                        os.environ.get("PYTHONPATH")])])})
    assert_usage_error(mixed, "Mixed.on_train_epoch_end", "ptrain.lightning.Callback")


IMPORT_FAILURES = {  # module text, -p value, what the message says, what it must not say
    "raises": ("import ptrain\n\nclass C:\n    @ptrain.hookimpl(try_first=True)\n"
               "    def teardown(self, trainer):\n        pass\n", "C",
               r"importing '{mod}' raised TypeError: .*'try_first' \(at .*{mod}\.py:4\)\. "
               r"Fix the error there\.$", "Check the"),
    "missing-dependency": ("import no_such_dependency_xyz\n", "C",
                           r"importing '{mod}' raised ModuleNotFoundError: No module named "
                           r"'no_such_dependency_xyz' \(at .*{mod}\.py:1\)", "Check the"),
    "syntax": ("def f(:\n", "C", r"raised SyntaxError: .* \(at .*{mod}\.py:1\)", "Check the"),
    "no-class": ("class C:\n    pass\n", "Nope",
                 r"could not be imported: AttributeError: .*'Nope'\. Check the class name\.$",
                 "raised"),
}


@pytest.mark.parametrize("case", IMPORT_FAILURES)
def test_p_module_that_raises_on_import_is_said_not_a_wrong_path(case, tmp_path, monkeypatch):
    """A module that was found but raised while importing (a typo in @ptrain.hookimpl's
    arguments) was "could not be imported ... Check the module path and the class name"; only
    a missing module or class gets that advice."""
    from ptrain.loading import import_object

    text, attribute, said, not_said = IMPORT_FAILURES[case]
    mod = f"probe_{case.replace('-', '_')}"
    (tmp_path / f"{mod}.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ptrain.PluginError) as raised:
        import_object(f"{mod}:{attribute}", "callback", ptrain.PluginError, "-p m:C")
    message = str(raised.value)
    assert re.search(said.format(mod=mod), message), message
    assert not_said not in message
    with pytest.raises(ptrain.PluginError, match=r"could not be imported: ModuleNotFoundError: "
                                                 r"No module named 'no_such_probe'\. Check the "
                                                 r"module path"):
        import_object("no_such_probe:C", "callback", ptrain.PluginError, "-p m:C")


def test_a_warning_is_one_sentence_once(tmp_path):
    """A warning during a CLI run is one ``ptrain: warning:`` line (no file, line number,
    category or echoed source line)."""
    result = run_cli("fit", "--model", TINY, "--model.shuffle", "true", "--overfit-batches", "2",
                     "--max-epochs", "1", "--accelerator", "cpu", "-p", "no:progress-bar",
                     "-p", "no:model-summary", "--default-root-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ["ptrain: warning: overfit_batches: the training dataloader shuffles; it is "
                     "read in order instead, so that every epoch trains on the same batches."], \
        result.stderr


def test_the_same_warning_is_printed_once_per_process(capsys):
    import warnings

    from ptrain.cli import _warnings_as_sentences

    with warnings.catch_warnings():
        warnings.simplefilter("always")  # Python itself would show each of these
        with _warnings_as_sentences():
            for _ in range(3):
                warnings.warn("a plugin is broken:\n  it says so", UserWarning)
            warnings.warn("something else", DeprecationWarning)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines  # once each, one line each
    # raised here, outside ptrain: the line names this test module as the source
    assert lines[0].startswith("ptrain: warning from ") and lines[0].endswith(
        "test_cli: a plugin is broken: it says so"), lines
    assert lines[1].endswith(": something else"), lines


DEFAULT_WIDTH_MODELS = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ptrain


class Net(ptrain.TrainModule):
    saves = True

    def __init__(self, width: int = WIDTH, lr: float = 0.1):
        super().__init__()
        if self.saves:
            self.save_hyperparameters()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(4, width), nn.Linear(width, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def _loader(self):
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)

    def train_dataloader(self):
        return self._loader()

    val_dataloader = predict_dataloader = train_dataloader


class Unsaved(Net):
    saves = False
'''


def test_a_model_rebuilt_from_its_checkpoint_takes_the_saved_hyperparameters(tmp_path):
    """validate/predict --ckpt-path without --model build the model with the hyperparameters
    the checkpoint saved (as load_from_checkpoint does), not with a default changed since the
    run; a model that saved none is still refused, naming why."""
    quiet = ["--accelerator", "cpu", "-p", "no:progress-bar", "-p", "no:model-summary"]
    source = tmp_path / "widthmodels.py"
    source.write_text(DEFAULT_WIDTH_MODELS.replace("WIDTH", "4"))
    fits = {}
    for name in ("Net", "Unsaved"):
        fits[name] = run_cli("fit", "--model", f"widthmodels:{name}", "--model.lr", "0.05",
                             "--max-epochs", "1", "--default-root-dir", name, *quiet,
                             cwd=tmp_path)
        assert_ok(fits[name])
    source.write_text(DEFAULT_WIDTH_MODELS.replace("WIDTH", "6"))  # the default changed since

    def rebuilt(stage, name):
        return run_cli(stage, "--ckpt-path", f"{name}/version_0/checkpoints/last.ckpt", *quiet,
                       cwd=tmp_path)

    validated = rebuilt("validate", "Net")
    assert_ok(validated)
    assert final_val_loss(validated.stdout) == final_val_loss(fits["Net"].stdout)
    predicted = rebuilt("predict", "Net")
    assert_ok(predicted)
    written = next((tmp_path / "Net").rglob("predictions.pt"))
    assert [p.shape for p in torch.load(written, weights_only=True)] == [(4, 1)] * 4
    assert_usage_error(rebuilt("validate", "Unsaved"), "does not fit this model (Unsaved)",
                       "It was written by --model widthmodels:Unsaved --model.lr 0.05",
                       "the model's code or its defaults have changed since")
