"""Telling the user's code from the libraries' and the plugins' in a stack: for messages that
name where something happened (the rank watch's heartbeat, the CLI's line above a traceback:
the user's code, a plugin's hook, and whether a checkpoint of the failed fit exists)."""

from __future__ import annotations

import re
import traceback
import sysconfig
from pathlib import Path
from typing import Any

#: Frames of these packages, and of the standard library, are not the user's code: the code
#: that called into them is.
_LIBRARIES = frozenset({"torch", "pluggy"})
_STDLIB = sysconfig.get_paths()["stdlib"]


def _is_stdlib_file(file: str) -> bool:
    return file.startswith(_STDLIB) and "site-packages" not in file or file.startswith("<frozen")


def _is_installed_file(file: str) -> bool:
    """A file of an installed package (site-packages), not of the user's project."""
    return "site-packages" in file or "dist-packages" in file


def is_library_frame(frame: Any) -> bool:
    """Whether ``frame`` runs torch's, pluggy's or the standard library's code."""
    root = frame.f_globals.get("__name__", "").split(".")[0]
    return root in _LIBRARIES or _is_stdlib_file(frame.f_code.co_filename)


def _tb_frames(exc: BaseException) -> list[tuple[Any, int]]:
    """The frames of ``exc``'s traceback with their line numbers, outermost first."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return frames


def _root(frame: Any) -> str:
    return frame.f_globals.get("__name__", "").split(".")[0]


def is_ptrains_frame(frame: Any) -> bool:
    """Whether ``frame`` runs ptrain's code or a ``ptrain_*`` plugin's."""
    root = _root(frame)
    return root == "ptrain" or root.startswith("ptrain_")


def _is_installed(frame: Any) -> bool:
    return _is_installed_file(frame.f_code.co_filename)


def is_users_frame(frame: Any) -> bool:
    """Whether ``frame`` runs the user's own code: not ptrain's (or a ``ptrain_*`` plugin's),
    not torch's, pluggy's or the standard library's, not any installed package's."""
    return not (is_ptrains_frame(frame) or is_library_frame(frame) or _is_installed(frame))


def user_code_origin(exc: BaseException) -> str | None:
    """``"validation_step (model.py:41)"`` when the innermost frame of ``exc``'s traceback that
    is neither a library's (torch, pluggy, the standard library, any installed package) nor
    ptrain's is the user's code, and no ptrain frame is nearer the error (then the error came
    from ptrain, or through it from a plugin, whatever library raised it); else ``None``."""
    for frame, line in reversed(_tb_frames(exc)):
        if is_ptrains_frame(frame):
            return None
        if is_library_frame(frame) or _is_installed(frame):
            continue
        return f"{frame.f_code.co_name} ({Path(frame.f_code.co_filename).name}:{line})"
    return None


#: torch's text for an exception raised in a DataLoader worker and raised again in the main
#: process (torch.utils.data's ExceptionWrapper): the worker's traceback is in the message
_WORKER_ERROR = re.compile(r"Caught \w+ in DataLoader worker process (\d+)\.\n"
                           r"Original Traceback")
_TEXT_FRAME = re.compile(r'^  File "(.+)", line (\d+), in (\S+)$', re.MULTILINE)


def _is_users_file(file: str) -> bool:
    """The path-only test of :func:`user_code_origin`'s frames (a traceback handed on as text
    has no module names): not the standard library's, an installed package's or ptrain's."""
    return not (_is_stdlib_file(file) or file.startswith("<") or _is_installed_file(file)
                or any(p == "ptrain" or p.startswith("ptrain_") for p in Path(file).parts))


def dataloader_worker_origin(exc: BaseException) -> str | None:
    """``"__getitem__ (data.py:12) in DataLoader worker process 0"`` for an exception that torch
    raised again from a DataLoader worker: the innermost frame of the user's code in the
    worker's traceback, which torch hands on as text; else ``None``."""
    text = str(exc.args[0]) if exc.args else ""
    found = _WORKER_ERROR.match(text)
    if found is None:
        return None
    for file, line, function in reversed(_TEXT_FRAME.findall(text)):
        if _is_users_file(file):
            return (f"{function} ({Path(file).name}:{line}) in DataLoader worker process "
                    f"{found.group(1)}")
    return None


def dataloader_worker_death(exc: BaseException) -> str | None:
    """torch's one line when a DataLoader worker process died without a Python error (a fault
    in native code, a kill by the out-of-memory killer); else ``None``."""
    text = str(exc)
    if isinstance(exc, RuntimeError) and text.startswith("DataLoader worker (pid"):
        return text.splitlines()[0]
    # a worker that dies while handing over a batch's shared memory breaks the connection
    # before torch has seen it die: the error comes out of the loader's fetch as it is
    if isinstance(exc, (ConnectionError, EOFError)) and any(
            frame.name == "_try_get_data" and frame.filename.replace("\\", "/").endswith(
                "torch/utils/data/dataloader.py")
            for frame in traceback.extract_tb(exc.__traceback__)):
        return (f"its connection broke as it handed over a batch: {type(exc).__name__}: "
                f"{text}")
    return None


#: ptrain's modules whose code calls a plugin's hook implementations (besides pluggy's)
_HOOK_CALLERS = ("ptrain.hook_calls", "ptrain.loading")


def _calls_hooks(module: str) -> bool:
    return module.split(".")[0] == "pluggy" or module in _HOOK_CALLERS


def plugin_origin(exc: BaseException, installed_only: bool = False) -> str | None:
    """``"plugin 'NAME' (DISTRIBUTION VERSION) raised TYPE in its HOOK hook"`` when ``exc`` came
    out of a plugin's hook implementation (the innermost frame called by pluggy or ptrain's hook
    callers that is not ptrain's core), else ``None``; with ``installed_only``, only when the
    plugin's code belongs to an installed distribution (wherever its files are: an editable
    install's are in its source folder)."""
    from ptrain.loading import IMPL_MARK

    found = None
    previous = ""
    for frame, _ in _tb_frames(exc):
        module = frame.f_globals.get("__name__", "")
        if _calls_hooks(previous) and not _calls_hooks(module) \
                and module != "ptrain.hook_methods":  # a Lightning-style method: user code
            found = frame
        previous = module
    if found is None:
        return None
    owner = found.f_locals.get("self")
    hook = found.f_code.co_name
    if owner is not None:
        marker = getattr(getattr(type(owner), hook, None), IMPL_MARK, None) or {}
        hook = marker.get("specname") or hook
        from ptrain.selection import object_name

        name = _registered_name(exc, owner) or object_name(owner)
    else:
        name = found.f_globals.get("__name__", "?")
    distribution = _distribution(found)
    if distribution is None and installed_only:
        return None
    where = distribution or f"module {found.f_globals.get('__name__', '?')}"
    return f"plugin {name!r} ({where}) raised {type(exc).__name__} in its {hook} hook"


def _registered_name(exc: BaseException, plugin: Any) -> str | None:
    """The name ``plugin`` was selected and registered by (``-p NAME``, an entry point's
    name), from the trainer found in ``exc``'s traceback."""
    for frame, _ in _tb_frames(exc):
        trainer = frame.f_locals.get("self")
        if frame.f_globals.get("__name__") == "ptrain.trainer" and hasattr(trainer, "pm"):
            return trainer.pm.get_name(plugin)
    return None


def _distribution(frame: Any) -> str | None:
    """``"NAME VERSION"`` of the installed distribution holding ``frame``'s code, or ``None``."""
    from importlib import metadata

    root = _root(frame)
    try:
        names = metadata.packages_distributions().get(root) or []
        if names:
            return f"{names[0]} {metadata.version(names[0])}"
    except Exception:  # a broken installation must not hide the plugin's error
        pass
    return None


#: what the line above a plugin's traceback adds to naming it
PLUGIN_BLAME = " That is the plugin's bug: report it to its authors, or run without it."


def error_origin(exc: BaseException) -> tuple[str, bool] | None:
    """Whose code raised ``exc``: ``("your code raised TYPE in WHERE", False)``, ``("plugin
    'NAME' (DISTRIBUTION VERSION) raised TYPE in its HOOK hook", True)``, or ``None`` when
    neither is found. Read where ``exc``'s traceback still holds its frames: in the process
    that raised it (a failing rank reads it before it reports to the launching process)."""
    # an installed plugin's code is its authors', wherever pip put its files (an editable
    # install leaves them outside site-packages, where they would pass for the user's)
    plugin = plugin_origin(exc, installed_only=True)
    where = None if plugin is not None else user_code_origin(exc) or dataloader_worker_origin(exc)
    if where is not None:
        return f"your code raised {type(exc).__name__} in {where}", False
    plugin = plugin or plugin_origin(exc)
    return None if plugin is None else (plugin, True)


def fit_checkpoint(exc: BaseException) -> Path | None:
    """The resumable checkpoint of the ``fit`` that ``exc`` ended, when one was written before
    it (``None`` when the error came before any, or outside a fit)."""
    for frame, _ in _tb_frames(exc):
        if frame.f_code.co_name == "_run_stage" and frame.f_globals.get("__name__") == \
                "ptrain.trainer" and frame.f_locals.get("stage") == "fit":
            trainer = frame.f_locals.get("self")
            log_dir = getattr(trainer, "log_dir", None)
            if log_dir is not None:
                path = trainer.last_checkpoint_path
                return path if path.exists() else None
    return None


__all__ = ["PLUGIN_BLAME", "error_origin", "fit_checkpoint", "is_library_frame", "plugin_origin",
           "user_code_origin"]
