"""LightningCLI programs under ptrain, against Lightning 2.6.6's own LightningCLI.

tests/lightning_cli_programs/regression.py is a Lightning program that starts with
``LightningCLI``. Each test runs it as a real process twice, with the same YAML config and
command line: as written, under Lightning, and with ``lightning.pytorch`` replaced by
``ptrain.lightning`` in its import lines and nothing else. What the two print and end with must
match: the printed config (less the differences by design, :data:`BY_DESIGN`), the trained
weights, the metrics, the saved ``config.yaml`` in the run folder, the exit code 2 for bad input.
A class path in a config or on the command line counts as an import: it names each framework's
own class where the program does (``lightning.pytorch.cli.ReduceLROnPlateau``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning", reason="the oracle: pip install lightning==2.6.6 (dev extra)")
pytest.importorskip("jsonargparse", reason='the cli extra: pip install "ptrain-core[cli]"')
import yaml  # noqa: E402  (jsonargparse's YAML library)

#: Each test runs the program under both frameworks (seconds each): the default run draws eight.
pytestmark = [pytest.mark.slow, pytest.mark.campaign(family="LightningCLI programs", sample=8)]

PROGRAM = Path(__file__).parent / "lightning_cli_programs" / "regression.py"
IMPORT_LINE = re.compile(r"^(\s*(?:import|from)\s+)(lightning\.pytorch|pytorch_lightning)\b",
                         re.MULTILINE)
NAMESPACE = {"lightning": "lightning.pytorch", "ptrain": "ptrain.lightning"}

#: Where the printed config differs by design (docs/from-lightning.md, "LightningCLI"): the
#: trainer group has ptrain's ``plugin_options`` (each plugin's options, from the config). The
#: header comment names the framework.
BY_DESIGN = {"ptrain": [("trainer", "plugin_options")], "lightning": []}

CONFIG = """\
seed_everything: 42
trainer:
  max_epochs: 2
  enable_progress_bar: false
  enable_model_summary: false
  callbacks:
    - class_path: __main__.Recorder
      init_args:
        label: from_config
model:
  hidden: 6
data:
  batch_size: 8
optimizer:
  class_path: torch.optim.SGD
  init_args:
    lr: 0.1
    momentum: 0.9
lr_scheduler:
  class_path: torch.optim.lr_scheduler.StepLR
  init_args:
    step_size: 1
    gamma: 0.5
"""
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def ported(source: str) -> str:
    """``source`` with only its import lines switched to ``ptrain.lightning``."""
    return IMPORT_LINE.sub(r"\1ptrain.lightning", source)


class Program:
    """The program in a folder of its own, as written or ported, with config.yaml beside it."""

    def __init__(self, folder: Path, framework: str):
        self.folder, self.framework = folder, framework
        folder.mkdir(parents=True, exist_ok=True)
        source = PROGRAM.read_text()
        (folder / PROGRAM.name).write_text(source if framework == "lightning" else ported(source))
        (folder / "config.yaml").write_text(CONFIG)
        self.runs = 0

    def run(self, *args: str, mode: str = "plain", env: dict[str, str] | None = None,
            rc: int = 0) -> tuple[subprocess.CompletedProcess, dict | None]:
        self.runs += 1
        result_file = self.folder / f"result-{self.runs}.json"
        environment = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1",
                       "CLI_MODE": mode, "RESULT_FILE": str(result_file), **(env or {})}
        environment.pop("PTRAIN_TRACE", None)
        args = [a.replace("{ns}", NAMESPACE[self.framework]) for a in args]
        done = subprocess.run([sys.executable, PROGRAM.name, *args], cwd=self.folder,
                              env=environment, capture_output=True, text=True, timeout=900)
        assert done.returncode == rc, f"{self.framework} {args}: exit {done.returncode}\n" \
                                      f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        result = json.loads(result_file.read_text()) if result_file.exists() else None
        return done, result


def without_by_design(config: dict, framework: str) -> dict:
    """``config`` less the keys :data:`BY_DESIGN` lists for ``framework``; each must be there
    (so the list stays true)."""
    config = json.loads(json.dumps(config))
    for path in BY_DESIGN[framework]:
        part = config
        for key in path[:-1]:
            part = part[key]
        assert path[-1] in part, f"{framework}'s config has no {'.'.join(path)}"
        del part[path[-1]]
    return config


def same_config(lightning_text: str, ptrain_text: str, *, skipped_nulls: bool = False) -> None:
    lightning, ptrain = yaml.safe_load(lightning_text), yaml.safe_load(ptrain_text)
    if not skipped_nulls:
        lightning, ptrain = without_by_design(lightning, "lightning"), \
            without_by_design(ptrain, "ptrain")
    assert ptrain == lightning
    assert lightning_text.startswith("# lightning.pytorch==2.6.6")
    assert ptrain_text.startswith("# ptrain.lightning==2.6.6 (ptrain-core==")


def without_instantiator(hparams: dict) -> dict:
    """Lightning's CLI adds ``_instantiator`` to the hyperparameters (see the docs)."""
    return {k: v for k, v in hparams.items() if k != "_instantiator"}


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    where = tmp_path_factory.mktemp("cli")
    return {name: Program(where / name, name) for name in NAMESPACE}


def both(programs, *args, **kwargs) -> dict[str, tuple[subprocess.CompletedProcess, dict]]:
    return {name: program.run(*args, **kwargs) for name, program in programs.items()}


# -- --print_config -------------------------------------------------------------------------

def test_print_config_with_config_file_and_overrides_is_lightnings(programs):
    runs = both(programs, "fit", "--config", "config.yaml", "--trainer.max_epochs=3",
                "--model.hidden=5", "--trainer.callbacks+=Recorder",
                "--trainer.callbacks.label=from_command_line", "--print_config")
    lightning, ptrain = runs["lightning"][0].stdout, runs["ptrain"][0].stdout
    same_config(lightning, ptrain)
    printed = yaml.safe_load(ptrain)
    assert printed["trainer"]["max_epochs"] == 3 and printed["model"]["hidden"] == 5
    assert [c["init_args"]["label"] for c in printed["trainer"]["callbacks"]] == \
        ["from_config", "from_command_line"]
    assert printed["optimizer"]["class_path"] == "torch.optim.SGD"
    assert runs["ptrain"][1] is None  # printed, then stopped: nothing ran


def test_print_config_skip_null_is_lightnings(programs):
    runs = both(programs, "test", "--print_config=skip_null")
    same_config(runs["lightning"][0].stdout, runs["ptrain"][0].stdout, skipped_nulls=True)
    assert "null" not in runs["ptrain"][0].stdout


def test_run_false_with_environment_variables_prints_lightnings_config(programs):
    env = {"PL_TRAINER__MAX_EPOCHS": "4", "PL_MODEL__HIDDEN": "3", "PL_DATA__SIZE": "32"}
    runs = both(programs, "--print_config", mode="env", env=env)
    same_config(runs["lightning"][0].stdout, runs["ptrain"][0].stdout)
    printed = yaml.safe_load(runs["ptrain"][0].stdout)
    assert printed["trainer"]["max_epochs"] == 4 and printed["model"]["hidden"] == 3
    assert "optimizer" not in printed  # auto_configure_optimizers=False: no such group


# -- fit and the other subcommands ----------------------------------------------------------

@pytest.fixture(scope="module")
def fitted(programs):
    """Both fit with the YAML config, command-line overrides and an appended callback, the
    optimizer and scheduler configured by the CLI."""
    return both(programs, "fit", "--config", "config.yaml", "--trainer.max_epochs=3",
                "--model.lr=0.2", "--trainer.callbacks+=Recorder",
                "--trainer.callbacks.label=appended")


def test_fit_trains_to_lightnings_weights(fitted):
    (_, lightning), (done, ptrain) = fitted["lightning"], fitted["ptrain"]
    assert ptrain["weights"] == lightning["weights"]
    assert ptrain["global_step"] == lightning["global_step"] == 24
    assert ptrain["current_epoch"] == lightning["current_epoch"] == 3
    assert ptrain["lr"] == lightning["lr"] == [pytest.approx(0.1 * 0.5 ** 3)]  # the StepLR
    assert ptrain["callback_metrics"] == pytest.approx(lightning["callback_metrics"], rel=1e-6)
    assert without_instantiator(lightning["hparams"]) == ptrain["hparams"]
    assert ptrain["config_seed"] == lightning["config_seed"] == 42
    # the model's own configure_optimizers gave way to --optimizer, and the program was told
    assert "configure_optimizers is replaced" in done.stderr


def test_fit_saves_lightnings_config_in_the_run_folder(programs, fitted):
    saved = {name: (programs[name].folder / fitted[name][1]["log_dir"] / "config.yaml")
             for name in programs}
    assert fitted["ptrain"][1]["log_dir"] == os.path.join("lightning_logs", "version_0")
    same_config(saved["lightning"].read_text(), saved["ptrain"].read_text())
    config = yaml.safe_load(saved["ptrain"].read_text())
    assert config["seed_everything"] == 42 and config["model"]["lr"] == 0.2
    assert [c["init_args"]["label"] for c in config["trainer"]["callbacks"]] == \
        ["from_config", "appended"]


def test_the_saved_config_trains_the_same_run_again(programs, fitted):
    ptrain = programs["ptrain"]
    _, again = ptrain.run("fit", "--config",
                          os.path.join(fitted["ptrain"][1]["log_dir"], "config.yaml"))
    assert again["log_dir"] == os.path.join("lightning_logs", "version_1")
    assert again["weights"] == fitted["ptrain"][1]["weights"]


@pytest.mark.parametrize("subcommand", ["validate", "test", "predict"])
def test_subcommands_evaluate_the_fitted_checkpoint_as_lightning(programs, fitted, subcommand):
    # no config: the model's hidden=6 comes from the checkpoint's hyperparameters (the
    # default, 8, would not load its weights)
    runs = {name: programs[name].run(subcommand, "--ckpt_path",
                                     fitted[name][1]["best_model_path"], *QUIET)
            for name in programs}
    (_, lightning), (done, ptrain) = runs["lightning"], runs["ptrain"]
    assert ptrain["callback_metrics"] == pytest.approx(lightning["callback_metrics"], rel=1e-6)
    assert set(ptrain["callback_metrics"]) == {"validate": {"val_loss"}, "test": {"test_loss"},
                                               "predict": set()}[subcommand]
    assert ptrain["predicted"] == pytest.approx(lightning["predicted"], rel=1e-6)
    assert len(ptrain["predicted"]) == (64 if subcommand == "predict" else 0)
    assert ptrain["hparams"]["hidden"] == 6
    # ptrain evaluates a run's checkpoint in that run's folder (Lightning opens a new one):
    # its config.yaml is kept and this stage's config goes beside it, as the warning says
    saved = re.search(r"config is saved as (config-\d+\.yaml)", done.stderr)
    assert saved, done.stderr[-3000:]
    config = yaml.safe_load((programs["ptrain"].folder / ptrain["log_dir"]
                             / saved.group(1)).read_text())
    assert config["ckpt_path"] == fitted["ptrain"][1]["best_model_path"]
    assert config["model"]["hidden"] == 6


def test_run_false_leaves_the_objects_to_the_program(programs):
    runs = both(programs, "--config", "config.yaml", mode="run_false")
    (_, lightning), (_, ptrain) = runs["lightning"], runs["ptrain"]
    assert ptrain["weights"] == lightning["weights"]
    assert ptrain["test_metrics"] == [pytest.approx(lightning["test_metrics"][0], rel=1e-6)]
    assert (programs["ptrain"].folder / ptrain["log_dir"] / "config.yaml").is_file()


def test_a_cli_subclass_with_links_hooks_and_a_callback_group(programs):
    runs = both(programs, "fit", "--recorder.label=rec", "--note=hello", "--data.features=3",
                "--optimizer=SGD", "--optimizer.lr=0.1",
                "--lr_scheduler={ns}.cli.ReduceLROnPlateau", "--lr_scheduler.monitor=val_loss",
                "--lr_scheduler.patience=0", "--lr_scheduler.threshold_mode=abs",
                "--lr_scheduler.threshold=1000",
                "--trainer.max_epochs=3", "--trainer.enable_checkpointing=false",
                mode="custom", env={"TWO_TARGETS": "1"})
    (_, lightning), (_, ptrain) = runs["lightning"], runs["ptrain"]
    assert ptrain["cli_events"] == lightning["cli_events"] == [
        "before_instantiate_classes", "after_instantiate_classes", "before_fit", "after_fit"]
    assert ptrain["recorder_events"] == lightning["recorder_events"] == \
        ["rec:fit_start", "rec:fit_end"]
    # linked on parsing (data.features) and on instantiation (the data module's num_targets)
    assert ptrain["hparams"] == without_instantiator(lightning["hparams"]) == \
        {"features": 3, "hidden": 8, "outputs": 2, "lr": 0.05}
    assert ptrain["note"] == "hello" and ptrain["config_seed"] == 7  # seed_everything_default
    assert ptrain["current_epoch"] == 3  # the command line over trainer_defaults' max_epochs
    assert ptrain["weights"] == lightning["weights"]
    # stepped on val_loss: no epoch after the first improves on the best by 1000, so the rate
    # falls tenfold after the second and the third
    assert ptrain["lr"] == lightning["lr"] == [pytest.approx(1e-3)]


def test_subclass_mode_chooses_the_model_by_name(programs):
    runs = both(programs, "fit", "--model=WideRegressor", "--model.hidden=3",
                "--trainer.max_epochs=1", "--seed_everything=1", "--optimizer=Adam", *QUIET,
                mode="subclass")
    (_, lightning), (_, ptrain) = runs["lightning"], runs["ptrain"]
    assert ptrain["model_class"] == lightning["model_class"] == "WideRegressor"
    assert ptrain["weights"] == lightning["weights"]
    saved = {name: (programs[name].folder / runs[name][1]["log_dir"] / "config.yaml").read_text()
             for name in programs}
    same_config(saved["lightning"], saved["ptrain"])
    model = yaml.safe_load(saved["ptrain"])["model"]
    assert model["class_path"] == "__main__.WideRegressor" and model["init_args"]["hidden"] == 3


def test_a_logger_chosen_by_its_class_name_on_the_command_line(programs):
    # ptrain's TensorBoardLogger took its plugin's on_write_error through **kwargs, which
    # jsonargparse then passed and the logger refused: "Does not validate against any of the
    # Union subtypes"
    runs = both(programs, "fit", "--trainer.logger=TensorBoardLogger",
                "--trainer.logger.save_dir=tb", "--trainer.max_epochs=1", *QUIET)
    (_, lightning), (_, ptrain) = runs["lightning"], runs["ptrain"]
    assert ptrain["log_dir"] == lightning["log_dir"] == os.path.join("tb", "lightning_logs",
                                                                      "version_0")
    assert ptrain["weights"] == lightning["weights"]
    assert (programs["ptrain"].folder / ptrain["log_dir"] / "config.yaml").is_file()


# -- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, named", [("--trainer.foo=1", "trainer.foo"),
                                        ("--model.hidden=wide", "model.hidden")])
def test_bad_input_exits_2_with_jsonargparses_message(programs, bad, named):
    runs = both(programs, "fit", bad, rc=2)
    for done, result in runs.values():
        assert named in done.stderr and result is None
        assert "Traceback" not in done.stderr


def test_a_trainer_value_ptrain_refuses_exits_2_saying_what_to_do(programs):
    done, result = programs["ptrain"].run("fit", "--trainer.max_epochs=1",
                                          "--trainer.precision=17-fancy", rc=2)
    assert "error: " in done.stderr and "17-fancy" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and result is None


def test_a_scheduler_without_an_optimizer_is_unused_as_in_lightning_and_said(programs):
    runs = both(programs, "fit", "--trainer.max_epochs=2", "--lr_scheduler=StepLR",
                "--lr_scheduler.step_size=1", "--lr_scheduler.gamma=0.1", *QUIET)
    (_, lightning), (done, ptrain) = runs["lightning"], runs["ptrain"]
    # the model's own configure_optimizers ran: SGD at its lr, never stepped down
    assert ptrain["lr"] == lightning["lr"] == [0.05]
    assert ptrain["weights"] == lightning["weights"]
    assert "--lr_scheduler was given without --optimizer, so it is not used" in done.stderr


def test_a_seed_set_before_the_cli_is_kept(programs):
    runs = both(programs, "fit", "--trainer.max_epochs=1", *QUIET, mode="preseeded")
    (_, lightning), (_, ptrain) = runs["lightning"], runs["ptrain"]
    assert ptrain["config_seed"] == lightning["config_seed"] == 11
    assert ptrain["weights"] == lightning["weights"]


def test_the_programs_own_error_while_fitting_is_raised_as_in_lightning(programs):
    runs = both(programs, "fit", "--trainer.max_epochs=1", *QUIET, mode="failing", rc=1)
    for done, result in runs.values():
        assert "Traceback" in done.stderr and result is None
        assert "FailingRegressor refuses to fit" in done.stderr.splitlines()[-1]


def test_a_config_file_of_an_earlier_run_is_refused_as_in_lightning(tmp_path):
    for name in NAMESPACE:
        program = Program(tmp_path / name, name)
        args = ["fit", "--trainer.max_epochs=1", "--trainer.logger=false",
                "--trainer.default_root_dir=out", *QUIET]
        program.run(*args)
        assert (program.folder / "out" / "config.yaml").is_file()
        done, result = program.run(*args, rc=1)  # it would overwrite the first run's config
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(("RuntimeError", "ptrain.lightning.cli.ConfigFileExists")), last
        assert "config.yaml" in done.stderr[-2000:] and result is None


# -- in one process -------------------------------------------------------------------------

def _import_program(framework: str, where: Path, source: str | None = None,
                    stem: str = "cli_program"):
    """The program ``source`` (by default the CLI program's) as a module imported from
    ``where``, its imports ported to ptrain.lightning unless ``framework`` is Lightning."""
    source = PROGRAM.read_text() if source is None else source
    path = where / f"{stem}_{framework}.py"
    path.write_text(source if framework == "lightning" else ported(source))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def _as_namespace(config: dict):
    from jsonargparse import Namespace

    return Namespace(**{k: _as_namespace(v) if isinstance(v, dict) else v
                        for k, v in config.items()})


@pytest.mark.parametrize("form", ["list", "dict", "namespace"])
def test_args_given_from_python_parse_as_lightnings(tmp_path, monkeypatch, form):
    monkeypatch.setattr(sys, "argv", ["program.py"])
    monkeypatch.chdir(tmp_path)
    dumps = {}
    for framework in NAMESPACE:
        program = _import_program(framework, tmp_path)
        cli = importlib.import_module(f"{NAMESPACE[framework]}.cli")
        # what a program checks before importing jsonargparse's Namespace, as Lightning's
        assert cli._JSONARGPARSE_SIGNATURES_AVAILABLE
        args = ["--trainer.max_epochs=2", "--model.hidden=5", "--data.batch_size=4",
                "--seed_everything=3", *QUIET] if form == "list" else {
            "trainer": {"max_epochs": 2, "enable_progress_bar": False,
                        "enable_model_summary": False},
            "model": {"hidden": 5}, "data": {"batch_size": 4}, "seed_everything": 3}
        if form == "namespace":
            args = _as_namespace(args)
        run = cli.LightningCLI(program.Regressor, program.RegressionData, run=False, args=args)
        assert run.model.net[0].out_features == 5 and run.datamodule.batch_size == 4
        assert run.trainer.max_epochs == 2
        dumps[framework] = yaml.safe_load(run.parser.dump(run.config))  # nulls left out
    assert dumps["ptrain"] == dumps["lightning"]
    assert dumps["ptrain"]["model"]["hidden"] == 5


def test_lightnings_checkpoint_callback_is_named_on_the_command_line(tmp_path, monkeypatch):
    # ModelCheckpoint is a Checkpoint by registration only (not by inheritance): it must
    # still be one of the classes --trainer.callbacks takes
    monkeypatch.setattr(sys, "argv", ["program.py"])
    monkeypatch.chdir(tmp_path)
    dumps = {}
    for framework in NAMESPACE:
        program = _import_program(framework, tmp_path)
        cli = importlib.import_module(f"{NAMESPACE[framework]}.cli")
        run = cli.LightningCLI(program.Regressor, program.RegressionData, run=False, args=[
            "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.monitor=val_loss",
            "--trainer.callbacks.save_top_k=2", *QUIET])
        assert run.trainer.checkpoint_callback.monitor == "val_loss"
        assert run.trainer.checkpoint_callback.save_top_k == 2
        dumps[framework] = run.parser.dump(run.config).replace(NAMESPACE[framework], "NS")
    assert yaml.safe_load(dumps["ptrain"])["trainer"]["callbacks"] == \
        yaml.safe_load(dumps["lightning"])["trainer"]["callbacks"]


def test_callbacks_in_trainer_defaults_may_be_configs(tmp_path, monkeypatch):
    # Lightning keeps such a dict as it is, and its first hook call fails on it; ptrain makes
    # the callback, checked as --trainer.callbacks is
    monkeypatch.setattr(sys, "argv", ["program.py"])
    monkeypatch.chdir(tmp_path)
    program = _import_program("ptrain", tmp_path)
    from ptrain.lightning.cli import LightningCLI

    run = LightningCLI(program.Regressor, program.RegressionData, run=False, args=QUIET,
                       trainer_defaults={"callbacks": [{
                           "class_path": "ptrain.lightning.callbacks.EarlyStopping",
                           "init_args": {"monitor": "val_loss", "patience": 1}}]})
    assert run.trainer.early_stopping_callback.monitor == "val_loss"
    assert run.trainer.early_stopping_callback.patience == 1
    with pytest.raises(Exception, match="early_stopping_typo"):
        LightningCLI(program.Regressor, program.RegressionData, run=False, args=QUIET,
                     trainer_defaults={"callbacks": {
                         "class_path": "ptrain.lightning.callbacks.EarlyStopping",
                         "init_args": {"early_stopping_typo": 1}}})


TUNED = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable


class Data(pl.LightningDataModule):
    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(8, 4, generator=g),
                                        torch.randn(8, 1, generator=g)), batch_size=4)

    test_dataloader = train_dataloader


class Tuned(pl.LightningModule):
    def __init__(self, hidden: int = 3, optimizer: OptimizerCallable = torch.optim.SGD,
                 scheduler: LRSchedulerCallable = torch.optim.lr_scheduler.ConstantLR):
        super().__init__()
        self.save_hyperparameters()
        self.optimizer, self.scheduler = optimizer, scheduler
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def test_step(self, batch, batch_idx):
        self.log("test_loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        optimizer = self.optimizer(self.parameters())
        return [optimizer], [self.scheduler(optimizer)]
"""


def test_ckpt_path_reads_back_optimizer_callables_given_by_class_path(tmp_path, monkeypatch):
    """yoyodyne's models take ``optimizer: OptimizerCallable`` (and a scheduler), given by
    ``class_path`` in the config; its ``test --ckpt_path`` reads the saved hyperparameters into
    the model's config. ptrain saved jsonargparse's partial, which the parser then refused ("do
    not fit the model's arguments"); Lightning saves the class_path and init_args."""
    monkeypatch.setattr(sys, "argv", ["program.py"])
    quiet = [*QUIET, "--trainer.logger=false"]
    seen = {}
    for framework in NAMESPACE:
        folder = tmp_path / framework
        folder.mkdir()
        monkeypatch.chdir(folder)
        program = _import_program(framework, folder, TUNED, stem="tuned")
        cli = importlib.import_module(f"{NAMESPACE[framework]}.cli")
        cli.LightningCLI(program.Tuned, program.Data, save_config_callback=None, args=[
            "fit", "--model.hidden=5", "--model.optimizer=Adam", "--model.optimizer.lr=0.01",
            "--model.scheduler=StepLR", "--model.scheduler.step_size=2",
            "--trainer.max_epochs=1", *quiet])
        [checkpoint] = (folder / "checkpoints").iterdir()
        run = cli.LightningCLI(program.Tuned, program.Data, save_config_callback=None,
                               args=["test", f"--ckpt_path={checkpoint}", *quiet])
        model = run.config.test.model
        seen[framework] = (model.hidden, model.optimizer.class_path,
                           model.optimizer.init_args.lr, model.scheduler.class_path,
                           model.scheduler.init_args.step_size,
                           run.trainer.callback_metrics["test_loss"].item())
    assert seen["lightning"][:5] == (5, "torch.optim.Adam", 0.01,
                                     "torch.optim.lr_scheduler.StepLR", 2)
    assert seen["ptrain"][:5] == seen["lightning"][:5]
    assert seen["ptrain"][5] == pytest.approx(seen["lightning"][5], rel=1e-6)


def test_the_module_imports_without_jsonargparse_and_says_what_to_install():
    code = ("import sys; sys.modules['jsonargparse'] = None\n"
            "import ptrain.lightning.cli as cli\n"
            "try:\n    cli.LightningCLI(args=[])\n"
            "except ModuleNotFoundError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert 'pip install "ptrain-core[cli]"' in done.stdout
