"""A Lightning callback that is also a plugin of its own name.

A :class:`~ptrain.hook_methods.Callback` whose class implements a ptrain hook is registered as
it is, and calls its Lightning methods itself (see that class). A callback of this layer that
needs a ptrain hook Lightning has no method for (``wrap_model``: before the optimizers are
configured) derives from :class:`PluginCallback`, which answers ``unused_step_hooks`` (with
``None``: every hook it implements is called), a public hook implementation: that is what makes
ptrain register the object as a plugin, under :attr:`PluginCallback.plugin_name`, rather than
adapt its methods, also where its class marks only private methods (``@hookimpl(specname=...)``).
"""

from __future__ import annotations

from ptrain.hook_methods import Callback
from ptrain.hookspecs import hookimpl


class PluginCallback(Callback):
    """A :class:`~ptrain.hook_methods.Callback` whose class may also implement ptrain hooks
    (``@hookimpl(specname=...)`` on private method names). ``plugin_name`` names it among the
    run's plugins (one of the same name replaces a default, as ``progress-bar``)."""

    @property
    def plugin_name(self) -> str:
        return type(self).__name__

    @hookimpl
    def unused_step_hooks(self) -> None:
        return None
