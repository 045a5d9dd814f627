"""Lightning's own tests of user-facing behaviour, run against ``ptrain.lightning`` with their
imports rewritten: per-file pass rates of the tests that use only Lightning's public API, and
every failure grouped by cause (issue 33, "a peer's test suite").

Nothing of Lightning is kept in this repository: the tests are read from a checkout of
Lightning's GitHub repository (``--lightning-repo``, a bare git directory is fine; ``--ref``,
default the release ``2.6.5``) at run time, into a temporary folder outside the repository, and
only outcomes and error messages are written to ``--out``.

What runs
    Two groups of files under ``tests/tests_pytorch`` (``--group``): ``issue``, the files issue 33
    names (logging from the train and eval loops, ModelCheckpoint, EarlyStopping, the hooks test,
    manual optimization, LightningCLI), and ``central``, other files of user-facing behaviour
    (the Trainer, its flags and properties, resume, hyperparameters, data loaders, optimizers,
    LearningRateMonitor, the CSV and TensorBoard loggers, callbacks). Copied with them: what they
    import from ``tests_pytorch`` (the helpers), every ``__init__.py`` on the way and the
    ``conftest.py`` files above them. Each file runs in its own pytest process, twice: as it is,
    under the installed Lightning (the baseline: which tests pass on this machine), and rewritten,
    under ptrain. pytest runs with ``-p no:cacheprovider`` and the options of Lightning's own
    ``[tool.pytest.ini_options]`` (strict markers, its warning filters, strict xfail), read from
    the checkout. ``lightning_peer_plugin.py`` (loaded into each process) writes one JSON line
    per test phase and limits each phase to ``--timeout`` seconds; a process that dies in a test
    (a hang past three times the limit, a crash) is resumed after that test, which is recorded as
    crashed.

What is rewritten, and why
    In every copied ``.py`` file (tests, helpers, conftests), the words ``lightning.pytorch`` and
    ``pytorch_lightning`` become ``ptrain.lightning``, in import lines and everywhere else (string
    targets of ``mock.patch``, logger names): the change a user makes to a program, applied by
    ``sed``. Three things are left as they are, each a fact about this machine rather than the
    trainer: ``lightning.fabric`` and ``lightning_utilities`` (utilities the tests use to read a
    checkpoint or check a warning; ``lightning/__init__.py`` imports ``lightning.pytorch``, so
    Lightning is loaded in the ptrain run too, unused by the rewritten tests);
    ``lightning.pytorch.utilities.imports`` (package-availability flags such as
    ``_OMEGACONF_AVAILABLE`` that decide which tests apply here); and
    ``tests_pytorch/helpers/runif.py`` (``RunIf``: skips tests that need a GPU, a package, an
    OS). A module-level import of a name ``ptrain.lightning`` lacks does not fail the whole file:
    it binds a stand-in, and each test whose source uses that name (directly or through the
    module's helpers and fixtures) fails at set-up with the ``ImportError`` a user would see.
    The module-level ``from lightning.pytorch... import`` lines of a ``conftest.py`` stay on
    Lightning: conftests are the harness, and those lines import the probes of its autouse
    hygiene fixtures (is XLA present, which signals exist); the rest of a conftest is rewritten
    (its fixtures that fake GPU counts patch ``ptrain.lightning``; ``rank_zero_only`` is reset
    on ptrain's), and its list of environment variables a test may leave set, which holds
    ``PL_GLOBAL_SEED`` (set by ``seed_everything``), also holds ptrain's counterpart,
    ``PTRAIN_GLOBAL_SEED`` (COUNTERPART_VARIABLES).

Which tests are public-API (decided from the test's source, read with ``ast``)
    A test's source is its function (decorators and parameters included, ``RunIf``/``skipif``
    conditions excluded), its class's other members, the module-level functions, classes and
    values it uses (through the helpers' modules too), the fixtures it asks for (module or
    conftest) and the module's autouse fixtures. It is *internal* when that source:

    * imports or names a Lightning path outside the public modules: ``lightning.pytorch``
      itself and ``accelerators``, ``callbacks``, ``cli``, ``core``, ``demos``, ``loggers``,
      ``plugins``, ``profilers``, ``strategies``, ``tuner``, ``utilities`` and their submodules
      (the modules whose public names ``tests/lightning_names`` mirrors), plus
      ``trainer.states`` (the enums of ``Trainer.state``, a documented property); a path with a
      ``_`` part is never public. ``loops``, ``trainer.connectors``,
      ``trainer.configuration_validator``, ``overrides`` and the like are internal. An object
      also reachable under a public path (``lightning.pytorch.trainer.Trainer``) is public;
    * reads or writes an attribute starting with ``_`` (not a dunder) that the test's own
      classes do not define (``trainer._results``, ``self._current_fx_name``), or overrides a
      ``_`` method of a Lightning base class (``ModelCheckpoint._save_checkpoint``); attributes
      of non-Lightning modules (``torch._dynamo``, ``os._exit``) do not count;
    * reaches the loops: ``fit_loop``, ``validate_loop``, ``test_loop``, ``predict_loop``,
      ``epoch_loop``, progress trackers;
    * patches Lightning: ``mock.patch``/``monkeypatch.setattr`` of a ``lightning...`` target, of
      a Lightning class or module, of an object reached through the trainer (``trainer``,
      ``strategy``, ``accelerator``, ``precision``, a loop or connector), or of a ``_`` name; or
      fakes the hardware or environment (``torch.cuda``/``torch.distributed``/``torch.backends``
      targets, ``sys.modules``); the conftest fixtures that fake GPU or TPU counts count through
      their source. Patching ``sys.argv``, ``os.environ`` or the test's own model (a spy on
      ``training_step``) is public.

    Otherwise it is *public*. From the failure text: a public test whose only failure under
    ptrain is Lightning's wording (``pytest.raises(..., match=...)`` not matching the message of
    the error that was raised, ``pytest.warns`` not seeing Lightning's warning, or
    ``no_warning_call`` seeing one) is counted as *wording*, not public: Lightning's messages are
    not its API. A different exception type, no exception, or a match failing on the text of
    an error Python raised for a bug (``'NoneType' object has no attribute ...``) stays a public
    failure.

    The aim (issue 33): at least 80% of the public-API tests that pass under Lightning pass
    under ptrain.

Output (``--out``, default ``benchmarks/results/lightning-peer-tests``)
    ``results.json``: every test with its outcome in both runs (first lines of the error, the
    deepest frame in ptrain's code), its classification and the reasons; per-file counts; the
    failure classes (public-API failures grouped by a normalised first error line, most frequent
    first, with an example test and its full first line); what could not run here (skipped or
    failing under Lightning, by reason). ``summary.txt``: the table, the top 30 classes and the
    exclusions, as printed.

Run from the repository root (both runs of both groups: about an hour on 2 busy cores)::

    .venv/bin/python benchmarks/lightning_peer_tests.py
    .venv/bin/python benchmarks/lightning_peer_tests.py --group issue --jobs 2
    .venv/bin/python benchmarks/lightning_peer_tests.py --baseline-json \\
        benchmarks/results/lightning-peer-tests/results.json   # ptrain run only
    .venv/bin/python benchmarks/lightning_peer_tests.py --files callbacks/test_early_stopping.py
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import datetime
import importlib
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import types
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
MIRROR = Path("/work/.mirror/Lightning-AI+pytorch-lightning/repo")
DEFAULT_REF = "2.6.5"
DEFAULT_OUT = HERE / "results" / "lightning-peer-tests"
TESTS = "tests/tests_pytorch"
#: the temporary folder's trees: Lightning's files as they are, and rewritten for ptrain
TREES = {"lightning": "as-is", "ptrain": "rewritten"}

GROUPS: dict[str, list[str]] = {
    "issue": [
        "trainer/logging_/test_train_loop_logging.py",
        "trainer/logging_/test_eval_loop_logging.py",
        "trainer/logging_/test_logger_connector.py",
        "trainer/logging_/test_loop_logging.py",
        "checkpointing/test_model_checkpoint.py",
        "callbacks/test_early_stopping.py",
        "models/test_hooks.py",
        "trainer/optimization/test_manual_optimization.py",
        "test_cli.py",
    ],
    "central": [
        "trainer/test_trainer.py",
        "trainer/flags/*.py",
        "trainer/properties/test_log_dir.py",
        "trainer/properties/test_loggers.py",
        "trainer/properties/test_estimated_stepping_batches.py",
        "trainer/test_dataloaders.py",
        "trainer/optimization/test_optimizers.py",
        "checkpointing/test_trainer_checkpoint.py",
        "checkpointing/test_checkpoint_callback_frequency.py",
        "models/test_restore.py",
        "models/test_hparams.py",
        "core/test_lightning_module.py",
        "core/test_datamodules.py",
        "callbacks/test_lr_monitor.py",
        "callbacks/test_callbacks.py",
        "callbacks/test_lambda_function.py",
        "loggers/test_csv.py",
        "loggers/test_tensorboard.py",
    ],
}

#: Lightning's public modules (relative to ``lightning.pytorch``): tests/lightning_names' list,
#: plus ``trainer.states`` (the enums of the documented ``Trainer.state``)
PUBLIC_TOP = ("accelerators", "callbacks", "cli", "core", "demos", "loggers", "plugins",
              "profilers", "strategies", "tuner", "utilities")
PUBLIC_EXTRA = (("trainer", "states"),)
#: left on Lightning in the rewritten files (see the module docstring)
KEEP_MODULES = ("lightning.pytorch.utilities.imports",)
KEEP_FILES = ("tests_pytorch/helpers/runif.py",)
#: environment variables ptrain sets where Lightning sets the key: the conftest's check for
#: leaked variables allows the value where it allows the key
COUNTERPART_VARIABLES = {"PL_GLOBAL_SEED": "PTRAIN_GLOBAL_SEED"}
#: attributes that reach Lightning's loops
LOOP_ATTRS = {"fit_loop", "validate_loop", "test_loop", "predict_loop", "epoch_loop",
              "val_loop", "batch_progress", "epoch_progress", "optim_progress",
              "manual_optimization", "automatic_optimization_loop", "optimizer_loop"}
#: words in a patched object's expression that say it belongs to the trainer, not the test
TRAINER_OWNED = ("trainer", "strategy", "accelerator", "precision", "loop", "connector")
FAKE_ENV_TARGETS = ("torch.cuda", "torch.backends", "torch.distributed", "torch.mps",
                    "torch.xpu", "torch.xla", "sys.modules")
#: decorators that decide where a test runs, not what it does
GATES = ("RunIf", "pytest.mark.skipif", "pytest.mark.xfail", "_xfail_gloo_windows")
#: a wording-only failure under ptrain (see "Which tests are public-API")
WORDING = re.compile(r"^(Regex pattern did not match|DID NOT WARN|Expected no warnings|"
                     r"Did not expect)|Expected to find no warnings|Expected no call",
                     re.IGNORECASE)

#: the text of an error Python raised for a bug, not a message written for the user
PYTHON_ERROR = re.compile(r"Actual message: .*(object has no attribute|NoneType|is not callable|"
                          r"unexpected keyword argument|required positional argument)")


# --- checkout and selection ---------------------------------------------------------------------

def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


def list_tree(repo: Path, ref: str) -> list[str]:
    """Paths under tests/tests_pytorch at ``ref``, relative to ``tests/``."""
    names = git(repo, "ls-tree", "-r", "--name-only", ref, TESTS).split("\n")
    return [n.removeprefix("tests/") for n in names if n.endswith((".py", ".toml"))]


def read_blob(repo: Path, ref: str, path: str) -> str:
    return git(repo, "show", f"{ref}:{path}")


def select(tree: list[str], patterns: Iterable[str]) -> list[str]:
    """Test files (relative to tests/tests_pytorch) matching ``patterns`` (a ``*`` glob each)."""
    available = sorted(n.removeprefix("tests_pytorch/") for n in tree)
    chosen: list[str] = []
    for pattern in patterns:
        rx = re.compile("^" + re.escape(pattern).replace(r"\*", "[^/]*") + "$")
        hits = [n for n in available if rx.match(n) and Path(n).name.startswith("test_")]
        if not hits:
            raise SystemExit(f"no file under {TESTS} matches {pattern!r}")
        chosen += [h for h in hits if h not in chosen]
    return chosen


def module_name(rel: str) -> str:
    """``tests_pytorch/a/b.py`` -> ``tests_pytorch.a.b`` (an ``__init__`` -> its package)."""
    parts = rel.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def tests_imports(source: str) -> set[str]:
    """The ``tests_pytorch`` modules ``source`` imports (anywhere in it)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests_pytorch"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tests_pytorch"))
    return found


def files_needed(repo: Path, ref: str, tree: list[str], tests: list[str]) -> dict[str, str]:
    """Every file the selected tests need (relative to tests/) -> its text: the tests, what
    they import from tests_pytorch, the ``__init__.py`` and ``conftest.py`` above each."""
    by_module = {module_name(n): n for n in tree if n.endswith(".py")}
    wanted = [f"tests_pytorch/{t}" for t in tests]
    texts: dict[str, str] = {}
    while wanted:
        rel = wanted.pop()
        if rel in texts:
            continue
        texts[rel] = read_blob(repo, ref, f"tests/{rel}")
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            for extra in ("__init__.py", "conftest.py"):
                candidate = "/".join(parts[:depth] + [extra])
                if candidate in tree and candidate not in texts:
                    wanted.append(candidate)
        for imported in tests_imports(texts[rel]):
            if imported in by_module:
                wanted.append(by_module[imported])
    return texts


def pytest_ini(repo: Path, ref: str) -> str:
    """Lightning's pytest options (from its pyproject at ``ref``) that change outcomes."""
    config = tomllib.loads(read_blob(repo, ref, "pyproject.toml"))
    options = config.get("tool", {}).get("pytest", {}).get("ini_options", {})
    addopts = [o for o in options.get("addopts", [])
               if o in ("--strict-markers", "--disable-pytest-warnings")]
    lines = ["[pytest]", "addopts = " + " ".join(addopts)]
    for key in ("markers", "filterwarnings"):
        if options.get(key):
            lines.append(f"{key} =")
            lines += [f"    {value}" for value in options[key]]
    if "xfail_strict" in options:
        lines.append(f"xfail_strict = {str(options['xfail_strict']).lower()}")
    return "\n".join(lines) + "\n"


# --- the rewrite --------------------------------------------------------------------------------

_LIGHTNING_WORD = re.compile(r"(?<![\w.])(?:lightning\.pytorch|pytorch_lightning)(?!\w)")


def rewrite_text(text: str) -> str:
    """``lightning.pytorch``/``pytorch_lightning`` -> ``ptrain.lightning``, except KEEP_MODULES."""
    kept = {}
    for i, module in enumerate(KEEP_MODULES):
        token = f"__PEER_KEEP_{i}__"
        kept[token] = module
        text = text.replace(module, token)
    text = _LIGHTNING_WORD.sub("ptrain.lightning", text)
    for token, module in kept.items():
        text = text.replace(token, module)
    return text


def _module_level(body: list[ast.stmt]) -> Iterable[tuple[ast.stmt, list[ast.stmt]]]:
    """Statements run when the module is imported (into if/try/with, not into def/class), each
    with the block that holds it."""
    for stmt in body:
        yield stmt, body
        for name in ("body", "orelse", "finalbody"):
            if isinstance(stmt, (ast.If, ast.Try, ast.With)) and getattr(stmt, name, None):
                yield from _module_level(getattr(stmt, name))
        for handler in getattr(stmt, "handlers", []):
            yield from _module_level(handler.body)


def tolerant_imports(text: str, conftest: bool) -> str:
    """Module-level imports from ``ptrain.lightning`` rewritten to bind a stand-in for what is
    missing (lightning_peer_plugin.peer_from); the line count is kept, so tracebacks match."""
    lines = text.split("\n")
    tree = ast.parse(text)
    edits = []
    for stmt, block in _module_level(tree.body):
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            continue
        if any(other is not stmt and other.lineno <= stmt.end_lineno
               and other.end_lineno >= stmt.lineno for other in block):
            continue  # shares a line with another statement: left as it is
        plugin = "__import__('lightning_peer_plugin')"
        if isinstance(stmt, ast.ImportFrom):
            if not (stmt.module or "").startswith("ptrain.lightning") or stmt.level:
                continue
            pairs = tuple((a.name, a.asname or a.name) for a in stmt.names)
            if any(name == "*" for name, _ in pairs):
                continue
            if conftest:  # the hygiene fixtures' probes: left on Lightning
                names = ", ".join(n if n == local else f"{n} as {local}" for n, local in pairs)
                original = stmt.module.replace("ptrain.lightning", "lightning.pytorch", 1)
                code = f"from {original} import {names}"
            else:
                targets = ", ".join(local for _, local in pairs) + ","
                code = (f"({targets}) = {plugin}.peer_from({stmt.module!r}, {pairs!r}, "
                        "__name__)")
        else:
            if len(stmt.names) != 1 or not stmt.names[0].name.startswith("ptrain.lightning."):
                continue
            alias = stmt.names[0]
            local = alias.asname or alias.name.split(".")[0]
            code = f"{local} = {plugin}.peer_module({alias.name!r}, __name__, {local!r})"
        edits.append((stmt.lineno, stmt.end_lineno, stmt.col_offset, code))
    for start, end, col, code in sorted(edits, reverse=True):
        lines[start - 1:end] = [" " * col + code] + [""] * (end - start)
    return "\n".join(lines)


def write_tree(root: Path, texts: dict[str, str], ini: str, rewrite: bool) -> None:
    for rel, text in texts.items():
        if rewrite and rel not in KEEP_FILES:
            text = rewrite_text(text)
            if rel.endswith("conftest.py"):
                for lightnings, ptrains in COUNTERPART_VARIABLES.items():
                    text = text.replace(f'"{lightnings}",', f'"{lightnings}", "{ptrains}",')
            if rel.endswith(".py"):
                text = tolerant_imports(text, conftest=rel.endswith("conftest.py"))
        path = root / "tests" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "pytest.ini").write_text(ini)


# --- which tests are public-API -----------------------------------------------------------------

@dataclass
class Module:
    name: str
    rel: str
    tree: ast.Module
    defs: dict[str, list[ast.AST]] = field(default_factory=dict)
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)


def index_module(rel: str, text: str) -> Module:
    mod = Module(module_name(rel), rel, ast.parse(text))
    for stmt, _ in _module_level(mod.tree.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            mod.defs.setdefault(stmt.name, []).append(stmt)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                for node in ast.walk(target):
                    if isinstance(node, ast.Name):
                        mod.defs.setdefault(node.id, []).append(stmt)
        elif isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
            for a in stmt.names:
                mod.imports[a.asname or a.name] = (stmt.module, a.name)
        elif isinstance(stmt, ast.Import):
            for a in stmt.names:
                local = a.asname or a.name.split(".")[0]
                mod.imports[local] = (a.name if a.asname else local, None)
    return mod


def is_lightning(module: str) -> bool:
    return module == "lightning" or module.startswith(("lightning.pytorch", "pytorch_lightning"))


def _call_name(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001
        return ""


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class Classifier:
    """Public-API or internal, per test, from the source (see the module docstring)."""

    def __init__(self, modules: dict[str, Module]):
        self.modules = modules
        self.public_ids = self._public_objects()
        self._path_cache: dict[str, bool] = {}

    @staticmethod
    def _public_objects() -> set[int]:
        sys.path.insert(0, str(REPO / "tests"))
        try:
            from lightning_names import MODULES, lightning_module_name, public_names
        finally:
            sys.path.pop(0)
        ids = set()
        for m in MODULES:
            mod = importlib.import_module(lightning_module_name(m))
            ids.add(id(mod))
            for name in public_names(m):
                obj = getattr(mod, name, None)
                if isinstance(obj, (type, types.FunctionType, types.ModuleType)):
                    ids.add(id(obj))
        return ids

    def public_path(self, dotted: str) -> bool:
        """Is ``lightning.pytorch.<...>`` (a module, or a name in one) public?"""
        if dotted in self._path_cache:
            return self._path_cache[dotted]
        rest = re.sub(r"^(lightning\.pytorch|pytorch_lightning)\.?", "", dotted)
        parts = rest.split(".") if rest else []
        ok = not any(p.startswith("_") and not _is_dunder(p) for p in parts) and (
            not parts or parts[0] in PUBLIC_TOP
            or any(tuple(parts[:len(e)]) == e for e in PUBLIC_EXTRA)
            or (len(parts) == 1 and self._resolves_public("lightning.pytorch", parts[0])))
        if not ok and parts and not parts[-1].startswith("_"):
            ok = self._resolves_public("lightning.pytorch." + ".".join(parts[:-1]), parts[-1])
        self._path_cache[dotted] = ok
        return ok

    def _resolves_public(self, module: str, name: str) -> bool:
        module = module.rstrip(".").replace("pytorch_lightning", "lightning.pytorch")
        try:
            obj = getattr(importlib.import_module(module), name)
        except Exception:  # noqa: BLE001
            try:
                obj = importlib.import_module(f"{module}.{name}")
            except Exception:  # noqa: BLE001
                return False
        return _is_dunder(name) or id(obj) in self.public_ids

    def chain_public(self, module: str, parts: list[str]) -> tuple[bool, str]:
        """``module.parts[0].parts[1]...``: follow the modules, judge the first non-module."""
        path = module.replace("pytorch_lightning", "lightning.pytorch")
        for part in parts:
            if not path.startswith("lightning.pytorch") and path != "lightning":
                return True, path  # lightning.fabric and the like
            try:
                obj = importlib.import_module(f"{path}.{part}")
            except Exception:  # noqa: BLE001
                obj = None
            if isinstance(obj, types.ModuleType):
                path = f"{path}.{part}"
                continue
            full = f"{path}.{part}"
            return (True, full) if path == "lightning" else (self.public_path(full), full)
        return self.public_path(path) or not path.startswith("lightning.pytorch"), path

    # -- the test's source ---------------------------------------------------------------------

    def fixtures(self, mod: Module) -> dict[str, tuple[Module, ast.AST]]:
        """Fixtures a test of ``mod`` can ask for by name: the conftests above it, then its own."""
        found: dict[str, tuple[Module, ast.AST]] = {}
        parts = mod.name.split(".")
        owners = [self.modules.get(".".join(parts[:i] + ["conftest"]))
                  for i in range(1, len(parts))] + [mod]
        for owner in owners:
            for name, nodes in (owner.defs if owner else {}).items():
                for node in nodes:
                    if isinstance(node, ast.FunctionDef) and any(
                            "fixture" in _call_name(d) for d in node.decorator_list):
                        found[name] = (owner, node)
        return found

    def source_of(self, mod: Module, qualname: str) -> tuple[list[tuple[Module, ast.AST]],
                                                           set[tuple[str, str]]]:
        """The test's source (see the module docstring) as (module, node) pairs, and the
        module-level imported names it uses as (module, local name)."""
        names = qualname.split("::")
        start: list[tuple[Module, ast.AST]] = []
        nodes = mod.defs.get(names[0], [])
        if len(names) == 2:
            for cls in nodes:
                for member in cls.body:
                    if getattr(member, "name", None) == names[1]:
                        start.append((mod, member))
                    elif not getattr(member, "name", "").startswith("test"):
                        start.append((mod, member))
                start += [(mod, b) for b in cls.bases + cls.decorator_list]
        else:
            start += [(mod, n) for n in nodes]
        for fixture_mod, node in self.fixtures(mod).values():
            if fixture_mod is mod and any("autouse=True" in _call_name(d)
                                          for d in node.decorator_list):
                start.append((mod, node))
        seen: set[tuple[str, int]] = set()
        out: list[tuple[Module, ast.AST]] = []
        refs: set[tuple[str, str]] = set()
        work = list(start)
        while work:
            owner, node = work.pop()
            if (owner.name, id(node)) in seen:
                continue
            seen.add((owner.name, id(node)))
            out.append((owner, node))
            fixtures = self.fixtures(owner)
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                    work += self._resolve(owner, sub.id, refs)
                elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for arg in sub.args.args + sub.args.kwonlyargs:
                        if arg.arg in fixtures and fixtures[arg.arg][1] is not sub:
                            work.append(fixtures[arg.arg])
        return out, refs

    def _resolve(self, mod: Module, name: str, refs: set[tuple[str, str]]):
        if name in mod.defs:
            return [(mod, n) for n in mod.defs[name]]
        if name not in mod.imports:
            return []
        source, attr = mod.imports[name]
        refs.add((mod.name, name))
        if source.startswith("tests_pytorch") and source != "tests_pytorch.helpers.runif":
            target = self.modules.get(source)
            if attr is not None and f"{source}.{attr}" in self.modules:
                return []  # a helper module imported as a name: its uses are attributes
            if target is not None and attr is not None:
                return self._resolve(target, attr, refs)
        return []

    def classify(self, mod: Module, qualname: str) -> tuple[list[str], list[list[str]]]:
        """Why the test is internal (empty: public), and the (module, name) pairs it uses."""
        source, refs = self.source_of(mod, qualname)
        reasons: list[str] = []
        gates = {id(n) for owner, node in source for n in self._gate_nodes(node)}
        owned = self._owned(source)
        lightning_bases = self._lightning_bases(source)
        for owner, node in source:
            for sub in ast.walk(node):
                if id(sub) in gates:
                    continue
                reasons += self._judge(owner, sub, owned, lightning_bases)
        for owner_name, local in refs:
            owner = self.modules[owner_name]
            source_module, attr = owner.imports[local]
            if not is_lightning(source_module) or source_module.startswith(KEEP_MODULES):
                continue
            if attr is not None:
                full = f"{source_module}.{attr}"
                if not self.public_path(full):
                    reasons.append(f"imports {full}")
        unique = list(dict.fromkeys(reasons))
        return unique, sorted([list(r) for r in refs])

    @staticmethod
    def _gate_nodes(node: ast.AST) -> Iterable[ast.AST]:
        for sub in ast.walk(node):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for deco in sub.decorator_list:
                    if any(_call_name(deco).startswith(g) for g in GATES):
                        yield from ast.walk(deco)

    @staticmethod
    def _owned(source) -> set[str]:
        """``_`` names the test's own classes define (methods, class attributes, ``self._x``)."""
        owned = set()
        for _, node in source:
            for sub in ast.walk(node):
                if isinstance(sub, ast.ClassDef):
                    for member in sub.body:
                        if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            owned.add(member.name)
                        elif isinstance(member, ast.Assign):
                            owned.update(t.id for t in member.targets if isinstance(t, ast.Name))
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) \
                        and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                    owned.add(sub.attr)
        return owned

    def _lightning_bases(self, source) -> list[type]:
        bases = []
        for owner, node in source:
            for sub in ast.walk(node):
                if isinstance(sub, ast.ClassDef):
                    for base in sub.bases:
                        obj = self._lightning_object(owner, base)
                        if isinstance(obj, type):
                            bases.append(obj)
        return bases

    def _lightning_object(self, owner: Module, node: ast.AST) -> Any:
        """The Lightning object ``node`` (a name or a dotted chain) stands for, or None."""
        parts = _dotted(node)
        if not parts or parts[0] not in owner.imports:
            if parts and parts[0] in owner.defs:
                return None
            return None
        source, attr = owner.imports[parts[0]]
        if source.startswith("tests_pytorch") and attr is not None:
            target = self.modules.get(source)
            if target is not None and attr in target.imports:
                return self._lightning_object(target, ast.Name(attr))
            return None
        if not is_lightning(source):
            return None
        try:
            obj = importlib.import_module(source.replace("pytorch_lightning", "lightning.pytorch"))
            for part in ([attr] if attr else []) + parts[1:]:
                obj = getattr(obj, part)
            return obj
        except Exception:  # noqa: BLE001
            return None

    def _non_lightning_root(self, owner: Module, node: ast.AST) -> bool:
        root = _root_name(node)
        if root is None or root not in owner.imports:
            return False
        source, _ = owner.imports[root]
        return not is_lightning(source) and not source.startswith("tests_pytorch")

    def _judge(self, owner: Module, sub: ast.AST, owned: set[str], bases: list[type]):
        if isinstance(sub, ast.Attribute):
            parts = _dotted(sub)
            if parts and parts[0] in owner.imports and is_lightning(owner.imports[parts[0]][0]) \
                    and owner.imports[parts[0]][1] is None and len(parts) > 1:
                public, full = self.chain_public(owner.imports[parts[0]][0], parts[1:])
                if not public:
                    yield f"names {full}"
            if sub.attr in LOOP_ATTRS:
                yield f"reaches .{sub.attr}"
            elif sub.attr.startswith("_") and not _is_dunder(sub.attr) \
                    and sub.attr not in owned and not self._non_lightning_root(owner, sub.value):
                yield f"private attribute .{sub.attr}"
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and sub.name.startswith("_") and not _is_dunder(sub.name) \
                and any(hasattr(b, sub.name) for b in bases):
            yield f"overrides Lightning's {sub.name}"
        elif isinstance(sub, ast.Call):
            yield from self._judge_patch(owner, sub)

    def _judge_patch(self, owner: Module, call: ast.Call):
        name = _call_name(call.func)
        short = name.removeprefix("unittest.").removeprefix("mock.")
        if short not in ("patch", "patch.object", "patch.multiple", "patch.dict",
                         ) and not name.startswith("monkeypatch."):
            return
        if not call.args:
            return
        first = call.args[0]
        attr = call.args[1] if len(call.args) > 1 else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            target = first.value
            if target.startswith(("lightning", "pytorch_lightning")):
                yield f"patches {target}"
            elif target.startswith(FAKE_ENV_TARGETS):
                yield f"fakes the environment: {target}"
            return
        text = _call_name(first)
        if short == "patch.dict" or name in ("monkeypatch.setitem", "monkeypatch.delitem"):
            if text == "sys.modules":
                yield "fakes the environment: sys.modules"
            return
        if name in ("monkeypatch.setenv", "monkeypatch.delenv", "monkeypatch.chdir",
                    "monkeypatch.syspath_prepend"):
            return
        attr_name = attr.value if isinstance(attr, ast.Constant) else ""
        if self._lightning_object(owner, first) is not None or \
                (_root_name(first) in owner.imports
                 and is_lightning(owner.imports[_root_name(first)][0])):
            yield f"patches {text}.{attr_name}"
        elif isinstance(attr_name, str) and attr_name.startswith("_"):
            yield f"patches {text}.{attr_name}"
        elif any(word in text.lower() for word in TRAINER_OWNED) or "._" in text:
            yield f"patches {text}.{attr_name}"
        elif text.startswith(FAKE_ENV_TARGETS):
            yield f"fakes the environment: {text}.{attr_name}"


def test_functions(mod: Module) -> list[str]:
    """Qualified names (``test_x``, ``TestC::test_y``) of the module's tests."""
    found = []
    for node in mod.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name.startswith("test"):
            found.append(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            found += [f"{node.name}::{m.name}" for m in node.body
                      if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and m.name.startswith("test")]
    return found


# --- running ------------------------------------------------------------------------------------

@dataclass
class Run:
    mode: str  # "lightning" or "ptrain"
    test: str  # relative to tests/tests_pytorch
    log: Path
    wall: float = 0.0
    restarts: int = 0
    #: only these tests of the file (node ids relative to the tests folder); None: all of them
    nodeids: list[str] | None = None


def run_file(root: Path, run: Run, timeout: float, refs: Path | None) -> Run:
    """One file in its own pytest process(es): resumed after a test that kills the process."""
    work = root / "work" / run.test.replace("/", "__")
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(root / "tests")]),
           "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    done: set[str] = set()
    start = time.perf_counter()
    while True:
        args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                "-p", "lightning_peer_plugin", "-c", str(root / "pytest.ini"),
                "--rootdir", str(root / "tests"), "-q", "--no-header", "-o",
                "console_output_style=classic", f"--peer-log={run.log}",
                f"--peer-timeout={timeout}"]
        if refs is not None:
            args.append(f"--peer-refs={refs}")
        args += [f"--deselect={nodeid}" for nodeid in sorted(done)]
        if run.nodeids is None:
            args.append(str(root / "tests" / "tests_pytorch" / run.test))
        else:
            args += [str(root / "tests" / nodeid) for nodeid in run.nodeids]
        with open(run.log.with_suffix(".out"), "a") as out:
            proc = subprocess.run(args, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
        records = read_log(run.log)
        started = [r["nodeid"] for r in records if r.get("event") == "start"]
        finished = {r["nodeid"] for r in records
                    if r.get("event") == "phase" and r["when"] == "teardown"}
        lost = [n for n in started if n not in finished and n not in done]
        done.update(started)
        if not lost or run.restarts >= 50:
            break
        tail = run.log.with_suffix(".out").read_text(errors="replace").strip().splitlines()
        with open(run.log, "a") as log:
            for nodeid in lost:
                log.write(json.dumps({
                    "event": "phase", "nodeid": nodeid, "when": "call", "outcome": "failed",
                    "exc_type": "ProcessDied", "duration": 0.0,
                    "message": f"the pytest process ended (exit {proc.returncode}) in this "
                               f"test: {' | '.join(tail[-3:])[:600]}"}) + "\n")
        run.restarts += 1
    run.wall = time.perf_counter() - start
    return run


def read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut short by a process that died while writing
    return records


def outcomes(records: list[dict]) -> tuple[dict[str, dict], dict[str, str], list[dict]]:
    """Per nodeid: the test's outcome (failed if any phase failed, with that phase's error);
    nodeid -> key; the collection errors."""
    keys = {r["nodeid"]: r["key"] for r in records if r.get("event") == "start"}
    result: dict[str, dict] = {}
    for r in records:
        if r.get("event") != "phase":
            continue
        current = result.setdefault(r["nodeid"], {"outcome": "passed", "duration": 0.0})
        current["duration"] = round(current["duration"] + r.get("duration", 0.0), 3)
        if current["outcome"] == "failed":
            continue
        if r["outcome"] == "failed":
            current.update(outcome="failed", phase=r["when"],
                           **{k: r[k] for k in ("exc_type", "message", "where") if r.get(k)})
            if "xfail" in r:
                current["outcome"] = "xpassed-strict"
        elif r["outcome"] == "skipped":
            if "xfail" in r:
                current.update(outcome="xfailed", reason=r["xfail"])
            else:
                current.update(outcome="skipped", reason=r.get("reason", ""))
    collect = [r for r in records if r.get("event") == "collect"]
    return result, keys, collect


# --- the report ---------------------------------------------------------------------------------

def first_line(text: str | None) -> str:
    return (text or "").strip().split("\n", 1)[0]


def cause(result: dict) -> str:
    """A failure's class: its exception type and first line, normalised so that failures with
    the same cause group (paths, numbers, addresses, a refused value)."""
    kind = result.get("exc_type") or "Error"
    line = first_line(result.get("message"))
    if kind == "ImportError" and result.get("phase") == "setup":  # a name ptrain lacks
        return f"ImportError: {line.split(' -- needed for', 1)[0]}"
    refused = re.match(r"([\w.]+)\((\w+)=.*?\) is not supported by ptrain", line)
    if refused:
        key = f"{kind}: {refused.group(1)}({refused.group(2)}=...) refused"
    else:
        text = re.sub(r"(/[\w.\-]+)+/?", "<path>", line)
        text = re.sub(r"[\w.]*<locals>\.(\w+\.)*", "<local>.", text)
        text = re.sub(r"0x[0-9a-fA-F]+", "<addr>", text)
        text = re.sub(r"tensor\([^)]*\)", "tensor(...)", text)
        text = re.sub(r"(?<![A-Za-z\d])-?\d+(\.\d+)?(e-?\d+)?(?![\d])", "N", text)
        text = re.sub(r"\[[^\]]{40,}\]", "[...]", text)
        text = re.sub(r"\{[^}]{40,}\}", "{...}", text)
        sentence = re.split(r"(?<=.{40}[.;])\s", text, maxsplit=1)[0]
        key = f"{kind}: {sentence[:160]}"
        if kind == "AssertionError" and result.get("message"):
            where = re.search(r"where .*? = ([^\n]{0,80})", result["message"])
            if where:
                shown = re.sub(r"0x[0-9a-f]+|\d+", "N", where.group(1))[:60]
                key += f"  [where {shown}]"
    phase = result.get("phase", "call")
    return key if phase == "call" else f"[{phase}] {key}"


def is_wording(result: dict) -> bool:
    if result.get("outcome") != "failed" or result.get("exc_type") not in ("Failed",
                                                                           "AssertionError"):
        return False
    if PYTHON_ERROR.search(result.get("message") or ""):
        return False  # the expected type, but raised by a bug (an AttributeError's text)
    return bool(WORDING.search(first_line(result.get("message"))))


def summarise(tests: list[dict], files: list[tuple[str, str]]) -> dict[str, Any]:
    per_file: dict[str, dict] = {}
    for group, test in files:
        rows = [t for t in tests if t["file"] == test]
        lp = [t for t in rows if t["lightning"]["outcome"] == "passed"]
        public = [t for t in lp if t["api"] == "public"]
        per_file[test] = {
            "group": group, "collected": len(rows),
            "lightning_passed": len(lp),
            "lightning_skipped": sum(t["lightning"]["outcome"] == "skipped" for t in rows),
            "lightning_failed": sum(t["lightning"]["outcome"] not in ("passed", "skipped",
                                                                      "xfailed") for t in rows),
            "lightning_xfailed": sum(t["lightning"]["outcome"] == "xfailed" for t in rows),
            "internal": sum(t["api"] == "internal" for t in lp),
            "wording": sum(t["api"] == "wording" for t in lp),
            "public": len(public),
            "ptrain_passed_public": sum(t["ptrain"]["outcome"] == "passed" for t in public),
            "ptrain_passed_all": sum(t["ptrain"]["outcome"] == "passed" for t in lp),
        }
    return per_file


def failure_classes(tests: list[dict]) -> list[dict]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for t in tests:
        if t["api"] == "public" and t["lightning"]["outcome"] == "passed" \
                and t["ptrain"]["outcome"] != "passed":
            groups[cause(t["ptrain"])].append(t)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return [{"cause": key, "count": len(members), "example": members[0]["nodeid"],
             "message": first_line(members[0]["ptrain"].get("message")),
             "where": members[0]["ptrain"].get("where"),
             "files": dict(Counter(m["file"] for m in members)),
             "tests": [m["nodeid"] for m in members]} for key, members in ordered]


def missing_attributes(tests: list[dict]) -> list[dict]:
    """The public-API failures that are an AttributeError, by the attribute that was missing
    (the failure classes split them by the owner's class, which is often the test's own)."""
    found: dict[str, list[tuple[str, dict]]] = defaultdict(list)
    for t in tests:
        result = t["ptrain"]
        match = re.match(r"(?:type object )?'(\w+)' (?:object )?has no attribute '(\w+)'",
                         first_line(result.get("message")))
        if t["api"] == "public" and t["lightning"]["outcome"] == "passed" \
                and result.get("exc_type") == "AttributeError" and match:
            found[match.group(2)].append((match.group(1), t))
    return [{"attribute": name, "count": len(hits),
             "owners": dict(Counter(owner for owner, _ in hits)), "example": hits[0][1]["nodeid"]}
            for name, hits in sorted(found.items(), key=lambda kv: (-len(kv[1]), kv[0]))]


def exclusions(tests: list[dict]) -> dict[str, list[dict]]:
    """What could not run here, from the Lightning run: skips by reason, failures by cause."""
    skipped: dict[str, list[str]] = defaultdict(list)
    failed: dict[str, list[dict]] = defaultdict(list)
    for t in tests:
        result = t["lightning"]
        if result["outcome"] == "skipped":
            skipped[re.sub(r"^Skipped: ", "", result.get("reason", ""))].append(t["nodeid"])
        elif result["outcome"] not in ("passed", "xfailed"):
            failed[cause(result) if result["outcome"] == "failed" else result["outcome"]].append(t)
    return {
        "skipped": [{"reason": r, "count": len(ids), "example": ids[0]}
                    for r, ids in sorted(skipped.items(), key=lambda kv: -len(kv[1]))],
        "failed": [{"cause": c, "count": len(ts), "example": ts[0]["nodeid"],
                    "message": first_line(ts[0]["lightning"].get("message"))}
                   for c, ts in sorted(failed.items(), key=lambda kv: -len(kv[1]))],
    }


def table(per_file: dict[str, dict]) -> list[str]:
    head = (f"{'file':<52} {'tests':>5} {'L pass':>6} {'intern':>6} {'word':>5} "
            f"{'public':>6} {'ptrain':>6} {'%':>6}")
    lines = []
    for group in dict.fromkeys(r["group"] for r in per_file.values()):
        rows = {f: r for f, r in per_file.items() if r["group"] == group}
        lines += ["", f"group {group!r}", head, "-" * len(head)]
        total = Counter()
        for f, r in rows.items():
            total.update({k: v for k, v in r.items() if isinstance(v, int)})
            lines.append(_row(f, r))
        lines.append(_row("total", total))
    return lines


def _row(name: str, r: dict) -> str:
    pct = (f"{100.0 * r['ptrain_passed_public'] / r['public']:>5.1f}%" if r["public"]
           else "     -")
    return (f"{name:<52} {r['collected']:>5} {r['lightning_passed']:>6} {r['internal']:>6} "
            f"{r['wording']:>5} {r['public']:>6} {r['ptrain_passed_public']:>6} {pct}")


def ptrain_state() -> dict[str, Any]:
    def out(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True,
                                  text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""
    dirty = out("status", "--short", "--", "core", "plugins").splitlines()
    return {"commit": out("rev-parse", "--short", "HEAD"), "uncommitted": dirty}


# --- main ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lightning-repo", type=Path, default=MIRROR,
                        help="Lightning's GitHub repository (a bare git dir is fine)")
    parser.add_argument("--ref", default=DEFAULT_REF, help="the tag or commit to read tests at")
    parser.add_argument("--group", choices=[*GROUPS, "all"], default="all")
    parser.add_argument("--files", nargs="*", help="these files (relative to tests_pytorch) "
                        "instead of a group")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--jobs", type=int, default=1, help="pytest processes at once")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per test phase")
    parser.add_argument("--baseline-json", type=Path,
                        help="take the Lightning run's outcomes from this results.json (same "
                             "ref and Lightning version) instead of running them again")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--sample", type=int, metavar="N",
                        help="run only N public-API tests that passed under Lightning in "
                             "--baseline-json, drawn with --seed from the selected files (the "
                             "suite's quick check; the full run is the measurement)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of --sample's draw")
    parser.add_argument("--regroup", type=Path, metavar="RESULTS_JSON",
                        help="run no test: classify, recount and regroup the outcomes in this "
                             "results.json again (after a change to the rules) into --out")
    args = parser.parse_args(argv)
    if args.regroup:
        results = json.loads(args.regroup.read_text())
        tests = [f for names in results["meta"]["groups"].values() for f in names]
        tree = list_tree(args.lightning_repo, results["meta"]["ref"])
        static = classify_all(files_needed(args.lightning_repo, results["meta"]["ref"], tree,
                                           tests), tests)
        for t in results["tests"]:
            t["internal_reasons"] = static.get(t["nodeid"].split("[", 1)[0],
                                               (["not found in the source"], []))[0]
        return write_out(regroup(results), args.out)

    try:
        import lightning
    except ImportError:
        parser.error("the Lightning oracle is not installed (pip install lightning==2.6.6 "
                     "-c constraints.txt)")
    if not (args.lightning_repo / "HEAD").exists() and not (args.lightning_repo / ".git").exists():
        parser.error(f"{args.lightning_repo} is not a git checkout of Lightning")

    tree = list_tree(args.lightning_repo, args.ref)
    if args.files:
        files = [("files", f) for f in select(tree, args.files)]
    else:
        files = [(g, f) for g in GROUPS if args.group in (g, "all")
                 for f in select(tree, GROUPS[g])]
    tests = [f for _, f in files]
    texts = files_needed(args.lightning_repo, args.ref, tree, tests)
    ini = pytest_ini(args.lightning_repo, args.ref)

    baseline = None
    if args.baseline_json:
        baseline = json.loads(args.baseline_json.read_text())
        if (baseline["meta"]["ref"], baseline["meta"]["lightning"]) != (args.ref,
                                                                        lightning.__version__):
            parser.error(f"{args.baseline_json} was measured at ref {baseline['meta']['ref']} "
                         f"with Lightning {baseline['meta']['lightning']}")

    static = classify_all(texts, tests)
    sampled: dict[str, list[str]] | None = None  # file -> the node ids drawn from it
    if args.sample is not None:
        if baseline is None:
            parser.error("--sample draws from the outcomes of --baseline-json: give one")
        sampled = draw_sample(baseline, set(tests), args.sample, args.seed)
        files = [(g, f) for g, f in files if f in sampled]
        tests = [f for _, f in files]

    tmp = Path(tempfile.mkdtemp(prefix="lightning-peer-"))
    started = time.perf_counter()
    try:
        refs_path = tmp / "refs.json"
        refs_path.write_text(json.dumps({k: v[1] for k, v in static.items()}))
        runs: list[tuple[Path, Run, Path | None]] = []
        for mode in ("lightning", "ptrain"):
            write_tree(tmp / TREES[mode], texts, ini, rewrite=mode == "ptrain")
            (tmp / "logs" / mode).mkdir(parents=True)
            for test in tests:
                if mode == "lightning" and baseline and test in baseline["files"]:
                    continue
                log = tmp / "logs" / mode / (test.replace("/", "__") + ".jsonl")
                nodeids = sampled[test] if sampled is not None else None
                runs.append((tmp / TREES[mode], Run(mode, test, log, nodeids=nodeids),
                             refs_path if mode == "ptrain" else None))
        print(f"{len(tests)} files, {len(static)} test functions; {len(runs)} pytest runs in "
              f"{tmp} ({args.jobs} at a time)", flush=True)
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(run_file, root, run, args.timeout, refs)
                       for root, run, refs in runs]
            for future in concurrent.futures.as_completed(futures):
                run = future.result()
                print(f"  {run.mode:<9} {run.test:<55} {run.wall:7.1f} s"
                      + (f" ({run.restarts} restarts)" if run.restarts else ""), flush=True)
        only = None if sampled is None else {n for ids in sampled.values() for n in ids}
        results = collect_results(tmp, files, static, baseline, only)
        wall = time.perf_counter() - started
        walls = Counter()
        for _, run, _ in runs:
            walls[run.mode] += run.wall
        results["meta"] = {
            "ref": args.ref, "lightning": lightning.__version__, "ptrain": ptrain_state(),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "python": platform.python_version(), "machine": f"{os.cpu_count()} CPUs",
            "torch": importlib.import_module("torch").__version__,
            "wall_s": round(wall, 1), "pytest_s": {k: round(v, 1) for k, v in walls.items()},
            "timeout_s": args.timeout, "jobs": args.jobs,
            "baseline_from": baseline_source(baseline) if baseline else None,
            "groups": {g: [f for gg, f in files if gg == g] for g, _ in files},
            "sample": None if sampled is None else {"size": args.sample, "seed": args.seed},
        }
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return write_out(results, args.out)


def classify_all(texts: dict[str, str], tests: list[str]) -> dict[str, tuple[list, list]]:
    """Per test function (``tests_pytorch/<file>::<qualname>``): why it is internal (empty:
    public) and the module-level imported names its source uses."""
    modules = {module_name(rel): index_module(rel, text)
               for rel, text in texts.items() if rel.endswith(".py")}
    classifier = Classifier(modules)
    static = {}
    for test in tests:
        mod = modules[module_name(f"tests_pytorch/{test}")]
        for qualname in test_functions(mod):
            static[f"tests_pytorch/{test}::{qualname}"] = classifier.classify(mod, qualname)
    return static


def write_out(results: dict, out: Path) -> int:
    report = render(results)
    print("\n".join(report))
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "summary.txt").write_text("\n".join(report) + "\n")
    return 0


def regroup(results: dict) -> dict:
    """``results`` with the classification's wording step, the counts and the failure classes
    computed again from the outcomes it holds."""
    tests = results["tests"]
    for t in tests:
        if t["ptrain"].get("exc_type") == "CollectError":
            t["ptrain"].update(collect_error(t["ptrain"]["message"]))
        t["api"] = ("internal" if t["internal_reasons"]
                    else "wording" if is_wording(t["ptrain"]) else "public")
    files = [(group, f) for group, names in results["meta"]["groups"].items() for f in names]
    results.update(files=summarise(tests, files), failure_classes=failure_classes(tests),
                   missing_attributes=missing_attributes(tests), excluded=exclusions(tests))
    return results


def baseline_source(baseline: dict) -> str:
    """Where the reused Lightning outcomes were measured (kept through later reuses)."""
    meta = baseline["meta"]
    if meta.get("baseline_from"):
        return meta["baseline_from"]
    return (f"the run of {meta['date']} (ptrain {meta['ptrain']['commit']}; Lightning's side "
            f"{meta['pytest_s'].get('lightning', 0):.0f} s of pytest)")


def draw_sample(baseline: dict, files: set[str], size: int, seed: int) -> dict[str, list[str]]:
    """``size`` public-API tests that passed under Lightning in ``baseline``, from ``files``,
    drawn with ``seed`` (the same draw for the same baseline): file -> node ids."""
    pool = sorted(t["nodeid"] for t in baseline["tests"]
                  if t["file"] in files and t["api"] == "public"
                  and t["lightning"]["outcome"] == "passed")
    drawn: dict[str, list[str]] = {}
    for nodeid in sorted(random.Random(seed).sample(pool, min(size, len(pool)))):
        drawn.setdefault(nodeid.split("::", 1)[0].removeprefix("tests_pytorch/"),
                         []).append(nodeid)
    return drawn


def collect_results(tmp: Path, files: list[tuple[str, str]], static: dict,
                    baseline: dict | None, only: set[str] | None = None) -> dict[str, Any]:
    """Every test's outcomes under both; ``only``: just these node ids (a sample)."""
    by_mode: dict[str, dict[str, dict]] = {}
    collect_errors: dict[str, list[dict]] = {}
    for mode in ("lightning", "ptrain"):
        merged: dict[str, dict] = {}
        for log in sorted((tmp / "logs" / mode).glob("*.jsonl")):
            results, keys, collect = outcomes(read_log(log))
            for nodeid, result in results.items():
                merged[keys.get(nodeid, nodeid)] = {"nodeid": nodeid, **result}
            if collect:
                collect_errors.setdefault(mode, []).extend(collect)
        by_mode[mode] = merged
    if baseline:
        for t in baseline["tests"]:
            if only is not None and t["nodeid"] not in only:
                continue
            if t["key"] not in by_mode["lightning"]:
                by_mode["lightning"][t["key"]] = {"nodeid": t["nodeid"], **t["lightning"]}
    group_of = {f: g for g, f in files}
    tests = []
    for key, lres in by_mode["lightning"].items():
        nodeid = lres.pop("nodeid")
        rel = nodeid.split("::", 1)[0].removeprefix("tests_pytorch/")
        if rel not in group_of:
            continue
        pres = dict(by_mode["ptrain"].get(key) or _not_collected(rel, collect_errors))
        pres.pop("nodeid", None)
        reasons, _ = static.get(nodeid.split("[", 1)[0], (["not found in the source"], []))
        api = "internal" if reasons else ("wording" if is_wording(pres) else "public")
        tests.append({"key": key, "nodeid": nodeid, "file": rel, "group": group_of[rel],
                      "api": api, "internal_reasons": reasons, "lightning": lres,
                      "ptrain": pres})
    tests.sort(key=lambda t: (list(group_of).index(t["file"]), t["nodeid"]))
    return {"files": summarise(tests, files), "failure_classes": failure_classes(tests),
            "missing_attributes": missing_attributes(tests), "excluded": exclusions(tests),
            "collect_errors": collect_errors, "tests": tests}


def _not_collected(rel: str, collect_errors: dict[str, list[dict]]) -> dict:
    for error in collect_errors.get("ptrain", []):
        if error["nodeid"].endswith(rel):
            return {"outcome": "failed", "phase": "collect", **collect_error(error["message"])}
    return {"outcome": "failed", "phase": "collect", "exc_type": "NotCollected",
            "message": "the test was not collected under ptrain"}


def collect_error(message: str) -> dict[str, str]:
    """The exception type and message of a file that failed to import, from pytest's report
    (its ``E   module.Type: message`` line)."""
    for line in message.splitlines():
        line = line.removeprefix("E").strip()
        match = re.match(r"([\w.]+(?:Error|Exception|Exit|Interrupt|Warning)): (.*)", line)
        if match:
            return {"exc_type": match.group(1).rsplit(".", 1)[-1], "message": match.group(2)}
    return {"exc_type": "CollectError", "message": message}


def render(results: dict) -> list[str]:
    meta = results["meta"]
    per_file = results["files"]
    total = Counter()
    for r in per_file.values():
        total.update({k: v for k, v in r.items() if isinstance(v, int)})
    rate = 100.0 * total["ptrain_passed_public"] / total["public"] if total["public"] else 0.0
    dirty = meta["ptrain"]["uncommitted"]
    lines = [
        "Lightning's tests (tests/tests_pytorch at " f"{meta['ref']}) against ptrain.lightning",
        f"ptrain {meta['ptrain']['commit']}"
        + (f" + uncommitted changes in {len(dirty)} files" if dirty else "")
        + f"; oracle Lightning {meta['lightning']}; torch {meta['torch']}; Python "
        f"{meta['python']}; {meta['machine']}; {meta['date']}",
        f"wall {meta['wall_s']:.0f} s (pytest time: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in meta["pytest_s"].items()) + ")"
        + (f"; Lightning outcomes from {meta['baseline_from']}" if meta["baseline_from"] else ""),
        "",
        "columns: tests collected under Lightning; passing under Lightning; of those, internal "
        "(reach Lightning's internals), wording (fail under ptrain only on Lightning's message "
        "text), public; public passing under ptrain; %",
        *table(per_file),
        "",
        f"public-API tests passing under ptrain: {total['ptrain_passed_public']} of "
        f"{total['public']} ({rate:.1f}%); all Lightning-passing tests: "
        f"{total['ptrain_passed_all']} of {total['lightning_passed']}",
        "",
        "failure classes of the public-API tests (top 30 of "
        f"{len(results['failure_classes'])}; all in results.json):",
    ]
    for i, c in enumerate(results["failure_classes"][:30], 1):
        lines += [f"{i:>3}. {c['count']:>4}  {c['cause']}",
                  f"            e.g. {c['example']}",
                  f"            {c['message'][:400]}"]
        if c["where"]:
            lines.append(f"            at {c['where'].replace(str(REPO) + '/', '')}")
    lines += ["", "public-API failures that are a missing attribute, by attribute (owners):"]
    lines += [f"  {a['count']:>4}  .{a['attribute']}  ("
              + ", ".join(f"{o} {n}" for o, n in a["owners"].items()) + f")   e.g. {a['example']}"
              for a in results.get("missing_attributes", [])]
    lines += ["", "not run here (skipped under Lightning), by reason:"]
    lines += [f"  {s['count']:>4}  {s['reason']}   e.g. {s['example']}"
              for s in results["excluded"]["skipped"]]
    lines += ["", "failing under Lightning on this machine (excluded), by cause:"]
    lines += [f"  {s['count']:>4}  {s['cause']}   e.g. {s['example']}"
              for s in results["excluded"]["failed"]]
    for mode, errors in results["collect_errors"].items():
        for e in errors:
            lines.append(f"collection error under {mode}: {e['nodeid']}: "
                         f"{first_line(e['message'])[:300]}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
