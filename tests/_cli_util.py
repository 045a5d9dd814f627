"""Helpers shared by ``test_cli.py`` and ``test_plugin_discovery.py``.

``run_cli`` (from conftest) runs the real ``ptrain`` command in a subprocess; the helpers here
check what a usage error must look like and build the third-party plugin distributions of
``tests/fixtures/plugin_projects`` into a private site folder (a real ``pip install``, offline).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

from conftest import CLIResult, run_cli

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PLUGIN_PROJECTS = TESTS / "fixtures" / "plugin_projects"

#: kind -> entry-point group, written out here (not imported from ptrain.catalog) so that a change
#: of the core's groups is noticed by the tests.
GROUPS = {
    "accelerator": "ptrain.accelerators",
    "strategy": "ptrain.strategies",
    "precision": "ptrain.precision",
    "callback": "ptrain.callbacks",
}

#: What the core distribution ships, as (kind, name).
BUILTINS = [
    ("accelerator", "cpu"),
    ("strategy", "single-device"),
    ("precision", "32-true"),
    ("callback", "checkpoint"),
    ("callback", "tensorboard"),
    ("callback", "progress-bar"),
    ("callback", "results"),
    ("callback", "dataloading"),
    ("callback", "model-summary"),
]


def assert_usage_error(result, *needles: str) -> str:
    """``result`` is a usage error: exit code 2, one ``ptrain: error:`` paragraph on stderr, no
    traceback, and every one of ``needles`` in the message. Returns the message."""
    detail = f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert result.returncode == 2, detail
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, detail
    assert result.stderr.startswith("ptrain: error:"), detail
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} is not in the message\n{detail}"
    return result.stderr


def assert_ok(result) -> None:
    detail = f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert result.returncode == 0, detail
    assert "Traceback" not in result.stderr, detail


def installed_entry_points(extra_site: Path | None = None) -> set[tuple[str, str, str, str]]:
    """Every (kind, name, distribution, version) that the ptrain groups hold, as importlib.metadata
    sees them from this interpreter's path plus ``extra_site``."""
    path = ([str(extra_site)] if extra_site is not None else []) + sys.path
    rows = set()
    seen_dists = set()
    for dist in metadata.distributions(path=path):
        name = dist.metadata["Name"]
        if name is None:
            continue
        key = name.lower().replace("_", "-")
        if key in seen_dists:  # the first one on the path wins, like importing would
            continue
        seen_dists.add(key)
        for ep in dist.entry_points:
            for kind, group in GROUPS.items():
                if ep.group == group:
                    rows.add((kind, ep.name, name, dist.version))
    return rows


def installed_names(kind: str) -> list[str]:
    return sorted({name for k, name, _, _ in installed_entry_points() if k == kind})


def build_plugin_site(workdir: Path, projects: list[str]) -> Path:
    """Copy the named projects of ``tests/fixtures/plugin_projects`` to ``workdir`` (so that the
    build leaves nothing in the repository), then ``pip install`` them, offline and without
    dependencies, into ``workdir/site``. Returns the site folder, for ``PYTHONPATH``."""
    site = workdir / "site"
    sources = []
    for project in projects:
        source = workdir / "src" / project
        shutil.copytree(PLUGIN_PROJECTS / project, source)
        sources.append(str(source))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--quiet", "--target", str(site), *sources],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PIP_NO_INPUT": "1"},
    )
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout}\n{proc.stderr}"
    return site


def pythonpath_env(site: Path) -> dict[str, str]:
    existing = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": str(site) + (os.pathsep + existing if existing else "")}


class CLIRuns:
    """Runs of the real CLI started ahead of the tests that check them, two at a time (the test
    machine has two cores), so that a module's independent runs overlap.

    ``runs.start(key, *args, used_by=(test function names), **run_cli_kwargs)`` queues a run if
    one of ``used_by`` is among the tests selected in this session (so that ``-k`` stays fast);
    ``runs[key]`` waits for its :class:`CLIResult`. ``runs.dirs`` is free for the caller's
    scratch folders."""

    def __init__(self, request, workers: int = 2):
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ptrain-cli")
        self._futures: dict[str, Future] = {}
        self.selected = {item.originalname for item in request.session.items
                         if item.path == request.path}
        self.dirs: dict[str, Path] = {}
        self._module = request.module

    def wanted(self, used_by: tuple[str, ...]) -> bool:
        unknown = [name for name in used_by if not callable(getattr(self._module, name, None))]
        assert not unknown, f"used_by names no test function of this module: {unknown}"
        return bool(self.selected.intersection(used_by))

    def start(self, key: str, *args: str, used_by: tuple[str, ...], **kwargs: Any) -> None:
        assert key not in self._futures, key
        if self.wanted(used_by):
            self._futures[key] = self._executor.submit(run_cli, *args, **kwargs)

    def __getitem__(self, key: str) -> CLIResult:
        return self._futures[key].result()

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
