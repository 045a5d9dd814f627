"""Every public name of Lightning 2.6's ``lightning.pytorch`` (enumerated from Lightning 2.6.6,
installed as the oracle) exists under ``ptrain.lightning`` at the same module path, imports
without being used, is listed in docs/from-lightning.md, and either works (a smoke use) or
refuses with one paragraph saying what to do. See tests/lightning_names/."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from lightning_names import (MODULES, documented_names, ptrain_module_name, public_names,
                             smoke_file, smoke_uses)

DOCS = Path(__file__).parents[1] / "docs" / "from-lightning.md"
COVERED = [m for m in MODULES if smoke_file(m).exists()]
NAMES = [(m, n) for m in COVERED for n in public_names(m)]


@pytest.mark.parametrize("module, name", NAMES, ids=[f"{m or 'pl'}.{n}" for m, n in NAMES])
def test_the_name_imports_is_documented_and_works_or_refuses(module, name):
    ptrain_module = importlib.import_module(ptrain_module_name(module))
    assert hasattr(ptrain_module, name), f"{ptrain_module_name(module)} has no {name}"
    section = ptrain_module_name(module)
    assert name in documented_names(section, DOCS.read_text()), \
        f"{name} is not listed under ### `{section}` in docs/from-lightning.md"
    uses = smoke_uses(module)
    assert name in uses, f"{smoke_file(module).name} has no smoke use for {name}"
    uses[name]()


@pytest.mark.parametrize("module", COVERED)
def test_the_smoke_table_names_only_lightnings_names(module):
    extra = set(smoke_uses(module)) - set(public_names(module))
    assert not extra, f"{smoke_file(module).name} tests names Lightning does not have: {extra}"


@pytest.mark.parametrize("module", MODULES)
def test_the_lightning_pytorch_path_is_the_same_module(module):
    """``lightning`` replaced by ``ptrain.lightning`` everywhere in a program's imports turns
    ``lightning.pytorch.X`` into ``ptrain.lightning.pytorch.X``: that is the module
    ``ptrain.lightning.X`` itself, not a second copy of it (whose classes would be others)."""
    suffix = f".{module}" if module else ""
    alias = importlib.import_module(f"ptrain.lightning.pytorch{suffix}")
    assert alias is importlib.import_module(ptrain_module_name(module))
    assert alias.__spec__.name == ptrain_module_name(module)  # reload and pickling see its name


def test_a_lightning_pytorch_submodule_of_a_submodule_is_the_same_module():
    from ptrain.lightning.callbacks.early_stopping import EarlyStopping
    from ptrain.lightning.pytorch.callbacks.early_stopping import EarlyStopping as aliased

    assert aliased is EarlyStopping


def test_get_filesystem_imports_from_core_saving_as_lightnings(tmp_path):
    """``from lightning.pytorch.core.saving import get_filesystem`` (Lightning re-exports it
    there): the same fsspec filesystem as Lightning's, for a path and for a URL."""
    from lightning.pytorch.core.saving import get_filesystem as lightnings

    from ptrain.lightning.core.saving import get_filesystem

    (tmp_path / "a.txt").write_text("x")
    fs = get_filesystem(tmp_path / "a.txt")
    assert type(fs) is type(lightnings(tmp_path / "a.txt"))
    with fs.open(str(tmp_path / "a.txt"), "rb") as file:
        assert file.read() == b"x"
    assert type(get_filesystem("memory://here")) is type(lightnings("memory://here"))


def test_tuner_imports_from_lightnings_tuning_module():
    """``from lightning.pytorch.tuner.tuning import Tuner`` (the module Lightning defines it
    in) works with ``ptrain.lightning`` in its place."""
    from ptrain.lightning.tuner import Tuner
    from ptrain.lightning.tuner.tuning import Tuner as from_tuning

    assert from_tuning is Tuner


#: checks, in a fresh interpreter, that each submodule Lightning's packages hold as an attribute
#: once ``import lightning.pytorch`` has run is one of ptrain's after ``import ptrain.lightning``
#: alone, wherever ptrain has that module
_BOUND_SUBMODULES = r"""
import importlib, pkgutil, sys, types
import ptrain.lightning as ours
import lightning.pytorch as theirs

missing = []
for package in ("", "callbacks", "core", "loggers", "profilers", "tuner", "utilities"):
    lightning = importlib.import_module("lightning.pytorch" + (package and "." + package))
    own = "ptrain.lightning" + (package and "." + package)
    files = {m.name for m in pkgutil.iter_modules(importlib.import_module(own).__path__)}
    for name, value in vars(lightning).items():
        if isinstance(value, types.ModuleType) and name in files:
            holder = ours
            for part in [p for p in package.split(".") if p] + [name]:
                holder = getattr(holder, part, None)
            if not isinstance(holder, types.ModuleType):
                missing.append(f"{own}.{name}")
print(missing)
sys.exit(1 if missing else 0)
"""


def test_a_submodule_lightning_binds_is_an_attribute_without_an_import_of_its_own():
    """``pl.callbacks.early_stopping.EarlyStopping`` (PyTorch Tabular reads it so) and
    ``pl.core.saving``, ``pl.tuner.tuning``, ``pl.profilers.simple`` after ``import
    ptrain.lightning as pl`` alone, as after ``import lightning.pytorch as pl``."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _BOUND_SUBMODULES], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
