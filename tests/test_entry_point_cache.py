"""Plugin discovery reads the installed entry points from disk once per installation state
(issue 18): the cached answer is the scan's, and installing, changing or removing a
distribution on ``sys.path`` is seen by the next discovery."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ptrain.catalog import GROUPS, Catalog
from ptrain.entry_point_cache import cache_file, entry_points, fingerprint, scan

GROUP_LIST = list(GROUPS.values())


def install(site: Path, dist: str, version: str, entry_points_txt: str,
            kind: str = "dist-info") -> Path:
    """A distribution's metadata as a wheel install (``dist-info``) or setuptools' develop
    mode (``egg-info``) leaves it (no code is needed to list it)."""
    info = site / f"{dist.replace('-', '_')}-{version}.{kind}"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(entry_points_txt)
    return info


@pytest.fixture
def site(tmp_path, monkeypatch):
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.setattr(sys, "path", [str(folder), *sys.path])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return folder


def test_the_cached_answer_is_the_scan_and_is_written_once(site):
    first = entry_points(GROUP_LIST)
    key = fingerprint(GROUP_LIST)
    assert cache_file(key).is_file()
    assert first == scan(GROUP_LIST)
    written = cache_file(key).stat().st_mtime_ns
    assert entry_points(GROUP_LIST) == first
    assert cache_file(key).stat().st_mtime_ns == written  # read, not written again


def remove(info: Path) -> None:
    for file in info.iterdir():
        file.unlink()
    info.rmdir()


def test_installing_upgrading_and_removing_a_plugin_is_seen(site):
    before = Catalog.discover()
    assert "cached-probe" not in before.names("callback")
    info = install(site, "ptrain-cached-probe", "1.2.0",
                   "[ptrain.callbacks]\ncached-probe = probe_module:Probe\n")
    found = Catalog.discover().get("callback", "cached-probe")
    assert (found.distribution, found.version, found.target) == (
        "ptrain-cached-probe", "1.2.0", "probe_module:Probe")
    # an upgrade, as installers do it: the old folder removed, the new one written whole
    remove(info)
    info = install(site, "ptrain-cached-probe", "1.3.0",
                   "[ptrain.callbacks]\ncached-probe = probe_module:ProbeRenamed\n")
    found = Catalog.discover().get("callback", "cached-probe")
    assert (found.version, found.target) == ("1.3.0", "probe_module:ProbeRenamed")
    # a reinstall of the same version that changes only the entry points
    remove(info)
    info = install(site, "ptrain-cached-probe", "1.3.0",
                   "[ptrain.callbacks]\ncached-probe = probe_module:Probe3\n")
    assert Catalog.discover().get("callback", "cached-probe").target == "probe_module:Probe3"
    remove(info)
    assert "cached-probe" not in Catalog.discover().names("callback")


def test_an_egg_info_rewritten_in_place_is_seen(site):
    info = install(site, "ptrain-develop-probe", "0.1.0",
                   "[ptrain.callbacks]\ndevelop-probe = probe_module:Probe\n", kind="egg-info")
    assert Catalog.discover().get("callback", "develop-probe").target == "probe_module:Probe"
    # setuptools regenerates a develop-mode project's metadata in place
    (info / "entry_points.txt").write_text(
        "[ptrain.callbacks]\ndevelop-probe = probe_module:ProbeRenamed\n")
    assert Catalog.discover().get("callback", "develop-probe").target == \
        "probe_module:ProbeRenamed"


def test_a_cache_folder_that_cannot_be_written_only_costs_a_scan(site, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    install(site, "ptrain-uncached", "0.3.0", "[ptrain.callbacks]\nuncached = m:C\n")
    assert "uncached" in Catalog.discover().names("callback")
    assert blocker.is_file()
