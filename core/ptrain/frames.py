"""Telling the user's code from the libraries' in a stack: for messages that name where
something happened (the rank watch's heartbeat, the CLI's line above a user's traceback)."""

from __future__ import annotations

import sysconfig
from typing import Any

#: Frames of these packages, and of the standard library, are not the user's code: the code
#: that called into them is.
_LIBRARIES = frozenset({"torch", "pluggy"})
_STDLIB = sysconfig.get_paths()["stdlib"]


def is_library_frame(frame: Any) -> bool:
    """Whether ``frame`` runs torch's, pluggy's or the standard library's code."""
    file = frame.f_code.co_filename
    root = frame.f_globals.get("__name__", "").split(".")[0]
    return (root in _LIBRARIES or file.startswith(_STDLIB) and "site-packages" not in file
            or file.startswith("<frozen"))


__all__ = ["is_library_frame"]
