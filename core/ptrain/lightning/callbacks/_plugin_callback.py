"""A Lightning callback that also implements ptrain hooks itself.

ptrain calls a callback's Lightning-named methods (``on_train_epoch_start``, ...) through an
adapter plugin (:func:`ptrain.hook_methods.callback_hook_plugin`), made only for an object that
implements no ptrain hook; an object that does is registered as it is. A callback of this layer
that needs a ptrain hook Lightning has no method for (``wrap_model``: before the optimizers are
configured) derives from :class:`PluginCallback`: each object carries, as its own attributes, the
adapter's hook implementations for the Lightning methods its class defines (a user's subclass
included), under private names (``_lightning_<hook>``, marked with the hook's ``specname``), so
both kinds are called. It also answers ``unused_step_hooks`` (with ``None``: every hook it
implements is called), a public hook implementation: that is what makes ptrain register the
object as a plugin rather than adapt its methods a second time.
"""

from __future__ import annotations

from typing import Any

from ptrain.hook_methods import Callback, callback_hook_plugin
from ptrain.hookspecs import hookimpl
from ptrain.loading import HOOK_NAMES, IMPL_MARK

_PREFIX = "_lightning_"


class PluginCallback(Callback):
    """A :class:`~ptrain.hook_methods.Callback` whose class may also implement ptrain hooks
    (``@hookimpl(specname=...)`` on private method names). ``plugin_name`` names it among the
    run's plugins (one of the same name replaces a default, as ``progress-bar``)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> PluginCallback:
        self = super().__new__(cls)
        self._carry_lightning_methods()
        return self

    @property
    def plugin_name(self) -> str:
        return type(self).__name__

    def _carry_lightning_methods(self) -> None:
        adapter = callback_hook_plugin([self], type(self).__name__)
        for hook in HOOK_NAMES:
            function = getattr(adapter, hook, None)
            if function is not None and isinstance(getattr(function, IMPL_MARK, None), dict):
                setattr(function, IMPL_MARK, {**getattr(function, IMPL_MARK), "specname": hook})
                self.__dict__[_PREFIX + hook] = function

    @hookimpl
    def unused_step_hooks(self) -> None:
        return None

    def __getstate__(self) -> dict[str, Any]:
        # the carried implementations are closures, made again when the object is (unpickling
        # calls __new__)
        return {k: v for k, v in self.__dict__.items() if not k.startswith(_PREFIX)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
