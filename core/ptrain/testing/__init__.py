"""The plugin author's test kit: a tiny model, one-call fits, a hook recorder and conformance
suites (see ``docs/testing-plugins.md``).

``from ptrain.testing import TinyModule, run_fit, HookRecorder`` works without pytest; the
suites (``AcceleratorSuite``, ``PrecisionSuite``, ``StrategySuite``, ``CallbackSuite``) are pytest
test classes and import it. The fixtures ``ptrain_fit`` and ``hook_recorder`` come from the
pytest plugin ``ptrain.testing.pytest_plugin``, which pytest loads by itself (the ``pytest11``
entry point of ptrain-core). Names are imported on first use, so ``import ptrain.testing`` is
cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {
    "TinyModule": "ptrain.testing.models",
    "TinyManualModule": "ptrain.testing.models",
    "TinyConvModule": "ptrain.testing.models",
    "run_fit": "ptrain.testing.runs",
    "plugin_kind": "ptrain.testing.runs",
    "HookRecorder": "ptrain.testing.recorder",
    "HookCall": "ptrain.testing.recorder",
    "ImplCall": "ptrain.testing.recorder",
    "RecordedError": "ptrain.testing.recorder",
    "PluginSuite": "ptrain.testing.suites",
    "AcceleratorSuite": "ptrain.testing.suites",
    "PrecisionSuite": "ptrain.testing.suites",
    "StrategySuite": "ptrain.testing.suites",
    "CallbackSuite": "ptrain.testing.suites",
    "SuiteRun": "ptrain.testing.suites",
    "assert_same_state": "ptrain.testing.suites",
    "LiveStorages": "ptrain.testing.memory",
    "PUBLIC_MODULES": "ptrain.testing.public_api",
    "private_imports": "ptrain.testing.public_api",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ptrain.testing' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
