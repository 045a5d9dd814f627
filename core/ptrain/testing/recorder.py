"""``HookRecorder``: a plugin that keeps every hook call of the runs it takes part in."""

from __future__ import annotations

from ptrain.hook_calls import HookCall, ImplCall


class HookRecorder:
    """Pass it among the callbacks (``run_fit(recorder)``, ``Trainer(callbacks=[recorder])``);
    after the run, :attr:`calls` holds every hook call of the run as a :class:`HookCall`: its
    ``name``, ``kwargs`` (the hook's arguments, ``trainer`` excluded), ``result``, ``error``,
    and ``impls`` (each implementation that ran: ``plugin``, ``seconds``, ``result``).

    It sees the per-step hooks too, which the core calls directly rather than through pluggy:
    while an observer such as this one is registered, the core times each implementation and
    reports each call (a few microseconds per call; without an observer nothing is added).
    Calls are kept in start order; a second run appends to them. Arguments and results are
    kept as they are (tensors included): meant for short test runs. In a multi-process run
    each worker records into its own copy of the recorder, which the test does not see.
    """

    name = "hook-recorder"

    def __init__(self) -> None:
        self._calls: list[HookCall] = []
        self._in_order = True

    def observe_hook_call(self, call: HookCall) -> None:
        """Called by the core for each hook call once it returned (a nested call first)."""
        if self._calls and call.index < self._calls[-1].index:
            self._in_order = False
        self._calls.append(call)

    @property
    def calls(self) -> list[HookCall]:
        """Every recorded call, in the order the calls started."""
        if not self._in_order:
            self._calls.sort(key=lambda call: call.index)
            self._in_order = True
        return self._calls

    def names(self) -> list[str]:
        """The hook names of :attr:`calls`, in call order."""
        return [call.name for call in self.calls]

    def calls_of(self, name: str) -> list[HookCall]:
        """The calls of hook ``name``, in call order."""
        return [call for call in self.calls if call.name == name]

    def clear(self) -> None:
        """Forget what was recorded."""
        self._calls.clear()
        self._in_order = True


__all__ = ["HookCall", "HookRecorder", "ImplCall"]
