"""Plugin discovery through entry points, with real installed distributions.

The third-party plugins are small projects under ``tests/fixtures/plugin_projects``, built and
installed with pip (offline, ``--target``) into a private folder that the CLI subprocesses get on
``PYTHONPATH``; nothing is installed into the virtual environment:

- ``ptrain-step-counter`` 1.2.3: callback ``step-counter`` with two options, writes what it saw;
- ``ptrain-broken-plugin`` 0.0.7: callback ``broken``, its module raises ImportError;
- ``ptrain-twin-a`` 1.0.0 and ``ptrain-twin-b`` 2.5.0: both claim the callback name ``twin``;
- ``ptrain-typo-hook`` 0.3.0: callback ``typo-hook`` implements ``on_epoch_ned`` (a typo).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest

from _cli_util import (BUILTINS, REPO, CLIRuns, assert_ok, assert_usage_error,
                       build_plugin_site, installed_entry_points, pythonpath_env)

pytestmark = pytest.mark.slow

PROJECTS = ["step_counter", "broken", "twin_a", "twin_b", "typo_hook"]
THIRD_PARTY = {
    ("callback", "step-counter", "ptrain-step-counter", "1.2.3"),
    ("callback", "broken", "ptrain-broken-plugin", "0.0.7"),
    ("callback", "twin", "ptrain-twin-a", "1.0.0"),
    ("callback", "twin", "ptrain-twin-b", "2.5.0"),
    ("callback", "typo-hook", "ptrain-typo-hook", "0.3.0"),
}
PLUGIN_MODULES = ["ptrain_step_counter", "ptrain_broken_plugin", "ptrain_twin_a", "ptrain_twin_b",
                  "ptrain_typo_hook"]
MODEL = ["--model", "tests.conftest:TinyRegressor", "--accelerator", "cpu"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return build_plugin_site(tmp_path_factory.mktemp("plugins"), PROJECTS)


@pytest.fixture(scope="module")
def runs(request, site, tmp_path_factory):
    """Every CLI run of this module, with the test plugins installed, started up front (two at a
    time); ``runs.dirs[key]`` is a fit run's --default-root-dir."""
    pool = CLIRuns(request)
    env = pythonpath_env(site)

    def plugins(key: str, *args: str, used_by: tuple[str, ...]) -> None:
        pool.start(key, *args, env=env, used_by=used_by)

    def fit(key: str, *args: str, used_by: tuple[str, ...]) -> None:
        root = pool.dirs[key] = tmp_path_factory.mktemp(key) / "runs"
        pool.start(key, "fit", *MODEL, "--max-epochs", "1", "--default-root-dir", str(root),
                   "--no-progress-bar", *args, env=env, used_by=used_by)

    listing_tests = ("test_listing_shows_every_installed_plugin",
                     "test_listing_json_is_the_same_data",
                     "test_listing_marks_a_name_claimed_by_two_distributions",
                     "test_listing_survives_a_broken_plugin")
    plugins("plugins", "plugins", used_by=listing_tests)
    plugins("plugins-json", "plugins", "--json", used_by=listing_tests)
    plugins("version", "--version", used_by=("test_version_names_every_plugin_distribution",))
    fit("step-counter", "-p", "step-counter", "--step-counter-label", "hello",
        "--step-counter-start", "5", used_by=("test_third_party_callback_runs_with_its_options",))
    fit("blocked", "-p", "step-counter", "-p", "no:step-counter", "-p", "broken",
        "-p", "no:broken", used_by=("test_blocking_keeps_plugins_out_of_the_run",))
    plugins("check", "plugins", "--check", used_by=("test_check_reports_ok_and_broken",))
    plugins("fit-help-all", "fit", "--help-all",
            used_by=("test_fit_help_all_shows_every_plugin_option_group",))
    plugins("fit-help-selected", "fit", "-p", "step-counter", "--help",
            used_by=("test_fit_help_all_shows_every_plugin_option_group",))
    fit("select-broken", "-p", "broken",
        used_by=("test_selecting_a_broken_plugin_is_a_usage_error",))
    fit("select-twin", "-p", "twin",
        used_by=("test_selecting_a_name_claimed_twice_names_both_distributions",))
    fit("select-typo", "-p", "typo-hook", used_by=("test_a_misspelt_hook_is_refused_at_load",))
    fit("unknown", "-p", "step-countr",
        used_by=("test_unknown_callback_suggests_an_installed_third_party_one",))
    yield pool
    pool.close()


def table_rows(text: str) -> dict[tuple[str, str, str, str], str]:
    """The rows of the ``ptrain plugins`` table: (kind, name, distribution, version) -> status."""
    lines = text.strip().splitlines()
    header = lines[0].split()
    assert header[:4] == ["KIND", "NAME", "DISTRIBUTION", "VERSION"], lines[0]
    rows = {}
    for line in lines[1:]:
        parts = line.split(None, 4)
        assert len(parts) >= 4, line
        rows[tuple(parts[:4])] = parts[4] if len(parts) > 4 else ""
    return rows


def expected_rows(site) -> set[tuple[str, str, str, str]]:
    return installed_entry_points(site)


# ---------------------------------------------------------------------------------------------
# ptrain plugins


def test_listing_shows_every_installed_plugin(runs, site):
    listing = runs["plugins"]
    assert_ok(listing)
    rows = table_rows(listing.stdout)
    assert set(rows) == expected_rows(site)
    core_version = metadata.version("ptrain-core")
    for kind, name in BUILTINS:
        assert (kind, name, "ptrain-core", core_version) in rows
    assert THIRD_PARTY <= set(rows)


def test_listing_json_is_the_same_data(runs, site):
    listing, listing_json = runs["plugins"], runs["plugins-json"]
    assert_ok(listing_json)
    data = json.loads(listing_json.stdout)
    assert isinstance(data, list)
    as_tuples = {(r["kind"], r["name"], r["distribution"], r["version"]) for r in data}
    assert len(as_tuples) == len(data)
    assert as_tuples == set(table_rows(listing.stdout)) == expected_rows(site)
    step_counter = next(r for r in data if r["name"] == "step-counter")
    assert step_counter["target"] == "ptrain_step_counter:StepCounter"


def test_listing_marks_a_name_claimed_by_two_distributions(runs):
    listing, listing_json = runs["plugins"], runs["plugins-json"]
    rows = table_rows(listing.stdout)
    status_a = rows[("callback", "twin", "ptrain-twin-a", "1.0.0")]
    status_b = rows[("callback", "twin", "ptrain-twin-b", "2.5.0")]
    assert "conflict" in status_a and "ptrain-twin-b" in status_a
    assert "conflict" in status_b and "ptrain-twin-a" in status_b
    # Only the clashing rows are marked.
    marked = {key for key, status in rows.items() if status}
    assert marked == {("callback", "twin", "ptrain-twin-a", "1.0.0"),
                      ("callback", "twin", "ptrain-twin-b", "2.5.0")}
    twins = [r for r in json.loads(listing_json.stdout) if r["name"] == "twin"]
    assert len(twins) == 2 and all("conflict" in r.get("status", "") for r in twins)


def test_listing_survives_a_broken_plugin(runs):
    listing = runs["plugins"]
    rows = table_rows(listing.stdout)
    assert ("callback", "broken", "ptrain-broken-plugin", "0.0.7") in rows
    assert "libfrobnicate" not in listing.stdout + listing.stderr  # it was not imported


def test_check_reports_ok_and_broken(runs, site):
    check_listing = runs["check"]
    assert_ok(check_listing)
    rows = table_rows(check_listing.stdout)
    core_version = metadata.version("ptrain-core")
    assert rows[("accelerator", "cpu", "ptrain-core", core_version)] == "ok"
    for kind, name in BUILTINS:
        assert rows[(kind, name, "ptrain-core", core_version)] == "ok", (kind, name)
    assert rows[("callback", "step-counter", "ptrain-step-counter", "1.2.3")] == "ok"
    broken = rows[("callback", "broken", "ptrain-broken-plugin", "0.0.7")]
    assert broken.startswith("broken"), broken
    assert "ptrain-broken-plugin" in broken
    assert "ImportError" in broken and "libfrobnicate.so.3" in broken
    assert f"(at {site / 'ptrain_broken_plugin.py'}:3)" in broken  # the raise, in its file
    assert "Traceback" not in check_listing.stdout


def test_version_names_every_plugin_distribution(runs):
    result = runs["version"]
    assert_ok(result)
    lines = set(result.stdout.splitlines())
    assert f"ptrain-core {metadata.version('ptrain-core')}" in lines
    for _, _, dist, version in THIRD_PARTY:
        assert f"{dist} {version}" in lines


def test_listing_and_help_import_neither_torch_nor_plugins(site):
    """``ptrain plugins`` (also --json), ``ptrain --version`` and ``ptrain --help`` read metadata
    only: after them, no torch, no plugin module (built-in or installed) is in sys.modules."""
    script = textwrap.dedent(f"""
        import contextlib, io, json, sys
        from ptrain.cli import main
        codes = []
        for argv in (["plugins"], ["plugins", "--json"], ["--version"], ["--help"], []):
            with contextlib.redirect_stdout(io.StringIO()) as out:
                try:
                    code = main(argv)
                except SystemExit as exc:
                    code = exc.code
            codes.append([argv, code, len(out.getvalue())])
        plugin_modules = {PLUGIN_MODULES!r}
        imported = sorted(m for m in sys.modules
                          if m == "torch" or m.startswith("torch.")
                          or m.startswith("ptrain.builtins")
                          or m.split(".")[0] in plugin_modules)
        print(json.dumps({{"codes": codes, "imported": imported}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **pythonpath_env(site)})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for argv, code, printed in report["codes"]:
        assert code in (0, None), (argv, code)
        assert printed > 0, argv
    assert report["imported"] == [], report["imported"]


# ---------------------------------------------------------------------------------------------
# A third-party plugin in a run


def test_fit_help_all_shows_every_plugin_option_group(runs):
    selected = runs["fit-help-selected"]
    assert_ok(selected)
    assert "--step-counter-label" in selected.stdout
    fit_help = runs["fit-help-all"]
    assert_ok(fit_help)
    out = fit_help.stdout
    assert "step-counter (callback, ptrain-step-counter)" in out
    group = out[out.index("step-counter (callback, ptrain-step-counter)"):]
    assert "--step-counter-label" in group and "--step-counter-start" in group
    assert "-p step-counter" in group
    # The built-ins' groups are there too, and the broken plugin is named, not fatal.
    assert "checkpoint (callback, ptrain-core)" in out
    assert "--checkpoint-every-n-epochs" in out
    failed = out[out.index("failed to import"):]
    assert "ptrain-broken-plugin" in failed and "libfrobnicate.so.3" in failed


def test_third_party_callback_runs_with_its_options(runs):
    """Selected with -p and given options by flag; the broken plugin installed beside it does not
    matter because this run does not select it."""
    assert_ok(runs["step-counter"])
    record = json.loads((runs.dirs["step-counter"] / "version_0" / "step_counter.json").read_text())
    # TinyRegressor: 64 samples in batches of 8 -> 8 training batches in one epoch.
    assert record == {"label": "hello", "start": 5, "batches": 5 + 8, "setup_stages": ["fit"],
                      "teardown_stage": "fit", "global_step": 8}


def test_blocking_keeps_plugins_out_of_the_run(runs):
    """``-p no:NAME`` wins over ``-p NAME``: the step counter does not run and the broken plugin
    is never imported."""
    assert_ok(runs["blocked"])
    run_folder = runs.dirs["blocked"] / "version_0"
    assert (run_folder / "checkpoints" / "last.ckpt").is_file()
    assert not (run_folder / "step_counter.json").exists()


def test_selecting_a_broken_plugin_is_a_usage_error(runs, site):
    assert_usage_error(runs["select-broken"], "'broken'", "ptrain-broken-plugin", "ImportError",
                       f"libfrobnicate.so.3: cannot open shared object file (at "
                       f"{site / 'ptrain_broken_plugin.py'}:3)")
    assert not runs.dirs["select-broken"].exists()


def test_selecting_a_name_claimed_twice_names_both_distributions(runs):
    assert_usage_error(runs["select-twin"], "'twin'", "ptrain-twin-a", "ptrain-twin-b")
    assert not runs.dirs["select-twin"].exists()


def test_a_misspelt_hook_is_refused_at_load(runs):
    assert_usage_error(runs["select-typo"], "'typo-hook'", "on_epoch_ned", "'on_epoch_end'")
    assert not runs.dirs["select-typo"].exists()


def test_unknown_callback_suggests_an_installed_third_party_one(runs):
    message = assert_usage_error(runs["unknown"], "step-countr", "Did you mean 'step-counter'?")
    for name in ("step-counter", "broken", "twin", "typo-hook", "checkpoint"):
        assert name in message


def test_an_installed_plugins_own_file_is_where_its_import_raised():
    """A plugin installed among the packages (site-packages): the frames of its own files count
    as the code imported, so the message names its line, not nothing or a library's module."""
    import json.decoder
    import traceback

    from ptrain.loading import raised_at

    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads("{")
    own = os.path.realpath(json.decoder.__file__)  # in Python's library, as a plugin would be
    line = [f.lineno for f in traceback.extract_tb(caught.value.__traceback__)
            if os.path.realpath(f.filename) == own][-1]
    assert raised_at(caught.value, frozenset({own})) == f" (at {json.decoder.__file__}:{line})"
    assert raised_at(caught.value) == ""  # only the library's frames
