"""``HookRecorder``: a plugin that keeps every hook call of the runs it takes part in."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ptrain.hook_calls import HookCall, ImplCall

_SCALARS = (str, int, float, bool, type(None))


class RecordedError(Exception):
    """An error a hook call raised in another process, read back from a recording: its text
    (``"TypeName: message"``), not the exception object."""


class HookRecorder:
    """Pass it among the callbacks (``run_fit(recorder)``, ``Trainer(callbacks=[recorder])``);
    after the run, :attr:`calls` holds every hook call of the run as a :class:`HookCall`: its
    ``name``, ``kwargs`` (the hook's arguments, ``trainer`` excluded), ``result``, ``error``,
    and ``impls`` (each implementation that ran: ``plugin``, ``seconds``, ``result``).

    It sees the per-step hooks too, which the core calls directly rather than through pluggy:
    while an observer such as this one is registered, the core times each implementation and
    reports each call (a few microseconds per call; without an observer nothing is added).
    Calls are kept in start order; a second run appends to them. Arguments and results are
    kept as they are (tensors included): meant for short test runs.

    In a multi-process run each worker records into its own copy of the recorder, which the
    launching process does not see. Give ``save_to`` (a folder) and each process writes its
    calls to ``save_to/hooks-rank<N>.json`` (``hooks.json`` in a single-process run) when its
    outermost ``teardown`` returns; :meth:`load` reads one back. A saved call keeps its name,
    order, depth, rank, the plugins that ran, the arguments that are plain values (str, int,
    float, bool, None) and the text of its error; tensors and results are not saved.
    """

    name = "hook-recorder"

    def __init__(self, save_to: str | os.PathLike[str] | None = None) -> None:
        self._calls: list[HookCall] = []
        self._in_order = True
        self.save_to = None if save_to is None else str(save_to)

    def observe_hook_call(self, call: HookCall) -> None:
        """Called by the core for each hook call once it returned (a nested call first)."""
        if self._calls and call.index < self._calls[-1].index:
            self._in_order = False
        self._calls.append(call)
        if self.save_to is not None and call.name == "teardown" and call.depth == 0:
            self._save()

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

    # -- recordings of other processes ---------------------------------------------------------

    @staticmethod
    def saved_path(folder: str | os.PathLike[str], rank: int | None) -> Path:
        """Where a recorder with ``save_to=folder`` writes the calls of process ``rank``."""
        return Path(folder) / ("hooks.json" if rank is None else f"hooks-rank{rank}.json")

    def _save(self) -> None:
        # a few calls (setup_device, teardown) come before the process group or after it
        ranks = [call.rank for call in self.calls if call.rank is not None]
        path = self.saved_path(self.save_to, ranks[0] if ranks else None)
        path.parent.mkdir(parents=True, exist_ok=True)
        records = [_call_record(call) for call in self.calls]
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(records))
        os.replace(tmp, path)  # a reader finds the whole recording or none

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> HookRecorder:
        """A recorder holding the calls a recorder with ``save_to`` wrote to ``path``; errors
        come back as :class:`RecordedError`."""
        recorder = cls()
        for record in json.loads(Path(path).read_text()):
            recorder._calls.append(HookCall(
                record["name"], record["kwargs"], record["index"], record["depth"],
                record["rank"], impls=[ImplCall(plugin, wrapper) for plugin, wrapper
                                       in record["impls"]],
                error=_error(record["error"]), seconds=record["seconds"]))
        return recorder


def _call_record(call: HookCall) -> dict[str, Any]:
    return {"name": call.name, "index": call.index, "depth": call.depth, "rank": call.rank,
            "seconds": call.seconds,
            "kwargs": {k: v for k, v in call.kwargs.items() if isinstance(v, _SCALARS)},
            "impls": [[impl.plugin, impl.wrapper] for impl in call.impls],
            "error": None if call.error is None
            else f"{type(call.error).__name__}: {call.error}"}


def _error(text: str | None) -> RecordedError | None:
    return None if text is None else RecordedError(text)


__all__ = ["HookCall", "HookRecorder", "ImplCall", "RecordedError"]
