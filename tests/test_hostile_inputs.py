"""Hostile inputs, round two (issue 35): configs, checkpoints, environment variables, concurrent
runs, the Lightning layer, ``tune``, ``export`` and ``plugins`` used in ways the first rounds
did not try. Each case ends in success or in one paragraph (exit 2 for bad input) naming what
was wrong, without a traceback and without losing anything saved. Every CLI case is a real
``ptrain`` process; the Lightning layer's are in-process, as a user's script runs them. The
table in docs/reliability.md ("Hostile inputs, round two") lists each with what ptrain does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch

from conftest import run_cli
from tests._cli_util import assert_ok, assert_usage_error

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
COMMON = ["--accelerator", "cpu", "-p", "no:progress-bar", "-p", "no:model-summary",
          "-p", "no:tensorboard"]
BASE = ["fit", "--model", "tests._input_models:Base", *COMMON, "--max-epochs", "1"]
TORCHRUN = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29999"}


@dataclass
class Case:
    """A CLI case: ``argv`` run with ``env`` added; ``expect`` is ``"usage"`` (exit 2, one
    paragraph holding every needle) or ``"ok"`` (exit 0); ``check`` looks at what is on disk
    afterwards (nothing lost, nothing half-written)."""

    argv: list[str]
    expect: str = "usage"
    needles: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    check: Callable[[], None] | None = None


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished run of the Base model: its last.ckpt."""
    root = tmp_path_factory.mktemp("trained")
    assert_ok(run_cli(*BASE, "--default-root-dir", str(root / "runs"), cwd=REPO))
    checkpoint = root / "runs" / "version_0" / "checkpoints" / "last.ckpt"
    assert checkpoint.is_file()
    return checkpoint


def _no_runs(root: Path) -> Callable[[], None]:
    def check():
        assert not root.exists() or not any(root.glob("version_*/checkpoints/*")), \
            sorted(map(str, root.rglob("*")))
    return check


def _fit(tmp: Path, *args: str, env=None, expect="usage", needles=(), root=None,
         model="tests._input_models:Base") -> Case:
    runs = root or tmp / "runs"
    base = [*BASE[:2], model, *BASE[3:]]
    return Case([*base, "--default-root-dir", str(runs), *args], expect, tuple(needles),
                env or {}, _no_runs(runs) if expect == "usage" else None)


def _ddp(tmp: Path, torchrun=True, needles=(), **variables: str) -> Case:
    """``fit --strategy ddp`` (one process) in a launcher's environment with ``variables``."""
    env = {**(TORCHRUN if torchrun else {}), **variables}
    return _fit(tmp, "--strategy", "ddp", "--ddp-timeout", "20", env=env, needles=needles)


def _config(tmp: Path, text: str | bytes, name="c.toml", **kw) -> Case:
    path = tmp / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return _fit(tmp, "--config", str(path), **kw)


def _copy(trained: Path, tmp: Path) -> Path:
    copy = tmp / "start.ckpt"
    shutil.copyfile(trained, copy)
    return copy


def _with_format_version(trained: Path, tmp: Path, version) -> Path:
    from ptrain.checkpoint_io import safe_load
    state = safe_load(trained)
    state["format_version"] = version
    path = tmp / "future.ckpt"
    torch.save(state, path)
    return path


def _fifo(tmp: Path) -> Path:
    path = tmp / "pipe.ckpt"
    os.mkfifo(path)
    return path


def _loop(tmp: Path) -> Path:
    a, b = tmp / "a.ckpt", tmp / "b.ckpt"
    a.symlink_to(b)
    b.symlink_to(a)
    return a


def _truncated(trained: Path, tmp: Path) -> Path:
    path = tmp / "cut.ckpt"
    data = trained.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _unchanged(path: Path) -> Callable[[], None]:
    before = path.read_bytes()

    def check():
        assert path.read_bytes() == before, f"{path} changed"
    return check


def _export_onto_itself(trained: Path, tmp: Path) -> Case:
    copy = _copy(trained, tmp)
    return Case(["export", str(copy), "--output", str(copy), "--force"], "usage",
                ("start.ckpt",), check=_unchanged(copy))


def _export_to_folder(trained: Path, tmp: Path) -> Case:
    (tmp / "out").mkdir()
    return Case(["export", str(trained), "--output", str(tmp / "out")], "usage", ("out",))


def _tune(tmp: Path, *args: str, needles=()) -> Case:
    out = tmp / "t.toml"

    def check():
        assert not out.exists()
    return Case(["tune", "--model", "tests._tune_models:SmallBatchRegressor", "--accelerator",
                 "cpu", "--tune-output", str(out), *args], "usage", tuple(needles), check=check)


#: name -> function(tmp_path, trained checkpoint) -> Case
CASES: dict[str, Callable[[Path, Path], Case]] = {
    # -- config files ---------------------------------------------------------------------
    "config-is-a-directory": lambda t, c: _fit(t, "--config", str(t),
                                               needles=(str(t), "Is a directory")),
    "config-empty-file": lambda t, c: _config(t, "", expect="ok"),
    "config-binary-bytes": lambda t, c: _config(t, bytes(range(256)) * 4,
                                                needles=("c.toml", "can't be read", "utf-8")),
    "config-duplicate-table": lambda t, c: _config(
        t, "[trainer]\nmax_epochs = 1\n[trainer]\nseed = 3\n", needles=("c.toml", "trainer")),
    "config-duplicate-key": lambda t, c: _config(
        t, "[trainer]\nmax_epochs = 1\nmax_epochs = 2\n",
        needles=("c.toml", "line 3 reads 'max_epochs = 2'")),
    "config-plugin-option-wrong-type": lambda t, c: _config(
        t, '[plugins.checkpoint]\nevery_n_epochs = "often"\n',
        needles=("every_n_epochs", "often")),
    "config-trainer-not-a-table": lambda t, c: _config(t, "trainer = 3\n",
                                                       needles=("c.toml", "trainer")),
    "config-yaml-file": lambda t, c: _config(t, "trainer:\n  max_epochs: 1\n", name="c.yaml",
                                             needles=("c.yaml", "TOML only", "not YAML")),
    "config-plugins-not-a-table": lambda t, c: _config(t, "plugins = [1, 2]\n",
                                                       needles=("c.toml", "plugins")),
    "config-max-epochs-float": lambda t, c: _config(t, "[trainer]\nmax_epochs = 1.5\n",
                                                    needles=("max_epochs", "1.5")),
    # -- environment variables ------------------------------------------------------------
    # (under a distributed strategy, which reads them; a single-device run has no rendezvous)
    "env-master-port-not-a-number": lambda t, c: _ddp(t, MASTER_PORT="abc",
                                                      needles=("MASTER_PORT='abc'",)),
    "env-master-port-out-of-range": lambda t, c: _ddp(t, MASTER_PORT="70000",
                                                      needles=("MASTER_PORT=70000",)),
    "env-world-size-zero": lambda t, c: _ddp(t, WORLD_SIZE="0", needles=("WORLD_SIZE=0",)),
    "env-local-rank-negative": lambda t, c: _ddp(t, LOCAL_RANK="-1",
                                                 needles=("LOCAL_RANK='-1'",)),
    "env-rank-not-a-number": lambda t, c: _ddp(t, RANK="abc", needles=("RANK='abc'",)),
    "env-rank-beyond-world-size": lambda t, c: _ddp(t, RANK="3",
                                                    needles=("RANK=3 is not below WORLD_SIZE=1",)),
    "env-slurm-ntasks-not-a-number": lambda t, c: _ddp(
        t, torchrun=False, SLURM_PROCID="0", SLURM_NTASKS="many",
        needles=("SLURM_NTASKS='many'",)),
    "env-ptrain-trace-nonsense": lambda t, c: _fit(t, env={"PTRAIN_TRACE": "maybe"},
                                                   needles=("PTRAIN_TRACE", "maybe")),
    # ptrain's own variable for the ranks its launcher starts: no other process reads it
    "env-ptrain-global-seed-nonsense": lambda t, c: _fit(t, env={"PTRAIN_GLOBAL_SEED": "abc"},
                                                         expect="ok"),
    # a torchrun of two processes whose command line keeps the default strategy
    "env-torchrun-of-two-under-single-device": lambda t, c: _fit(
        t, env={**TORCHRUN, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"},
        needles=("WORLD_SIZE", "--strategy ddp")),
    "env-cuda-visible-devices-empty-on-cpu": lambda t, c: _fit(
        t, env={"CUDA_VISIBLE_DEVICES": ""}, expect="ok"),
    "env-xdg-cache-home-is-a-file": lambda t, c: (
        (t / "cachefile").write_text("x"),
        _fit(t, env={"XDG_CACHE_HOME": str(t / "cachefile")}, expect="ok"))[1],
    "env-columns-nonsense": lambda t, c: _fit(t, env={"COLUMNS": "abc", "LINES": "-3"},
                                              expect="ok"),
    "env-slurm-job-id-on-one-task": lambda t, c: _fit(
        t, env={"SLURM_JOB_ID": "x1", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, expect="ok"),
    # -- the run folder -------------------------------------------------------------------
    "root-is-a-file": lambda t, c: (
        (t / "plain").write_text("x"),
        _fit(t, root=t / "plain", needles=("plain",)))[1],
    "root-under-a-file": lambda t, c: (
        (t / "plain").write_text("x"),
        _fit(t, root=t / "plain" / "runs", needles=("plain",)))[1],
    "root-with-a-newline": lambda t, c: _fit(t, root=t / "two\nlines", expect="ok"),
    "root-empty-string": lambda t, c: Case([*BASE, "--default-root-dir", ""], "usage",
                                           ("--default-root-dir", "give '.'")),
    # -- checkpoints ----------------------------------------------------------------------
    "ckpt-symlink-loop": lambda t, c: _fit(t, "--ckpt-path", str(_loop(t)),
                                           needles=("a.ckpt", "symbolic link", "loops")),
    "ckpt-fifo": lambda t, c: _fit(t, "--ckpt-path", str(_fifo(t)),
                                   needles=("pipe.ckpt", "not a regular file")),
    "ckpt-zero-bytes": lambda t, c: (
        (t / "empty.ckpt").write_bytes(b""),
        _fit(t, "--ckpt-path", str(t / "empty.ckpt"),
             needles=("empty.ckpt", "truncated or corrupt")))[1],
    "ckpt-truncated-zip": lambda t, c: _fit(t, "--ckpt-path", str(_truncated(c, t)),
                                            needles=("cut.ckpt", "truncated or corrupt")),
    "ckpt-newer-format-version": lambda t, c: _fit(
        t, "--ckpt-path", str(_with_format_version(c, t, 99)),
        needles=("future.ckpt", "format version 99", "upgrade")),
    "ckpt-format-version-not-a-number": lambda t, c: _fit(
        t, "--ckpt-path", str(_with_format_version(c, t, "two")),
        needles=("future.ckpt", "format version 'two'")),
    "ckpt-folder-without-checkpoints": lambda t, c: (
        (t / "emptydir").mkdir(),
        _fit(t, "--ckpt-path", str(t / "emptydir"),
             needles=("emptydir", "is a folder", "no .ckpt file is under it")))[1],
    "ckpt-path-given-twice": lambda t, c: _fit(
        t, "--ckpt-path", str(_copy(c, t)), "--ckpt-path", "last",
        needles=("--ckpt-path was given twice", "start.ckpt", "'last'")),
    "ckpt-last-on-an-empty-root": lambda t, c: _fit(t, "--ckpt-path", "last",
                                                    needles=("last",)),
    "validate-ckpt-a-zip-of-something-else": lambda t, c: (
        zipfile.ZipFile(t / "other.ckpt", "w").writestr("hello.txt", "hi"),
        Case(["validate", "--model", "tests._input_models:Base", *COMMON, "--ckpt-path",
              str(t / "other.ckpt"), "--default-root-dir", str(t / "runs")], "usage",
             ("other.ckpt", "corrupt")))[1],
    # -- export and plugins ---------------------------------------------------------------
    "export-onto-its-own-checkpoint": lambda t, c: _export_onto_itself(c, t),
    "export-output-is-a-folder": lambda t, c: _export_to_folder(c, t),
    "plugins-kind-nonsense": lambda t, c: Case(["plugins", "--kind", "nonsense"], "usage",
                                               ("unknown option --kind.",
                                                "`ptrain plugins --help`")),
    # -- the optimizers a module returns --------------------------------------------------
    "configure-optimizers-empty-list": lambda t, c: _fit(
        t, model="tests._hostile_models:NoOptimizers",
        needles=("configure_optimizers returned no optimizer ([])", "expected an optimizer")),
    "configure-optimizers-a-string": lambda t, c: _fit(
        t, model="tests._hostile_models:OptimizerIsAString",
        needles=("configure_optimizers returned str", "expected an optimizer")),
    "configure-optimizers-scheduler-only": lambda t, c: _fit(
        t, model="tests._hostile_models:SchedulerWithoutOptimizer",
        needles=("configure_optimizers returned dict", "{'optimizer': opt")),
    # -- tune -----------------------------------------------------------------------------
    "tune-budget-zero": lambda t, c: _tune(t, "--tune-budget", "0",
                                           needles=("--tune-budget '0' is not a duration",
                                                    "above 0")),
    "tune-budget-negative": lambda t, c: _tune(t, "--tune-budget", "-1",
                                               needles=("--tune-budget '-1'", "above 0")),
    "tune-budget-nan": lambda t, c: _tune(t, "--tune-budget", "nan",
                                          needles=("--tune-budget", "nan")),
    "tune-output-under-a-file": lambda t, c: (
        (t / "plain").write_text("x"),
        _tune(t, "--tune-output", str(t / "plain" / "t.toml"),
              needles=("--tune-output", "is a file, not a folder")))[1],
}

#: name -> what happens today, for the cases ptrain does not yet handle (strict xfail; none now).
XFAIL: dict[str, str] = {
}


@pytest.mark.campaign(sample=12)
@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=XFAIL[name]))
    if name in XFAIL else name for name in CASES])
def test_a_hostile_cli_input_ends_well(name, trained, tmp_path):
    case = CASES[name](tmp_path, trained)
    result = run_cli(*case.argv, env=case.env, cwd=REPO, timeout=120)
    print(f"exit {result.returncode}: {result.stderr.strip()[-600:]}")  # for -rP: what it said
    if case.expect == "ok":
        assert_ok(result)
    else:
        message = assert_usage_error(result, *case.needles)
        assert message.count("ptrain: error:") == 1, message
    if case.check is not None:
        case.check()


# -- the Lightning layer, in-process as a user's script runs it ---------------------------------

def _lightning_model(pl, optimizers=True):
    from torch.utils.data import DataLoader

    from tests._lightning_pair import Numbers

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1) if optimizers else []

        def train_dataloader(self):
            return DataLoader(Numbers(8), batch_size=4)

    return Model()


def _trainer(root, **kwargs):
    import ptrain.lightning as pl

    from tests._lightning_pair import QUIET
    return pl.Trainer(default_root_dir=str(root), **QUIET, **kwargs)


def _fit_lightning(root, model=True, **kwargs):
    import ptrain.lightning as pl
    trainer = _trainer(root, **kwargs)
    trainer.fit(_lightning_model(pl) if model is True else model)
    return trainer


def _empty_optimizers(root):
    import ptrain.lightning as pl
    _trainer(root, max_epochs=1).fit(_lightning_model(pl, optimizers=False))


#: name -> (function(tmp_path), None when it must succeed or the words its error must hold,
#: and for a success a check of the finished trainer)
LIGHTNING = {
    # Lightning 2.6.6 fails these with a bare AssertionError / TypeError; ptrain takes the
    # number the text spells and trains exactly that long
    "max-epochs-as-text": (lambda t: _fit_lightning(t, max_epochs="3"), None,
                           lambda tr: tr.current_epoch == 3 and tr.global_step == 6),
    "max-steps-as-text": (lambda t: _fit_lightning(t, max_steps="3", max_epochs=-1), None,
                          lambda tr: tr.global_step == 3),
    "devices-zero": (lambda t: _trainer(t, devices=0), ("devices", "got 0"), None),
    "devices-negative-two": (lambda t: _trainer(t, devices=-2), ("devices", "got -2"), None),
    "fit-model-none": (lambda t: _fit_lightning(t, model=None, max_epochs=1),
                       ("LightningModule",), None),
    "configure-optimizers-empty-list": (_empty_optimizers, ("configure_optimizers", "[]"), None),
    "precision-banana": (lambda t: _trainer(t, precision="banana"), ("'banana'", "32-true"), None),
    "strategy-bogus": (lambda t: _trainer(t, strategy="bogus"), ("'bogus'", "ddp"), None),
    "callback-that-is-no-callback": (lambda t: _trainer(t, callbacks=[object()]),
                                     ("builtins.object", "no ptrain hook"), None),
    "limit-train-batches-negative": (lambda t: _trainer(t, limit_train_batches=-1),
                                     ("limit_train_batches", "-1"), None),
    "accumulate-grad-batches-zero": (lambda t: _trainer(t, accumulate_grad_batches=0),
                                     ("accumulate_grad_batches", "0"), None),
    "default-root-dir-is-a-file": (
        lambda t: ((t / "plain").write_text("x"),
                   _fit_lightning(t / "plain", max_epochs=1))[1],
        ("plain", "Nothing was trained"), None),
    "fit-ckpt-path-missing": (
        lambda t: _trainer(t, max_epochs=1).fit(
            _lightning_model(__import__("ptrain.lightning", fromlist=["x"])),
            ckpt_path=str(t / "nope.ckpt")), ("nope.ckpt", "does not exist"), None),
    "train-dataloaders-an-int": (
        lambda t: _trainer(t, max_epochs=1).fit(
            _lightning_model(__import__("ptrain.lightning", fromlist=["x"])),
            train_dataloaders=42), ("42",), None),
}


@pytest.mark.parametrize("name", list(LIGHTNING))
def test_a_hostile_lightning_input_ends_well(name, tmp_path):
    from ptrain.errors import PtrainError
    run, words, check = LIGHTNING[name]
    if words is None:
        trainer = run(tmp_path)
        assert check(trainer), (trainer.current_epoch, trainer.global_step)
        return
    with pytest.raises((PtrainError, TypeError)) as raised:
        run(tmp_path)
    message = str(raised.value)
    print(f"{type(raised.value).__name__}: {message}")  # for -rP: what it said
    for word in words:
        assert word in message, message
    assert not any(tmp_path.rglob("*.ckpt")), "a refused run wrote a checkpoint"


# -- concurrent runs ----------------------------------------------------------------------------

def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ptrain", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen):
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err


def test_two_exports_at_once_to_one_file_leave_one_whole_file(trained, tmp_path):
    from safetensors.torch import load_file

    from ptrain.checkpoint_io import safe_load
    out = tmp_path / "model.safetensors"
    procs = [_start("export", str(trained), "--output", str(out)) for _ in range(2)]
    results = [_finish(p) for p in procs]
    codes = sorted(code for code, _, _ in results)
    # both wrote the same bytes (whole each time), or the second was refused as existing
    assert codes in ([0, 0], [0, 2]), results
    for code, _, err in results:
        assert "Traceback" not in err, err
        if code == 2:
            assert "exists already" in err, err
    written = load_file(out)
    for key, value in safe_load(trained)["model"].items():
        assert torch.equal(written[key], value), key
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_two_fits_at_once_from_one_outside_checkpoint_get_their_own_runs(trained, tmp_path):
    start = _copy(trained, tmp_path)
    unchanged = _unchanged(start)
    root = tmp_path / "runs"
    procs = [_start(*BASE[:-1], "2", "--ckpt-path", str(start), "--default-root-dir", str(root))
             for _ in range(2)]
    results = [_finish(p) for p in procs]
    assert [code for code, _, _ in results] == [0, 0], results
    runs = sorted(p.name for p in root.iterdir())
    assert runs == ["version_0", "version_1"], runs
    for run in runs:
        assert (root / run / "checkpoints" / "last.ckpt").is_file()
    unchanged()
