"""Inputs from the model and data side that must be named, not crashed on or accepted silently
(issue 21): each is a one-paragraph usage error from ``ptrain fit``/``validate`` (exit 2) naming
the method or value; a user's own exception shows the user's traceback headed by one line that
says which of the user's functions raised. The modules are ``tests/_input_models.py``; every
case is a real ``ptrain`` process."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import ptrain

from conftest import run_cli
from tests._cli_util import assert_usage_error

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
COMMON = ["--accelerator", "cpu", "-p", "no:progress-bar", "-p", "no:model-summary"]

#: name -> (argv after the stage, the words the message must hold)
MODEL_CASES = {
    "none-every-batch": (["fit", "--model", "tests._input_models:ReturnsNone"],
                         ["ReturnsNone.training_step returned None for all 4 batches",
                          "nothing was trained"]),
    "float-loss": (["fit", "--model", "tests._input_models:FloatLoss"],
                   ["FloatLoss.training_step returned float", "as a tensor"]),
    "vector-loss": (["fit", "--model", "tests._input_models:VectorLoss"],
                    ["a loss of shape (4, 1)", "one number"]),
    "detached-loss": (["fit", "--model", "tests._input_models:DetachedLoss"],
                      ["not connected to the model's parameters", "torch.no_grad()"]),
    "integer-loss": (["fit", "--model", "tests._input_models:IntegerLoss"],
                     ["dtype torch.int64", "floating point"]),
    "dict-without-loss": (["fit", "--model", "tests._input_models:DictWithoutLoss"],
                          ["a dict without 'loss'", "'total'"]),
    "log-a-vector": (["fit", "--model", "tests._input_models:LogsAVector"],
                     ["self.log('per_sample'", "shape (4,)"]),
    "foreign-optimizer": (["fit", "--model", "tests._input_models:ForeignOptimizer"],
                          ["optimizer 0 (SGD)", "not the module's", "self.parameters()"]),
    "optimizer-over-an-unused-submodule": (
        ["fit", "--model", "tests._input_models:UnusedHead"],
        ["optimizer 0 (SGD) holds 2 trainable parameter(s) of UnusedHead (head.weight, "
         "head.bias)", "none of them got a gradient", "self.parameters()", "Nothing would train"]),
    "no-trainable-parameters": (["fit", "--model", "tests._input_models:Frozen"],
                                ["Frozen has no trainable parameters", "requires_grad"]),
    "no-training-step": (["fit", "--model", "tests._input_models:NoTrainingStep"],
                         ["NoTrainingStep has no training_step"]),
    "no-configure-optimizers": (["fit", "--model", "tests._input_models:NoConfigureOptimizers"],
                                ["NoConfigureOptimizers has no configure_optimizers(self)",
                                 "implement it", "has configure_optimizer(): a typo"]),
    "loader-not-iterable": (["fit", "--model", "tests._input_models:NotIterableLoader"],
                            ["NotIterableLoader.train_dataloader() returned int 42"]),
    "empty-validation-loader": (["fit", "--model", "tests._input_models:EmptyValidation"],
                                ["EmptyValidation.val_dataloader() gives no batches",
                                 "--limit-val-batches 0"]),
    "validate-without-validation": (["validate", "--model",
                                     "tests._input_models:NoValidationData"],
                                    ["has no validation data", "val_dataloader()"]),
    "validate-without-validation-step": (["validate", "--model",
                                          "tests._input_models:NoTrainingStep"],
                                         ["has no validation_step(self, batch, batch_idx)"]),
}
BASE = ["fit", "--model", "tests._input_models:Base"]
FLAG_CASES = {
    "max-epochs-below-minus-one": (BASE + ["--max-epochs", "-2"], ["max_epochs=-2", "-1 for no"]),
    "min-epochs-above-max": (BASE + ["--min-epochs", "5", "--max-epochs", "2"],
                             ["min_epochs=5 is above max_epochs=2"]),
    "min-steps-above-max": (BASE + ["--min-steps", "10", "--max-steps", "3"],
                            ["min_steps=10 is above max_steps=3"]),
    "val-check-interval-fraction-above-one": (BASE + ["--val-check-interval", "1.5"],
                                              ["val_check_interval=1.5", "fraction <= 1.0"]),
    "empty-ckpt-path": (BASE + ["--ckpt-path="], ["ckpt_path is empty"]),
    "seed-too-large": (BASE + ["--seed", "99999999999999999999"],
                       ["a seed must be from 0 to 9223372036854775807"]),
    # the top of torch's range: a distributed sampler's seed + epoch would overflow
    "seed-at-torchs-limit": (BASE + ["--seed", "18446744073709551615"],
                             ["a seed must be from 0 to 9223372036854775807", "epoch"]),
    "cpu-device-indices": (BASE + ["--devices", "[5]"],
                           ["--devices [5] names device indices", "--devices 1"]),
    "nan-gradient-clip": (BASE + ["--gradient-clip-val", "nan"],
                          ["--gradient-clip-val", "positive number", "'nan'"]),
    "required-plugin-option": (BASE + ["-p", "early-stopping"],
                               ["--early-stopping-monitor", "is required and was not given:",
                                "e.g. val_loss"]),
}
USER_ERRORS = {
    "in-init": ("RaisesInInit", "ValueError in __init__ (_input_models.py:"),
    "in-dataset": ("RaisesInDataset", "KeyError in __getitem__ (_input_models.py:"),
    "in-validation-step": ("RaisesInValidationStep",
                           "RuntimeError in validation_step (_input_models.py:"),
    "in-second-epoch": ("RaisesInSecondEpoch",
                        "RuntimeError in training_step (_input_models.py:"),
    "in-dataloader-worker": ("RaisesInDataLoaderWorker",
                             "KeyError in __getitem__ (_input_models.py:"),
}


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    """Each case's CLI result, run two at a time; only the cases this run selected."""
    selected = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.module is request.module and callspec is not None and "name" in callspec.params:
            selected.add(callspec.params["name"])
    root = tmp_path_factory.mktemp("bad-inputs")
    argvs = {name: [*argv, *COMMON, "--max-epochs", "1", "--default-root-dir", str(root)]
             if "--max-epochs" not in argv else [*argv, *COMMON, "--default-root-dir", str(root)]
             for name, (argv, _) in {**MODEL_CASES, **FLAG_CASES}.items() if name in selected}
    for name, (cls, _) in USER_ERRORS.items():
        if name in selected:
            argvs[name] = ["fit", "--model", f"tests._input_models:{cls}", *COMMON,
                           "--max-epochs", "2", "--default-root-dir", str(root / name)]
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(run_cli, *argv) for name, argv in argvs.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.campaign(sample=8)
@pytest.mark.parametrize("name", list(MODEL_CASES) + list(FLAG_CASES))
def test_a_bad_input_is_a_one_paragraph_usage_error(results, name):
    needles = {**MODEL_CASES, **FLAG_CASES}[name][1]
    message = assert_usage_error(results[name], *needles)
    assert message.strip().count("\n") == 0, message  # one paragraph


@pytest.mark.parametrize("name", list(USER_ERRORS))
def test_a_users_exception_is_headed_by_the_function_that_raised(results, name):
    result = results[name]
    _, where = USER_ERRORS[name]
    assert result.returncode == 1, result.stderr
    first, *rest = result.stderr.splitlines()
    assert first.startswith("ptrain: your code raised ") and where in first, result.stderr
    if name == "in-dataloader-worker":  # torch passed the worker's traceback on as text
        assert ") in DataLoader worker process " in first, first
    # only a fit that wrote a checkpoint before failing points to one
    if name == "in-second-epoch":
        assert "Checkpoints saved so far are intact: resume with --ckpt-path last (" in first
        assert "last.ckpt)" in first
    else:
        assert "Checkpoints" not in first, first
    assert rest[0] == "Traceback (most recent call last):", result.stderr  # the user's, whole
    assert "_input_models.py" in result.stderr


def test_a_crashed_dataloader_worker_is_said_with_the_way_to_see_where(tmp_path):
    """A worker that dies without a Python error (a native fault, the OOM killer): torch can
    only say it died, so its traceback (the loader's machinery) is left out; one paragraph says
    what could have died and how to find it."""
    result = run_cli("fit", "--model", "tests._input_models:CrashesInDataLoaderWorker", *COMMON,
                     "--max-epochs", "1", "--default-root-dir", str(tmp_path))
    assert result.returncode == 1, result.stderr
    # torch's worker prints its own line first ("Unexpected segmentation fault ..."), ended
    # by a NUL byte; nothing else but ours
    lines = [line.strip("\x00 ") for line in result.stderr.splitlines() if line.strip("\x00 ")]
    ours = [line for line in lines if "ptrain:" in line]
    assert len(ours) == 1 and len(lines) <= 2, result.stderr
    assert ours[0].startswith("ptrain: error: a DataLoader worker process died"), ours
    assert "num_workers=0" in ours[0] and "Traceback" not in result.stderr, result.stderr



class WorkerDeathInTeardown:
    """A plugin whose teardown raises what torch raises when a DataLoader worker died."""

    name = "worker-death-in-teardown"

    @ptrain.hookimpl
    def teardown(self):
        raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")


def test_a_worker_death_in_teardown_is_said_when_the_stage_failed_for_another_reason(tmp_path):
    """Only a stage that failed because a worker died may leave torch's second word of that
    death unsaid: after any other failure it is news, and is said."""
    from tests.conftest import TinyRegressor

    class FailsAtOnce(TinyRegressor):
        def training_step(self, batch, batch_idx):
            raise ValueError("the step's own bug")

    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path),
                             callbacks=["no:progress-bar", "no:tensorboard",
                                        WorkerDeathInTeardown()])
    with pytest.warns(UserWarning, match="worker-death-in-teardown.*DataLoader worker"), \
            pytest.raises(ValueError, match="the step's own bug"):
        trainer.fit(FailsAtOnce())

def test_max_epochs_minus_one_means_no_epoch_limit(tmp_path):
    result = run_cli(*BASE, *COMMON, "--max-epochs", "-1", "--max-steps", "9",
                     "--default-root-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    import torch

    last = torch.load(tmp_path / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["loop"]["global_step"] == 9  # 4 batches per epoch: past two epochs


class Exploding:
    """A plugin whose hook raises (as a buggy third-party plugin would)."""

    name = "exploding"

    @ptrain.hookimpl(specname="on_epoch_end")
    def _end(self, trainer):
        raise RuntimeError("the plugin's own bug")


def test_a_plugins_exception_is_attributed_to_the_plugin_and_its_hook(tmp_path):
    from ptrain.frames import plugin_origin, user_code_origin

    from tests.conftest import TinyRegressor

    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path),
                             callbacks=[Exploding(), "no:progress-bar"])
    with pytest.raises(RuntimeError) as info:
        trainer.fit(TinyRegressor())
    origin = plugin_origin(info.value)
    assert origin == (f"plugin 'exploding' (module {Exploding.__module__}) raised RuntimeError "
                      f"in its on_epoch_end hook"), origin
    # a plugin in the user's own files (not an installed package) is the user's code
    assert user_code_origin(info.value).startswith("_end (test_bad_inputs.py:")


def test_a_failed_ranks_report_says_whose_code_raised(tmp_path):
    """A rank other than the reporting one fails in a plugin's hook: the launching process gets
    only the record's text, so the rank names the culprit when it writes the record (the report
    said "rank 1 failed ... Its error:" and the traceback, where rank 0's own failure is headed
    "plugin 'NAME' (DISTRIBUTION) raised ... That is the plugin's bug")."""
    from ptrain import rank_errors
    from ptrain.errors import WorkerError

    from tests.conftest import TinyRegressor

    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path),
                             callbacks=[Exploding(), "no:progress-bar"])
    with pytest.raises(RuntimeError) as info:
        trainer.fit(TinyRegressor())
    rank_errors.write_record(tmp_path, info.value, 1)
    error = rank_errors.error_of(rank_errors.read_records(tmp_path)[0])
    assert isinstance(error, WorkerError)
    assert str(error).startswith("rank 1 failed; the other ranks were stopped. Your code raised "
                                 "RuntimeError in _end (test_bad_inputs.py:"), str(error)
    assert "RuntimeError: the plugin's own bug" in str(error)


BROKEN_PLUGIN = """
import ptrain


class Broken:
    @ptrain.hookimpl
    def on_epoch_end(self, trainer):
        raise RuntimeError("the plugin's own bug")
"""


@pytest.mark.parametrize("hook", ["on_epoch_end", "setup", "on_train_batch_end"])
def test_an_installed_plugins_exception_is_headed_by_its_distribution_and_hook(tmp_path, hook):
    """Issue 35: a plugin installed as a distribution (a real .dist-info on the path, found
    through its entry point) raises in a hook: the CLI's line above its traceback names the
    plugin, the distribution with its version, and the hook."""
    site = tmp_path / "site"
    (site / "badplug").mkdir(parents=True)
    (site / "badplug" / "__init__.py").write_text(
        BROKEN_PLUGIN.replace("on_epoch_end(self, trainer)", f"{hook}(self, trainer)"))
    info = site / "badplug-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: badplug\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text("[ptrain.callbacks]\nbadplug = badplug:Broken\n")
    (info / "RECORD").write_text("badplug/__init__.py,,\nbadplug-0.3.dist-info/METADATA,,\n"
                                 "badplug-0.3.dist-info/RECORD,,\n")  # as an installer writes
    result = run_cli(*BASE, *COMMON, "-p", "badplug", "--max-epochs", "1",
                     "--default-root-dir", str(tmp_path / "runs"),
                     env={"PYTHONPATH": f"{site}{os.pathsep}{REPO}"})
    assert result.returncode == 1, result.stderr
    header = [line for line in result.stderr.splitlines() if line.startswith("ptrain:")]
    assert header and header[0].startswith(
        f"ptrain: plugin 'badplug' (badplug 0.3) raised RuntimeError in its {hook} hook; its "
        f"traceback follows. That is the plugin's bug"), result.stderr


def test_a_config_file_may_start_with_a_byte_order_mark(tmp_path):
    config = tmp_path / "run.toml"
    config.write_bytes("\ufeff[trainer]\nmax_epochs = 1\n".encode("utf-8"))
    result = run_cli(*BASE, *COMMON, "--config", str(config), "--default-root-dir",
                     str(tmp_path / "runs"))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("argument,native", [("enable_progress_bar", "no:progress-bar"),
                                             ("enable_model_summary", "no:model-summary"),
                                             ("enable_checkpointing", "no:checkpoint"),
                                             ("logger", "no:tensorboard")])
def test_a_lightning_switch_given_to_the_native_trainer_names_the_native_way(argument, native):
    with pytest.raises(ptrain.ConfigError) as caught:
        ptrain.Trainer(**{argument: False})
    message = str(caught.value)
    assert f"unknown option {argument!r}" in message and f'callbacks=["{native}"]' in message
    assert "ptrain.lightning.Trainer" in message
    # what it says works
    trainer = ptrain.Trainer(callbacks=[native])
    assert native.removeprefix("no:") not in trainer.plugins
