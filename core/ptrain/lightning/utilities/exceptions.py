"""Lightning's exception names: ``MisconfigurationException`` is ptrain's
:class:`ptrain.ConfigError` (what ptrain raises for a wrong argument or value, where Lightning
raises ``MisconfigurationException``), so a program that catches the one catches the other."""

from __future__ import annotations

from ptrain.errors import ConfigError

MisconfigurationException = ConfigError


class SIGTERMException(SystemExit):
    """Lightning's exception for a SIGTERM received during a run. ptrain's ``stop-signals``
    callback handles SIGTERM itself (a resumable checkpoint, then :class:`ptrain.errors.
    Interrupted`) and never raises this; it exists so that code naming it imports."""
