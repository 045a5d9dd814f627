"""Which plugins a run uses: one accelerator, one strategy, one precision and any callbacks.

Only the selected plugins are imported (plus, for ``--accelerator auto``, the installed
accelerators), so a broken plugin never breaks a run that does not select it.
"""

from __future__ import annotations

import inspect
import itertools
import re
import warnings
from dataclasses import dataclass
from typing import Any

from ptrain.catalog import FIRST_PARTY, Catalog, PluginInfo
from ptrain.config import DEFAULT_CALLBACKS, canonical_plugin_name
from ptrain.errors import ConfigError, PluginError
from ptrain.loading import check_available, declare_options, import_object, import_target
from ptrain.options import OptionGroup, closest

BLOCK_PREFIX = "no:"


@dataclass
class SelectedPlugin:
    """A plugin chosen for this run, imported but not yet instantiated (unless given as one)."""

    kind: str
    name: str
    target: Any  # class, module, or a ready plugin object given from Python
    info: PluginInfo | None  # None for an object given from Python
    options: OptionGroup


def object_name(plugin: Any) -> str:
    """The name a plugin object given from Python is registered under: its ``plugin_name``
    attribute (for a class whose ``name`` means something else, as a Lightning logger's
    experiment name), else its ``name`` attribute, else its class name in kebab case
    (``EarlyStopping`` -> ``early-stopping``)."""
    for attribute in ("plugin_name", "name"):
        name = getattr(plugin, attribute, None)
        if isinstance(name, str) and name:
            return name
    cls = plugin if inspect.isclass(plugin) else type(plugin)
    return re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower()


def split_callbacks(entries: list[Any]) -> tuple[list[Any], set[str]]:
    """``callbacks`` entries -> (enabled names and objects, blocked names). The defaults come
    first, then the given entries in order; ``no:NAME`` blocks NAME wherever it came from. A
    callback object given from Python replaces the default callback of the same name (its
    ``name``, see :func:`object_name`): ``ModelCheckpoint(monitor=...)`` is the ``checkpoint``."""
    for entry in entries:
        if isinstance(entry, str) and not entry.strip().removeprefix(BLOCK_PREFIX).strip():
            raise ConfigError(f"callback entry {entry!r} names no plugin; give -p NAME to enable "
                              f"a callback or -p no:NAME to block one (`ptrain plugins` lists "
                              f"them).")
    blocked = {e[len(BLOCK_PREFIX):] for e in entries
               if isinstance(e, str) and e.startswith(BLOCK_PREFIX)}
    given_objects = {object_name(e) for e in entries if not isinstance(e, str)}
    defaults = [name for name in DEFAULT_CALLBACKS if name not in given_objects]
    enabled: list[Any] = []
    for entry in [*defaults, *entries]:
        if isinstance(entry, str) and (entry.startswith(BLOCK_PREFIX) or entry in blocked
                                       or entry in enabled):
            continue
        enabled.append(entry)
    return enabled, blocked


def _from_catalog(catalog: Catalog, kind: str, name: str) -> SelectedPlugin:
    info = catalog.get(kind, name)
    target = import_target(info)
    return SelectedPlugin(kind, name, target, info, declare_options(target, name))


def _from_class_path(path: str) -> SelectedPlugin:
    """A callback named ``MODULE:CLASS`` (``-p my_callbacks:PrintLoss``): a class not packaged
    as a plugin, imported with the current folder importable (as ``python -m`` does). Its
    options, if it declares any, come as for an installed plugin."""
    target = import_object(path, "callback", PluginError, "-p my_callbacks:PrintLoss")
    name = object_name(target)
    return SelectedPlugin("callback", name, target, None, declare_options(target, name))


def _require_available(plugin: SelectedPlugin) -> None:
    reason = check_available(plugin.target, plugin.name)
    if reason is not None:
        raise PluginError(f"{plugin.kind} {plugin.name!r} can't run on this machine: {reason}")


def auto_accelerator(catalog: Catalog, blocked: set[str]) -> SelectedPlugin:
    """What ``--accelerator auto`` selects: the available accelerator of ``catalog``, not named
    in ``blocked``, with the highest declared ``priority`` (an attribute of the plugin class or
    module; 0 when absent). Broken accelerators are skipped with a warning; none available is a
    :class:`PluginError`."""
    best: tuple[int, SelectedPlugin] | None = None
    for name in catalog.names("accelerator"):
        if name in blocked:
            continue
        try:
            plugin = _from_catalog(catalog, "accelerator", name)
        except PluginError as exc:
            warnings.warn(f"--accelerator auto skipped a broken plugin: {exc}", stacklevel=2)
            continue
        if check_available(plugin.target, name) is not None:
            continue
        priority = int(getattr(plugin.target, "priority", 0))
        if best is None or priority > best[0]:
            best = (priority, plugin)
    if best is None:
        raise PluginError("--accelerator auto found no accelerator that can run here; run "
                          "`ptrain plugins --check` to see why each one can't.")
    return best[1]


def _say_blocks_of_nothing(catalog: Catalog, blocked: set[str], callbacks: list[Any]) -> None:
    """Warn of each ``no:NAME`` that names no plugin (installed, first-party, or a callback
    object given): it blocks nothing, most likely by a slip of the keyboard. A warning, not an
    error: a configuration may block a plugin that one machine has and another does not."""
    known = {name for kind in ("accelerator", "strategy", "precision", "callback")
             for name in catalog.names(kind)}
    known |= {object_name(entry) for entry in callbacks if not isinstance(entry, str)}
    first_party = {name for named in FIRST_PARTY.values() for name in named}
    for name in sorted(blocked - known - first_party):
        warnings.warn(f"-p no:{name} blocks nothing: no installed plugin is called "
                      f"{name!r}.{closest(name, sorted(known))} `ptrain plugins` lists them.",
                      stacklevel=3)


def select_plugins(
    catalog: Catalog, accelerator: Any, strategy: Any, precision: Any, callbacks: list[Any]
) -> list[SelectedPlugin]:
    """Import and return the plugins for a run, in registration order (accelerator, precision,
    strategy, callbacks). Names come from the catalog; objects are taken as they are."""
    enabled, blocked = split_callbacks(callbacks)
    _say_blocks_of_nothing(catalog, blocked, callbacks)
    chosen = {"accelerator": accelerator, "strategy": strategy, "precision": precision}
    selected: list[SelectedPlugin] = []
    for kind in ("accelerator", "precision", "strategy"):
        choice = chosen[kind]
        if isinstance(choice, (str, int)) and not isinstance(choice, bool):
            choice = canonical_plugin_name(kind, choice)
        if not isinstance(choice, str):
            selected.append(SelectedPlugin(kind, object_name(choice), choice, None,
                                           OptionGroup(object_name(choice))))
            continue
        if choice in blocked:
            raise PluginError(f"{kind} {choice!r} is selected and blocked (no:{choice}) at once; "
                              f"choose another {kind} or remove no:{choice}.")
        if kind == "accelerator" and choice == "auto":
            selected.append(auto_accelerator(catalog, blocked))
            continue
        plugin = _from_catalog(catalog, kind, choice)
        _require_available(plugin)
        selected.append(plugin)
    for entry in enabled:
        if isinstance(entry, str) and ":" in entry:
            selected.append(_from_class_path(entry))
        elif isinstance(entry, str):
            plugin = _from_catalog(catalog, "callback", entry)
            _require_available(plugin)
            selected.append(plugin)
        else:
            name = object_name(entry)
            # several callback objects of one kind (two EarlyStopping, as Lightning allows):
            # the later ones are registered as NAME-2, NAME-3, ...
            taken = {p.name for p in selected if p.info is None and p.kind == "callback"}
            if name in taken:
                name = next(f"{name}-{n}" for n in itertools.count(2)
                            if f"{name}-{n}" not in taken)
            selected.append(SelectedPlugin("callback", name, entry, None, OptionGroup(name)))
    seen: dict[str, SelectedPlugin] = {}
    for plugin in selected:
        if plugin.name in seen:
            raise PluginError(
                f"two plugins of this run are both named {plugin.name!r} (a {seen[plugin.name].kind}"
                f" and a {plugin.kind}); give one of them a distinct `name` (or "
                f"`plugin_name`) attribute."
            )
        seen[plugin.name] = plugin
    return selected

