"""Lightning 2.6's public names, enumerated from the installed ``lightning`` (the test oracle),
and the smoke uses that show each name's ptrain counterpart works or refuses clearly.

A public name of a Lightning module is one in its ``__all__``, or defined at its top level
(``def``, ``class`` or an assignment, read from its source) without a leading underscore; for a
package without ``__all__``, also what its ``__init__`` imports from Lightning's own modules.
Names the module merely imports from elsewhere (``os``, ``torch``, ``Optional``) are not its
public names.

Each ``smoke_<module>.py`` beside this file holds ``SMOKE``: Lightning's name -> a function that
uses ptrain's counterpart (builds it, trains with it, calls it) and asserts what it did, or
shows it refused with :func:`refuses`.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path
from typing import Any, Callable

import pytest

import ptrain

#: Lightning's modules whose public names ``ptrain.lightning`` mirrors, at the same path
#: (relative to ``lightning.pytorch``; "" is the package itself)
MODULES = ("", "accelerators", "callbacks", "cli", "core", "demos", "loggers", "plugins",
           "profilers", "strategies", "tuner", "utilities")


def lightning_module_name(module: str) -> str:
    return "lightning.pytorch" + (f".{module}" if module else "")


def ptrain_module_name(module: str) -> str:
    return "ptrain.lightning" + (f".{module}" if module else "")


def public_names(module: str) -> list[str]:
    """The public names of ``lightning.pytorch.<module>`` (see the module docstring)."""
    mod = importlib.import_module(lightning_module_name(module))
    names = set(getattr(mod, "__all__", ()))
    tree = ast.parse(Path(inspect.getsourcefile(mod)).read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom) and not hasattr(mod, "__all__") \
                and hasattr(mod, "__path__") and (node.module or "").startswith("lightning."):
            names.update(alias.asname or alias.name for alias in node.names)
    return sorted(n for n in names if not n.startswith("_"))


def smoke_file(module: str) -> Path:
    """The file holding ``SMOKE`` for ``module`` (``smoke_package.py`` for the package)."""
    return Path(__file__).parent / f"smoke_{module.replace('.', '_') or 'package'}.py"


def smoke_uses(module: str) -> dict[str, Callable[[], Any]]:
    """``module``'s ``SMOKE`` table (empty when its file does not exist yet)."""
    if not smoke_file(module).exists():
        return {}
    return importlib.import_module(f"lightning_names.{smoke_file(module).stem}").SMOKE


def refuses(use: Callable[[], Any], *words: str) -> None:
    """Assert that ``use()`` raises ptrain's one-paragraph refusal (a :class:`ptrain.ConfigError`
    or :class:`ptrain.ModelError` saying what to do), and that it names each of ``words``."""
    with pytest.raises((ptrain.ConfigError, ptrain.ModelError)) as info:
        use()
    message = str(info.value)
    assert "\n\n" not in message, f"not one paragraph: {message!r}"
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def documented_names(section: str, text: str) -> set[str]:
    """The names written in backticks in the ``### `section``` part of docs/from-lightning.md."""
    match = re.search(rf"^### `{re.escape(section)}`\n(.*?)(?=^#{{1,3}} |\Z)", text,
                      re.MULTILINE | re.DOTALL)
    if match is None:
        return set()
    return {m.split(".")[-1].split("(")[0] for m in re.findall(r"`([^`]+)`", match.group(1))}
