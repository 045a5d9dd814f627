"""Every first-party distribution carries honest, consistent metadata (issue 22): one version
(``ptrain.__version__``) and the compatible range of it wherever one distribution requires
another, the Apache-2.0 licence and its file, registered classifiers, a README and a
``py.typed`` marker; the core knows every first-party plugin name and installs them all with its
``all`` extra. The wheels themselves are built and installed in ``test_wheels.py``."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from trove_classifiers import classifiers as REGISTERED

import ptrain
from ptrain._version import compatible_range
from ptrain.catalog import FIRST_PARTY, GROUPS

REPO = Path(__file__).resolve().parent.parent
PLUGINS = sorted(REPO.glob("plugins/*/*/pyproject.toml"))
PROJECTS = [REPO / "pyproject.toml", *PLUGINS]


def project(path: Path) -> dict:
    return tomllib.loads(path.read_text())["project"]


def requirements(meta: dict) -> list[Requirement]:
    extras = meta.get("optional-dependencies", {})
    return [Requirement(r) for r in [*meta["dependencies"], *(x for v in extras.values()
                                                              for x in v)]]


def first_party_names() -> set[str]:
    return {project(p)["name"] for p in PROJECTS}


def test_set_version_finds_every_file_at_the_one_version():
    result = subprocess.run([sys.executable, "scripts/set_version.py", "--check"], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    for path in PLUGINS:
        assert project(path)["version"] == ptrain.__version__, path
    assert project(REPO / "pyproject.toml")["dynamic"] == ["version"]


@pytest.mark.parametrize("path", PROJECTS, ids=lambda p: project(p)["name"])
def test_metadata_of_each_distribution(path):
    meta = project(path)
    folder = path.parent
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    assert (folder / "LICENSE").read_bytes() == (REPO / "LICENSE").read_bytes()
    assert (folder / meta["readme"]).is_file()
    assert meta["requires-python"] == ">=3.10"
    assert meta["authors"] and {"Homepage", "Source", "Changelog"} <= set(meta["urls"])
    unregistered = [c for c in meta["classifiers"] if c not in REGISTERED]
    assert not unregistered, f"classifiers PyPI would refuse: {unregistered}"
    assert "Typing :: Typed" in meta["classifiers"]
    assert "ptrain" in meta["keywords"]
    build = tomllib.loads(path.read_text())["build-system"]["requires"]
    assert build == ["setuptools>=77"]  # PEP 639 licence metadata
    for requirement in requirements(meta):
        if requirement.name in first_party_names():
            assert requirement.specifier == SpecifierSet(compatible_range(ptrain.__version__)), \
                requirement
        elif requirement.name == "torch":
            assert requirement.specifier == SpecifierSet(">=2.13"), "the torch the suite runs on"
        elif requirement.name == "pluggy":
            assert requirement.specifier == SpecifierSet(">=1.5,<2")
        else:
            assert requirement.specifier, (
                f"{requirement.name}: state the oldest release that is known to work")


#: where the long descriptions' links point: a package index page can't resolve a path
SOURCE = "https://github.com/ptrain-dev/ptrain/blob/main/"
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("path", PROJECTS, ids=lambda p: project(p)["name"])
def test_the_long_description_links_work_on_an_index_page(path):
    """Every link of the README that is the distribution's long description is absolute, and
    one into the repository names a file that is there."""
    readme = path.parent / project(path)["readme"]
    for target in LINK.findall(readme.read_text(encoding="utf-8")):
        assert re.match(r"(https?://|mailto:)", target), f"{readme}: relative link {target}"
        if target.startswith(SOURCE):
            in_repo = target[len(SOURCE):].split("#")[0]
            assert (REPO / in_repo).exists(), f"{readme}: {target} names a missing file"


@pytest.mark.parametrize("path", PROJECTS, ids=lambda p: project(p)["name"])
def test_every_package_is_marked_typed(path):
    setuptools = tomllib.loads(path.read_text())["tool"]["setuptools"]
    if isinstance(setuptools["packages"], list):
        packages = [path.parent / name for name in setuptools["packages"]]
    else:
        packages = [path.parent / setuptools["packages"]["find"]["where"][0] / "ptrain"]
    for package in packages:
        assert (package / "py.typed").is_file(), package


def test_the_core_knows_every_first_party_plugin_and_its_distribution():
    declared = {kind: {} for kind in GROUPS}
    for path in PLUGINS:
        entry_points = tomllib.loads(path.read_text())["project"].get("entry-points", {})
        for kind, group in GROUPS.items():
            for name in entry_points.get(group, {}):
                declared[kind][name] = project(path)["name"]
    assert FIRST_PARTY == declared


def test_the_all_extra_installs_every_first_party_plugin():
    extra = project(REPO / "pyproject.toml")["optional-dependencies"]["all"]
    named = {Requirement(r).name for r in extra}
    assert {project(p)["name"] for p in PLUGINS} <= named


def test_the_train_extra_is_every_plugin_that_needs_nothing_beyond_the_core():
    """``[train]``: the plugins whose own requirements are ptrain's, torch and numpy (which the
    core brings); the others (the MLflow and W&B loggers) only in ``[all]``."""
    extras = project(REPO / "pyproject.toml")["optional-dependencies"]
    train = {Requirement(r).name for r in extras["train"]}
    light = {project(p)["name"] for p in PLUGINS
             if all(Requirement(r).name.startswith("ptrain-") or Requirement(r).name in
                    ("torch", "numpy") for r in project(p).get("dependencies", []))}
    assert train == light
    assert {Requirement(r).name for r in extras["all"]} >= train | {"ptrain-mlflow",
                                                                     "ptrain-wandb"}


def test_the_changelog_has_a_section_for_the_version_or_what_is_unreleased():
    text = (REPO / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text or f"## [{ptrain.__version__}]" in text


def test_a_new_plugin_requires_the_core_range_it_was_written_against(tmp_path):
    from ptrain.scaffold import new_plugin

    made = new_plugin("demo-cb", "callback", str(tmp_path / "demo"))
    meta = project(made.folder / "pyproject.toml")
    core = next(Requirement(r) for r in meta["dependencies"] if r.startswith("ptrain-core"))
    assert core.specifier == SpecifierSet(compatible_range(ptrain.__version__))
    assert "ptrain-plugin" in meta["keywords"]
