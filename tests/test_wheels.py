"""ptrain installs and works without the repository (issue 22).

Every first-party wheel and the core's sdist are built into a temporary wheelhouse
(``scripts/build_dists.sh``, which also runs ``twine check --strict``); a fresh virtual
environment gets torch (pinned) and those wheels only, through ``ptrain-core[all]``; and from an
empty folder, with nothing of the repository on the path: one version for all, every first-party
plugin listed, the packaged example trains, the model of "Your first model" (its code taken from
that page) trains on one device, with ddp in 2 processes and in bf16-mixed, ``ptrain
new-plugin``'s printed steps work as printed, and with the plugins uninstalled a first-party name
is answered with the distribution to install. Python 3.10, 3.12 and 3.13 answer ``--help`` and
``plugins`` from the core wheel (torch exists here for 3.11 only).

Slow (minutes: the environment is made from nothing but the package registries)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import ptrain
from ptrain.catalog import FIRST_PARTY
from tests._campaigns import WHOLE_TOOL_RUNS

pytestmark = [pytest.mark.slow, WHOLE_TOOL_RUNS]

REPO = Path(__file__).resolve().parent.parent
CONSTRAINTS = REPO / "constraints.txt"


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: int = 600):
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, (f"{shlex.join(command)} exited {result.returncode}:\n"
                                    f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def clean_env(venv: Path) -> dict[str, str]:
    """The environment of a shell in which ``venv`` is active and nothing of the repository
    is on the path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["PYTHONWARNINGS"] = "ignore:Editable installation"  # setuptools' note, see install.sh
    return env


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse")
    result = run(["bash", "scripts/build_dists.sh", str(out)], REPO, dict(os.environ))
    assert "PASSED" in result.stdout and "FAILED" not in result.stdout
    return out


@pytest.fixture(scope="module")
def installed(wheelhouse, tmp_path_factory):
    """(venv, env, an empty working folder): torch pinned, then every wheel of the house."""
    root = tmp_path_factory.mktemp("fresh")
    venv, work = root / "env", root / "work"
    work.mkdir()
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True)
    env = clean_env(venv)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c", str(CONSTRAINTS)]
    run([*pip, "torch==2.13.0"], work, env)
    wheels = sorted(str(w) for w in wheelhouse.glob("*.whl"))
    core = next(w for w in wheels if Path(w).name.startswith("ptrain_core-"))
    # the files themselves, so that no ptrain distribution can come from the index
    run([*pip, f"{core}[all]", *wheels], work, env)
    return venv, env, work


def ptrain_cli(installed, *args: str, timeout: int = 600):
    venv, env, work = installed
    return run([str(venv / "bin" / "ptrain"), *args], work, env, timeout)


def first_model_code() -> str:
    page = (REPO / "docs" / "first-model.md").read_text()
    return re.search(r"```python\n(# model\.py\n.*?)```", page, re.S).group(1)


def test_every_distribution_reports_the_one_version(installed):
    lines = ptrain_cli(installed, "--version").stdout.split()
    versions = dict(zip(lines[::2], lines[1::2]))
    expected = {"ptrain-core"} | {d for names in FIRST_PARTY.values() for d in names.values()}
    assert set(versions) == expected
    assert set(versions.values()) == {ptrain.__version__}


def test_plugins_lists_every_first_party_plugin(installed):
    listing = ptrain_cli(installed, "plugins").stdout
    for kind, names in FIRST_PARTY.items():
        for name, distribution in names.items():
            assert re.search(rf"^{kind}\s+{re.escape(name)}\s+{distribution}\s", listing, re.M), \
                (kind, name)


def test_the_packaged_example_trains(installed):
    ptrain_cli(installed, "example", "digits", "--max-epochs", "2", "--no-progress-bar",
               "--default-root-dir", "example-runs")
    assert (installed[2] / "example-runs" / "version_0" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize("flags", [[], ["--strategy", "ddp", "--devices", "2"],
                                   ["--precision", "bf16-mixed"]],
                         ids=["single-device", "ddp-2", "bf16-mixed"])
def test_a_model_written_in_an_empty_folder_trains(installed, flags):
    work = installed[2]
    (work / "model.py").write_text(first_model_code())
    root = f"runs-{'-'.join(flags) or 'plain'}"
    ptrain_cli(installed, "fit", "--model", "model:MoonClassifier", "--max-epochs", "3",
               "--no-progress-bar", "--default-root-dir", root, *flags)
    # the progress bar (on) says the metrics when validation ends
    result = ptrain_cli(installed, "validate", "--ckpt-path", "last", "--default-root-dir", root)
    said = result.stdout + result.stderr
    accuracy = float(re.search(r"val_acc=([0-9.]+)", said).group(1))
    assert accuracy > 0.8, said


def test_mlflow_records_to_its_default_store_right_after_the_install(installed):
    """``ptrain-core[all]`` brings what ``-p mlflow``'s default store (SQLite) needs (issue 34:
    it needed the full ``mlflow``, which ``[all]`` does not install)."""
    venv, env, work = installed
    (work / "model.py").write_text(first_model_code())
    ptrain_cli(installed, "fit", "--model", "model:MoonClassifier", "--max-epochs", "1",
               "--no-progress-bar", "--default-root-dir", "mlflow-runs", "-p", "mlflow")
    check = ("from mlflow import MlflowClient\n"
             "import pathlib\n"
             "uri = 'sqlite:///' + str(pathlib.Path('mlflow-runs/mlflow.db').resolve())\n"
             "client = MlflowClient(tracking_uri=uri)\n"
             "runs = client.search_runs([client.get_experiment_by_name('ptrain').experiment_id])\n"
             "print(len(runs), sorted(runs[0].data.metrics))\n")
    result = run([str(venv / "bin" / "python"), "-c", check], work, env)
    assert result.stdout.startswith("1 ") and "val_acc" in result.stdout, result.stdout


def test_the_lr_finder_runs_without_matplotlib(installed):
    """matplotlib only draws the LR finder's plot: ``[all]`` does not install it, and the
    search still runs, writes its numbers and says how to get the plot (issue 34)."""
    venv, env, work = installed
    absent = run([str(venv / "bin" / "python"), "-c",
                  "import importlib.util; print(importlib.util.find_spec('matplotlib'))"],
                 work, env)
    assert absent.stdout.strip() == "None"
    (work / "model.py").write_text(first_model_code())
    result = ptrain_cli(installed, "fit", "--model", "model:MoonClassifier", "--no-progress-bar",
                        "--default-root-dir", "finder-runs", "-p", "lr-finder",
                        "--lr-finder-then", "stop")
    said = result.stdout + result.stderr
    assert "lr-finder: suggested lr" in said and "pip install matplotlib" in said, said
    assert list((work / "finder-runs").glob("version_*/lr_finder.json"))
    assert not list((work / "finder-runs").glob("version_*/lr_finder.png"))


def test_new_plugin_steps_work_as_printed(installed):
    venv, env, work = installed
    printed = ptrain_cli(installed, "new-plugin", "my-callback", "--kind", "callback").stdout
    steps = re.findall(r"^  (\S.*?)\s+# ", printed.split("Next:")[1], re.M)
    assert [s.split()[0] for s in steps] == ["pip", "ptrain", "ptrain", "pytest"], steps
    for step in steps:
        if "MODULE:CLASS" in step:  # the one placeholder: the user's model
            step = step.replace("MODULE:CLASS", "model:MoonClassifier") + \
                " --max-epochs 1 --no-progress-bar --default-root-dir plugin-runs"
            (work / "model.py").write_text(first_model_code())
        result = run(["bash", "-c", step], work, env)
        if step == "ptrain plugins":
            assert re.search(r"^callback\s+my-callback\s+ptrain-my-callback\s", result.stdout,
                             re.M)


def test_with_the_core_alone_a_first_party_name_says_what_to_install(installed):
    venv, env, work = installed
    plugins = sorted({d for names in FIRST_PARTY.values() for d in names.values()})
    run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y",
         "ptrain-my-callback", *plugins], work, env)
    result = subprocess.run([str(venv / "bin" / "ptrain"), "fit", "--model",
                             "model:MoonClassifier", "--strategy", "ddp"], cwd=work, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "pip install ptrain-ddp" in result.stderr
    result = subprocess.run([str(venv / "bin" / "ptrain"), "fit", "--model",
                             "model:MoonClassifier", "--accelerator", "cuda"],
                            cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert "pip install ptrain-cuda" in result.stderr and "Did you mean 'cpu'" not in result.stderr


def other_pythons() -> list[str]:
    """Python 3.10, 3.12 and 3.13 interpreters found here (pyenv's or on the PATH)."""
    found = []
    for minor in ("3.10", "3.12", "3.13"):
        candidates = sorted(Path.home().glob(f".pyenv/versions/{minor}.*/bin/python{minor}"))
        for candidate in [*map(str, candidates), f"python{minor}"]:
            probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"],
                                   capture_output=True, text=True)
            if probe.returncode == 0:
                found.append(candidate)
                break
    return found


@pytest.mark.parametrize("python", other_pythons() or
                         [pytest.param(None, marks=pytest.mark.skip("no Python 3.10, 3.12 or "
                                                                    "3.13 on this machine"))])
def test_other_pythons_answer_help_and_plugins_from_the_core_wheel(python, wheelhouse,
                                                                   tmp_path):
    """No torch is needed for these (and none exists here for other versions than 3.11): the
    core wheel and its light dependencies are enough, tomli standing in for tomllib on 3.10."""
    venv = tmp_path / "env"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    env = clean_env(venv)
    core = next(wheelhouse.glob("ptrain_core-*.whl"))
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    run([*pip, "--no-deps", str(core)], tmp_path, env)
    run([*pip, "pluggy>=1.5,<2", "rich>=13", "tomli>=1.1"], tmp_path, env)
    help_text = run([str(venv / "bin" / "python"), "-m", "ptrain", "--help"], tmp_path, env)
    assert "new-plugin" in help_text.stdout
    listing = run([str(venv / "bin" / "ptrain"), "plugins"], tmp_path, env).stdout
    assert re.search(r"^accelerator\s+cpu\s+ptrain-core\s", listing, re.M)


def test_with_examples_the_wheelhouse_also_holds_the_example_plugins(tmp_path):
    """What scripts/gpu-check.sh --wheels installs on a GPU machine, where the conformance suite
    runs the example plugins too; an unknown option is refused before anything is built."""
    refused = subprocess.run(["bash", "scripts/build_dists.sh", "--examples", str(tmp_path / "x")],
                             cwd=REPO, capture_output=True, text=True)
    assert refused.returncode == 2
    assert "unknown option '--examples'" in refused.stderr and "--with-examples" in refused.stderr
    assert not (tmp_path / "x").exists()
    out = tmp_path / "house"
    run(["bash", "scripts/build_dists.sh", "--with-examples", str(out)], REPO, dict(os.environ))

    def wheel_names(pattern: str) -> set[str]:
        return {tomllib.loads(p.read_text())["project"]["name"].replace("-", "_")
                for p in REPO.glob(pattern)}

    examples = wheel_names("examples/plugins/*/pyproject.toml")
    assert examples, "no example plugins found"
    built = {w.name.split("-")[0] for w in out.glob("*.whl")}
    assert examples | wheel_names("plugins/*/*/pyproject.toml") | {"ptrain_core"} == built
