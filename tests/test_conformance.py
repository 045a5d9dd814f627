"""Every plugin distribution of this repository against its kind's conformance suite.

The plugins come from the installed entry points whose distribution was installed from this
checkout (its ``direct_url.json`` points into the repository), so a new plugin is covered as
soon as ``scripts/install.sh`` installed it; ``test_every_plugin_of_the_repository_is_covered``
checks that against the ``pyproject.toml`` files. One test class per plugin is generated below
(``TestCallback_early_stopping``, ...). Plugins for hardware this machine lacks skip with their
own reason. Multi-process strategies run with 2 gloo ranks on the CPU and are marked slow.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from ptrain.catalog import GROUPS
from ptrain.testing import (AcceleratorSuite, CallbackSuite, PrecisionSuite, StrategySuite,
                            TinyConvModule, TinyManualModule)
from ptrain.testing.suites import is_multi_process
from tests._fp8_models import Float8SizedTinyModule

REPO = Path(__file__).resolve().parent.parent
#: Where scripts/install.sh finds the repository's distributions.
DISTRIBUTION_GLOBS = ("pyproject.toml", "plugins/*/*/pyproject.toml",
                      "examples/plugins/*/pyproject.toml")
SUITES = {"accelerator": AcceleratorSuite, "strategy": StrategySuite,
          "precision": PrecisionSuite, "callback": CallbackSuite}
#: Options a plugin can't run without (required, or no automatic default for TinyModule), or
#: that keep its run short (compile: aot_eager traces and runs the graph like inductor, without
#: generating C++; inductor itself is tested in tests/plugins/callbacks/test_compile.py).
OPTIONS = {
    ("callback", "early-stopping"): {"monitor": "val_loss"},
    ("callback", "activation-checkpointing"): {"classes": ["Linear"]},
    ("callback", "compile"): {"backend": "aot_eager"},
    ("callback", "wandb"): {"mode": "offline"},  # no network in tests
    # float8 matmuls need a GPU: emulated elsewhere; TinyModule's two layers are its first
    # and last, which fp8-mixed keeps in high precision by default
    ("precision", "fp8-mixed"): {
        "emulate": os.environ.get("PTRAIN_CONFORMANCE_ACCELERATOR") != "cuda",
        "keep_ends": False},
}
#: Plugins made for another kind of module than TinyModule.
MODULES = {
    ("callback", "toggling"): TinyManualModule,  # for modules that optimize manually
    ("callback", "channels-last"): TinyConvModule,  # for models with convolutions
    ("precision", "fp8-mixed"): Float8SizedTinyModule,  # Linear sizes float8 matmuls take
}
#: The accelerator every suite but the accelerators' own trains on, when set (scripts/gpu-check.sh
#: sets ``cuda``); unset, each suite's own default (the CPU).
ACCELERATOR = os.environ.get("PTRAIN_CONFORMANCE_ACCELERATOR")
#: (kind, name, test) -> why it fails: a finding about the plugin, not a weaker suite.
KNOWN_FAILURES: dict[tuple[str, str, str], str] = {}


def _installed_from_repo(dist: metadata.Distribution) -> bool:
    text = dist.read_text("direct_url.json")
    if not text:
        return False
    url = json.loads(text).get("url", "")
    if not url.startswith("file://"):
        return False
    path = Path(url[len("file://"):]).resolve()
    return path == REPO or REPO in path.parents


def repo_plugins() -> list[tuple[str, str, str]]:
    """(kind, name, distribution) of every installed plugin whose distribution was installed
    from this repository."""
    found = set()
    for kind, group in GROUPS.items():
        for ep in metadata.entry_points(group=group):
            if ep.dist is not None and _installed_from_repo(ep.dist):
                found.add((kind, ep.name, ep.dist.metadata["Name"]))
    return sorted(found)


def declared_plugins() -> set[tuple[str, str, str]]:
    """(kind, name, distribution) of every plugin the repository's pyproject.toml files
    declare."""
    kinds = {group: kind for kind, group in GROUPS.items()}
    declared = set()
    for pattern in DISTRIBUTION_GLOBS:
        for path in REPO.glob(pattern):
            project = tomllib.loads(path.read_text(encoding="utf-8")).get("project", {})
            for group, entries in project.get("entry-points", {}).items():
                if group in kinds:
                    declared.update((kinds[group], name, project["name"]) for name in entries)
    return declared


def _class_name(kind: str, name: str) -> str:
    return f"Test{kind.capitalize()}_{re.sub(r'[^0-9a-zA-Z]', '_', name)}"


class _KnownFailures:
    """Marks the tests listed in KNOWN_FAILURES as strict expected failures."""

    @pytest.fixture(autouse=True)
    def _known_failure(self, request):
        reason = KNOWN_FAILURES.get((self.kind, self.plugin, request.node.originalname))
        if reason is not None:
            request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


GENERATED: dict[str, tuple[str, str]] = {}
for _kind, _name, _dist in repo_plugins():
    _attrs = {"plugin": _name, "options": OPTIONS.get((_kind, _name), {}),
              "module_factory": MODULES.get((_kind, _name), SUITES[_kind].module_factory),
              "__module__": __name__, "__doc__": f"{_kind} {_name!r} from {_dist}."}
    if ACCELERATOR and _kind != "accelerator":
        _attrs["trainer_options"] = {**SUITES[_kind].trainer_options, "accelerator": ACCELERATOR}
    if _kind == "strategy" and is_multi_process(_name):
        _attrs["pytestmark"] = [pytest.mark.slow]
    _cls_name = _class_name(_kind, _name)
    globals()[_cls_name] = type(_cls_name, (_KnownFailures, SUITES[_kind]), _attrs)
    GENERATED[_cls_name] = (_kind, _name)


def test_every_plugin_of_the_repository_is_covered():
    declared = declared_plugins()
    installed = set(repo_plugins())
    assert declared, "no pyproject.toml of the repository declares a plugin"
    assert not declared - installed, (
        f"declared in the repository but not installed from it (run scripts/install.sh): "
        f"{sorted(declared - installed)}")
    assert not installed - declared, (
        f"installed from this repository but declared by no pyproject.toml here: "
        f"{sorted(installed - declared)}")
    covered = set(GENERATED.values())
    assert covered == {(kind, name) for kind, name, _ in installed}
    for cls_name, (kind, _name) in GENERATED.items():
        assert issubclass(globals()[cls_name], SUITES[kind])
    assert {kind for kind, _ in covered} == set(SUITES), "a kind of plugin has no plugin here"


def test_known_failures_name_existing_tests():
    for kind, name, test in KNOWN_FAILURES:
        assert (kind, name) in GENERATED.values(), f"no {kind} {name!r} in the repository"
        assert hasattr(SUITES[kind], test), f"{SUITES[kind].__name__} has no {test}"
