"""``ptrain new-plugin``: the distribution it writes for each kind installs, is listed, trains
when selected by name, and passes its own generated tests; bad input is a usage error that
writes nothing.

The first tests call the CLI's ``main`` in this process (cheap). The ``installed`` fixture
generates one plugin of each kind and pip-installs the four, offline and without dependencies,
into a private folder (never into ``.venv``); the ``ptrain`` and ``pytest`` subprocesses get it on
``PYTHONPATH``, where ``importlib.metadata`` finds their entry points as after a real install.
The last tests check the order between plugins that docs/plugins.md states (for the generated
plugins' authors), in this process.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import ptrain
from _cli_util import GROUPS, REPO, assert_ok, assert_usage_error, pythonpath_env
from conftest import CLIResult, TinyRegressor, run_cli
from ptrain.cli import main
from ptrain.loading import create_plugin_manager, declare_options, instantiate, register

#: One generated plugin per kind; dashes in each, so that the package name must differ.
NAMES = {"accelerator": "demo-xpu", "strategy": "demo-solo", "precision": "demo-fp32",
         "callback": "demo-epoch-log"}
PACKAGES = {kind: "ptrain_" + name.replace("-", "_") for kind, name in NAMES.items()}
CLASSES = {"accelerator": "DemoXpuAccelerator", "strategy": "DemoSoloStrategy",
           "precision": "DemoFp32Precision", "callback": "DemoEpochLogCallback"}
#: The hooks the generated plugin of each kind must implement to work as that kind.
KIND_HOOKS = {"accelerator": {"setup_device", "transfer_batch", "check_available"},
              "strategy": {"launch", "wrap_model"},
              "precision": {"precision_policy"},
              "callback": {"on_epoch_end", "add_options"}}
SELECT = {"accelerator": ["--accelerator"], "strategy": ["--strategy"],
          "precision": ["--precision"], "callback": ["-p"]}
TEMPLATES = REPO / "core" / "ptrain" / "templates"


def new_plugin(capsys, *args: str) -> CLIResult:
    code = main(["new-plugin", *args])
    out = capsys.readouterr()
    return CLIResult(code, out.out, out.err)


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- what it writes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(NAMES))
def test_writes_a_distribution_of_the_kind(kind, tmp_path, capsys):
    from ptrain.testing import private_imports

    name, package, folder = NAMES[kind], PACKAGES[kind], tmp_path / "dist"
    result = new_plugin(capsys, name, "--kind", kind, "--dir", str(folder))
    assert result.returncode == 0, result.stderr
    stem = name.replace("-", "_")
    files = files_under(folder)
    assert set(files) == {"pyproject.toml", "README.md", f"{package}/__init__.py",
                          f"tests/test_{stem}.py"}
    for path, content in files.items():
        assert b"${" not in content, f"{path} holds a template placeholder"

    project = tomllib.loads(files["pyproject.toml"].decode())
    assert project["project"]["name"] == f"ptrain-{name}"
    assert any(d.startswith("ptrain-core") for d in project["project"]["dependencies"])
    assert project["project"]["entry-points"] == {
        GROUPS[kind]: {name: f"{package}:{CLASSES[kind]}"}}
    assert project["tool"]["setuptools"]["packages"] == [package]
    readme = files["README.md"].decode()
    assert readme.startswith(f"# ptrain-{name}: `{name}`")
    assert f"{' '.join(SELECT[kind])} {name}" in readme

    for path in (f"{package}/__init__.py", f"tests/test_{stem}.py"):
        compile(files[path], path, "exec")
        assert private_imports(folder / path) == []  # only ptrain's public API
    plugin_class = getattr(load_module(folder / package / "__init__.py", f"gen_{stem}"),
                           CLASSES[kind])
    implemented = {n for n in dir(plugin_class) if hasattr(getattr(plugin_class, n), "ptrain_impl")}
    assert KIND_HOOKS[kind] <= implemented, f"missing: {KIND_HOOKS[kind] - implemented}"
    options = declare_options(plugin_class, name)  # add_options, if any, is a static method
    defaults = {o.name: o.default for o in options.options.values()}
    register(create_plugin_manager(), instantiate(plugin_class, name, defaults), name)

    test_functions = {node.name for node in ast.walk(ast.parse(files[f"tests/test_{stem}.py"]))
                      if isinstance(node, ast.FunctionDef)}
    assert any(f.startswith("test_") for f in test_functions)
    assert f"Created ptrain-{name}" in result.stdout and f"pip install -e '{folder}[test]'" in result.stdout


@pytest.mark.parametrize("kind", list(NAMES))
@pytest.mark.parametrize("name", ["lr-probe", "gradient-noise-scheduler"])
def test_generated_lines_are_at_most_100_characters(kind, name, tmp_path, capsys):
    """ptrain's own line length holds in what it generates, for a name up to 24 characters (the
    longest of the plugins shipped with ptrain): `new-plugin lr-probe --kind callback` wrote
    102-character asserts into its tests, and a longer name pushed comments and docstrings of
    every kind past 100."""
    folder = tmp_path / "dist"
    assert new_plugin(capsys, name, "--kind", kind, "--dir", str(folder)).returncode == 0
    for path, content in files_under(folder).items():
        text = content.decode()
        longest = max(text.splitlines(), key=len)
        assert len(longest) <= 100, f"{path}: {len(longest)} characters: {longest}"
        if path.endswith(".py"):
            compile(content, path, "exec")
    tomllib.loads(files_under(folder)["pyproject.toml"].decode())


def test_default_folder_is_ptrain_name_in_the_current_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    result = new_plugin(capsys, "demo-xpu", "--kind", "accelerator")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "ptrain-demo-xpu" / "pyproject.toml").is_file()
    assert "pip install -e './ptrain-demo-xpu[test]'" in result.stdout


def test_an_empty_folder_is_used(tmp_path, capsys):
    folder = tmp_path / "here"
    folder.mkdir()
    assert new_plugin(capsys, "demo-solo", "--kind", "strategy", "--dir",
                      str(folder)).returncode == 0
    assert (folder / "ptrain_demo_solo" / "__init__.py").is_file()


def test_a_name_of_another_kind_is_allowed_with_a_note(tmp_path, capsys):
    result = new_plugin(capsys, "cpu", "--kind", "callback", "--dir", str(tmp_path / "d"))
    assert result.returncode == 0, result.stderr
    assert "Note: 'cpu' is also the name of an installed accelerator (ptrain-core)" in result.stdout


def test_generating_imports_no_torch(tmp_path):
    code = ("import sys; from ptrain.cli import main; "
            f"assert main(['new-plugin', 'demo-xpu', '--kind', 'accelerator', '--dir', "
            f"{str(tmp_path / 'd')!r}]) == 0; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


# -- bad input: exit code 2, a message that says the fix, nothing written -----------------------


@pytest.mark.parametrize("name", ["My-Plugin", "my_plugin", "-x", "x-", "a--b", "a.b", "grad norm",
                                  "ünï", ""])
def test_an_invalid_name_is_a_usage_error(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    result = new_plugin(capsys, "--kind", "callback", "--", name)  # "--": "-x" is no flag
    assert_usage_error(result, f"invalid plugin name {name!r}", "lowercase letters and digits",
                       "joined by single '-'")
    assert list(tmp_path.iterdir()) == []


def test_an_invalid_name_suggests_a_valid_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert_usage_error(new_plugin(capsys, "My_XPU", "--kind", "accelerator"), "Try 'my-xpu'.")


def test_a_distribution_name_given_as_name_is_refused(tmp_path, capsys):
    result = new_plugin(capsys, "ptrain-my-xpu", "--kind", "accelerator", "--dir",
                        str(tmp_path / "d"))
    assert_usage_error(result, "without 'ptrain-'", "try 'my-xpu'")
    assert not (tmp_path / "d").exists()


def test_an_unknown_kind_lists_the_kinds(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert_usage_error(new_plugin(capsys, "demo", "--kind", "gpu"), "unknown plugin kind 'gpu'",
                       "accelerator, strategy, precision, callback")
    assert_usage_error(new_plugin(capsys, "demo", "--kind", "callbacks"),
                       "Did you mean 'callback'?")
    assert_usage_error(new_plugin(capsys, "demo"), "--kind")
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_is_not_empty_is_left_as_it_was(tmp_path, capsys):
    folder = tmp_path / "ptrain-demo-xpu"
    (folder / "ptrain_demo_xpu").mkdir(parents=True)
    (folder / "pyproject.toml").write_text("# my own work\n")
    (folder / "ptrain_demo_xpu" / "__init__.py").write_text("MINE = 1\n")
    before = files_under(folder)
    result = new_plugin(capsys, "demo-xpu", "--kind", "accelerator", "--dir", str(folder))
    assert_usage_error(result, str(folder), "is not empty", "nothing was written", "--dir")
    assert files_under(folder) == before


def test_a_file_where_the_folder_would_go_is_refused(tmp_path, capsys):
    path = tmp_path / "taken"
    path.write_text("keep me\n")
    assert_usage_error(new_plugin(capsys, "demo", "--kind", "callback", "--dir", str(path)),
                       "is not a folder")
    assert path.read_text() == "keep me\n"


@pytest.mark.parametrize(("kind", "name"), [("accelerator", "cpu"), ("precision", "32-true"),
                                            ("callback", "checkpoint")])
def test_the_name_of_an_installed_plugin_of_the_kind_is_refused(kind, name, tmp_path, capsys):
    result = new_plugin(capsys, name, "--kind", kind, "--dir", str(tmp_path / "d"))
    assert_usage_error(result, f"an installed {kind} plugin is already named {name!r}",
                       "ptrain-core", "choose another name")
    assert not (tmp_path / "d").exists()


def test_the_name_of_an_installed_distribution_is_refused(tmp_path, capsys):
    # installing a second "ptrain-core" would replace the core itself
    result = new_plugin(capsys, "core", "--kind", "callback", "--dir", str(tmp_path / "d"))
    assert_usage_error(result, "ptrain-core is installed already", "would replace it")
    assert not (tmp_path / "d").exists()


def test_auto_is_no_accelerator_name(tmp_path, capsys):
    assert_usage_error(new_plugin(capsys, "auto", "--kind", "accelerator", "--dir",
                                  str(tmp_path / "d")), "--accelerator auto")


def test_the_real_command_exits_2_on_bad_input(tmp_path):
    result = run_cli("new-plugin", "Bad_Name", "--kind", "callback", cwd=tmp_path)
    assert_usage_error(result, "invalid plugin name 'Bad_Name'")
    assert list(tmp_path.iterdir()) == []


# -- the templates ship with the core ------------------------------------------------------------


@pytest.mark.slow
def test_the_templates_are_in_the_core_wheel(tmp_path):
    """Build ptrain-core's wheel from a copy of the sources (the build leaves files behind) and
    check that every template is in it: without them an installed ``ptrain new-plugin`` fails."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "core", source / "core",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--quiet", "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "dist").glob("ptrain_core-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    templates = {f"ptrain/templates/{p.relative_to(TEMPLATES)}" for p in TEMPLATES.rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts}
    assert templates, "no templates found"
    assert templates <= shipped, f"not in the wheel: {sorted(templates - shipped)}"


# -- the generated plugins, installed -------------------------------------------------------------


class Installed:
    """The four generated distributions, installed into ``site``, and the runs made with them
    (started when the fixture is made, two at a time; each test waits for the ones it checks)."""

    def __init__(self, root: Path):
        self.root, self.generated, self.site = root, root / "generated", root / "site"
        self.env = pythonpath_env(self.site)
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="new-plugin")
        self.runs: dict[str, Future] = {}

    def start(self, key: str, function, *args, **kwargs) -> None:
        self.runs[key] = self._pool.submit(function, *args, **kwargs)

    def __getitem__(self, key: str):
        return self.runs[key].result()

    def fit(self, key: str, *selection: str) -> None:
        root = self.root / "runs" / key
        self.start(key, run_cli, "fit", "--model", "tests.conftest:TinyRegressor",
                   "--max-epochs", "1", "--no-progress-bar", "--default-root-dir", str(root),
                   *selection, env=self.env)

    def checkpoint_config(self, key: str) -> dict:
        path = self.root / "runs" / key / "version_0" / "checkpoints" / "last.ckpt"
        assert path.is_file(), f"the run {key!r} wrote no checkpoint"
        return torch.load(path, weights_only=True)["config"]


def _run_generated_tests(installed: Installed) -> subprocess.CompletedProcess:
    """pytest over the four generated distributions' tests, as their authors would run it."""
    report = installed.root / "generated-tests.xml"
    folders = [f"ptrain-{NAMES[kind]}" for kind in NAMES]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", ".",
         f"--junitxml={report}", *folders],
        cwd=installed.generated, env={**os.environ, **installed.env}, capture_output=True,
        text=True, timeout=600)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    result = Installed(tmp_path_factory.mktemp("new-plugin"))
    for kind, name in NAMES.items():
        assert main(["new-plugin", name, "--kind", kind, "--dir",
                     str(result.generated / f"ptrain-{name}")]) == 0
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--quiet", "--disable-pip-version-check", "--target", str(result.site),
         *(str(p) for p in sorted(result.generated.iterdir()))],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PIP_NO_INPUT": "1"})
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout}\n{proc.stderr}"
    result.start("generated-tests", _run_generated_tests, result)
    result.start("plugins", run_cli, "plugins", env=result.env)
    # one training run selects all four by name (a run per kind would cost a torch start each)
    result.fit("fit", *(arg for kind, name in NAMES.items() for arg in (*SELECT[kind], name)))
    yield result
    result._pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.slow
def test_ptrain_plugins_lists_each_generated_plugin(installed):
    result = installed["plugins"]
    assert_ok(result)
    rows = [line.split() for line in result.stdout.splitlines()]
    for kind, name in NAMES.items():
        assert [kind, name, f"ptrain-{name}", "0.1.0"] in rows, result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(NAMES))
def test_fit_trains_with_the_generated_plugin_selected_by_name(kind, installed):
    result = installed["fit"]
    assert_ok(result)
    config = installed.checkpoint_config("fit")  # written after the epoch: the run trained
    if kind == "callback":
        assert NAMES[kind] in config["trainer"]["callbacks"]
        assert config["plugins"][NAMES[kind]] == {"every_n_epochs": 1}
        assert f"[{NAMES[kind]}] epoch 0 step 8: train_loss=" in result.stdout, result.stdout
    else:
        assert config["trainer"][kind] == NAMES[kind]


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(NAMES))
def test_the_generated_tests_pass(kind, installed):
    proc = installed["generated-tests"]
    detail = f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    report = installed.root / "generated-tests.xml"
    assert report.is_file(), f"pytest wrote no report (exit {proc.returncode})\n{detail}"
    stem = NAMES[kind].replace("-", "_")
    cases = [case for case in ET.parse(report).getroot().iter("testcase")
             if f"test_{stem}" in case.get("classname", "")]
    outcomes = {f"{c.get('classname')}::{c.get('name')}": [child.tag for child in c]
                for c in cases}
    assert outcomes, f"no test of tests/test_{stem}.py ran\n{detail}"
    bad = {test: tags for test, tags in outcomes.items()
           if {"failure", "error", "skipped"} & set(tags)}
    assert not bad, f"generated tests that did not pass: {bad}\n{detail}"
    source = (installed.generated / f"ptrain-{NAMES[kind]}" / "tests" / f"test_{stem}.py")
    own = {node.name for node in ast.parse(source.read_text()).body
           if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
    ran = {test.rsplit("::", 1)[1] for test in outcomes}
    assert own <= ran, f"not run: {own - ran}"
    assert any("Conformance" in test for test in outcomes), "the conformance suite did not run"


# -- the order between plugins, as docs/plugins.md states it ---------------------------------------


class OrderProbe:
    """A callback whose ``on_epoch_end`` (a plain implementation, or a wrapper) logs its name."""

    def __init__(self, name: str, log: list[str], wrapper: bool = False, **marks):
        self.name = name
        if wrapper:
            def on_epoch_end():
                log.append(f"{name}<")
                yield
                log.append(f">{name}")
        else:
            def on_epoch_end():
                log.append(name)
        self.on_epoch_end = ptrain.hookimpl(wrapper=wrapper, **marks)(on_epoch_end)


def epoch_end_order(make_trainer, *specs: tuple[str, dict]) -> list[str]:
    log: list[str] = []
    callbacks = ["no:progress-bar", "no:checkpoint", "no:tensorboard"]
    callbacks += [OrderProbe(name, log, **marks) for name, marks in specs]
    make_trainer(callbacks=callbacks, max_epochs=1).fit(TinyRegressor(n=8))
    return log


def test_callbacks_run_last_given_first_and_tryfirst_trylast_move_them(make_trainer):
    assert epoch_end_order(make_trainer, ("a", {}), ("b", {})) == ["b", "a"]
    assert epoch_end_order(make_trainer, ("a", {"tryfirst": True}), ("b", {})) == ["a", "b"]
    assert epoch_end_order(make_trainer, ("a", {}), ("b", {"trylast": True})) == ["a", "b"]
    both_first = epoch_end_order(make_trainer, ("a", {"tryfirst": True}), ("b", {"tryfirst": True}))
    assert both_first == ["b", "a"]  # the last registered first
    both_last = epoch_end_order(make_trainer, ("a", {"trylast": True}), ("b", {"trylast": True}))
    assert both_last == ["a", "b"]  # the first registered first


def test_wrappers_nest_around_every_other_implementation(make_trainer):
    order = epoch_end_order(make_trainer, ("w1", {"wrapper": True}), ("w2", {"wrapper": True}),
                            ("a", {"tryfirst": True}))
    assert order == ["w2<", "w1<", "a", ">w1", ">w2"]
    order = epoch_end_order(make_trainer, ("w1", {"wrapper": True, "tryfirst": True}),
                            ("w2", {"wrapper": True}), ("a", {}))
    assert order == ["w1<", "w2<", "a", ">w2", ">w1"]


class TrylastOptimizer:
    """Replaces the optimizer from a ``trylast`` implementation of a hook with a default."""

    name = "trylast-optimizer"

    @ptrain.hookimpl(trylast=True)
    def wrap_optimizer(self, optimizer):
        self.replacement = torch.optim.SGD(optimizer.param_groups[0]["params"], lr=0.01)
        return self.replacement


def test_a_trylast_implementation_runs_before_the_loop_default(make_trainer):
    plugin = TrylastOptimizer()
    trainer = make_trainer(callbacks=["no:progress-bar", plugin], max_steps=1)
    trainer.fit(TinyRegressor(n=8))
    assert trainer.optimizers == [plugin.replacement]
