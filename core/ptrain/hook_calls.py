"""Direct callers for the hooks that fire on every batch.

A pluggy hook call costs about 2 µs of bookkeeping (argument checks, the generic multicall), which
on a small model is most of a trainer's overhead. For a hook without wrappers, that bookkeeping
changes nothing: the result is that of calling its implementations in pluggy's order (most
recently registered first, ``tryfirst``/``trylast`` respected) and, for a firstresult hook,
stopping at the first non-None result. :func:`direct_caller` does exactly that, and falls back to
the pluggy hook itself whenever a wrapper is registered.
The callers are built after every plugin is registered, so they see the final set.
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

from ptrain.loading import bind_impl

PER_STEP_HOOKS = (
    "transfer_batch", "model_step", "backward", "on_before_optimizer_step", "clip_gradients",
    "optimizer_step", "on_train_batch_end",
)


def direct_caller(pm: pluggy.PluginManager, name: str) -> Callable[..., Any]:
    """A callable with the same result as ``pm.hook.<name>(**kwargs)``."""
    caller = getattr(pm.hook, name)
    impls = caller.get_hookimpls()
    if any(impl.wrapper or impl.hookwrapper for impl in impls):
        return caller
    spec_args = tuple(caller.spec.argnames)
    functions = [bind_impl(impl, spec_args) for impl in reversed(impls)]  # pluggy's call order
    if caller.spec.opts.get("firstresult"):
        if len(functions) == 1:
            return functions[0]

        def first_result(**kwargs: Any) -> Any:
            for function in functions:
                result = function(**kwargs)
                if result is not None:
                    return result
            return None

        return first_result

    def all_results(**kwargs: Any) -> list[Any]:
        results = []
        for function in functions:
            result = function(**kwargs)
            if result is not None:
                results.append(result)
        return results

    return all_results


class StepHooks:
    """The per-step hooks of one run, as direct callers (attributes named after the hooks)."""

    def __init__(self, pm: pluggy.PluginManager):
        for name in PER_STEP_HOOKS:
            setattr(self, name, direct_caller(pm, name))
        self.has_before_optimizer_step = bool(pm.hook.on_before_optimizer_step.get_hookimpls())
