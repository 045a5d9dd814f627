"""The public API of ``ptrain`` that plugins may build on, and a check of a plugin's imports.

A plugin that imports only from :data:`PUBLIC_MODULES`, and no name starting with ``_``, keeps
working when the core's internals change. ``docs/testing-plugins.md`` lists the same modules
(a test keeps the two lists equal).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

#: The ptrain modules a plugin may import (``ptrain`` itself: the names in ``ptrain.__all__``).
PUBLIC_MODULES: tuple[str, ...] = (
    "ptrain",
    "ptrain.checkpoint_io",
    "ptrain.data",
    "ptrain.distributed",
    "ptrain.errors",
    "ptrain.hookspecs",
    "ptrain.module",
    "ptrain.module_classes",
    "ptrain.options",
    "ptrain.precision_policy",
    "ptrain.testing",
    "ptrain.trainer",
)
_NOT_PUBLIC = "not one of the public modules (ptrain.testing.PUBLIC_MODULES)"


def _module_problem(module: str) -> str | None:
    """Why importing the ptrain module ``module`` is not allowed, or ``None``."""
    if any(part.startswith("_") for part in module.split(".")):
        return "a private module (a part of its name starts with '_')"
    if module not in PUBLIC_MODULES:
        return _NOT_PUBLIC
    return None


def _is_ptrain(module: str | None) -> bool:
    return module is not None and (module == "ptrain" or module.startswith("ptrain."))


def _is_submodule(package: str, name: str) -> bool:
    """Whether ``package.name`` is a module, found without importing it (nor torch)."""
    try:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.submodule_search_locations is None:
            return False  # not a package: its attributes are not modules
        return importlib.util.find_spec(f"{package}.{name}") is not None
    except (ImportError, ValueError):
        return False


def _dotted(node: ast.Attribute) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``, for chains that start at a plain name."""
    parts: list[str] = []
    current: ast.AST = node
    while isinstance(current, ast.Attribute):
        parts.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    return [current.id, *reversed(parts)]


def private_imports(source: str | Path, filename: str = "<source>") -> list[str]:
    """Every use of ptrain's non-public API in ``source`` (Python text, or the path of a
    ``.py`` file), one line each (``file:line: what``); an empty list when there is none.

    Checked: ``import ptrain.X``, ``from ptrain.X import name`` and ``from ptrain import X``
    (the module must be public, no name may start with ``_``), and attribute chains on a name
    bound to a ptrain module (``ptrain._LAZY``, ``ptrain.loading.bind_impl``). Imports made
    from strings (``importlib.import_module``) are not seen.
    """
    if isinstance(source, Path):
        filename, source = str(source), source.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=filename)
    problems: set[tuple[int, str]] = set()
    bound: dict[str, str] = {}  # a local name -> the ptrain module it refers to

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _is_ptrain(alias.name):
                    continue
                problem = _module_problem(alias.name)
                if problem:
                    problems.add((node.lineno, f"imports {alias.name}: {problem}"))
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound["ptrain"] = "ptrain"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_ptrain(node.module):
            module = node.module
            problem = _module_problem(module)
            if problem:
                problems.add((node.lineno, f"imports from {module}: {problem}"))
            for alias in node.names:
                if alias.name.startswith("_"):
                    problems.add((node.lineno, f"imports the private name {alias.name} from "
                                               f"{module}"))
                elif _is_submodule(module, alias.name):
                    submodule = f"{module}.{alias.name}"
                    problem = _module_problem(submodule)
                    if problem:
                        problems.add((node.lineno, f"imports the module {submodule}: {problem}"))
                    bound[alias.asname or alias.name] = submodule

    for node in ast.walk(tree):
        chain = _dotted(node) if isinstance(node, ast.Attribute) else None
        if not chain or chain[0] not in bound:
            continue
        target = bound[chain[0]]
        for attr in chain[1:]:
            if attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__")):
                problems.add((node.lineno, f"uses the private name {target}.{attr}"))
                break
            if not _is_submodule(target, attr):
                break  # an ordinary attribute: a class, a function, a constant
            target = f"{target}.{attr}"
            problem = _module_problem(target)
            if problem:
                problems.add((node.lineno, f"uses the module {target}: {problem}"))
                break
    return [f"{filename}:{line}: {what}" for line, what in sorted(problems)]


__all__ = ["PUBLIC_MODULES", "private_imports"]
