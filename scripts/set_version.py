"""Set the release version of every first-party distribution.

    python scripts/set_version.py 0.2.0     # write it everywhere
    python scripts/set_version.py --check   # exit 1 naming each place that disagrees

The version is written once, in ``core/ptrain/_version.py`` (the core's ``pyproject.toml`` reads
it from there); each plugin's ``pyproject.toml`` carries a copy, and every requirement of one
first-party distribution on another is the compatible range of that version
(``ptrain-core>=0.2,<0.3`` below 1.0, ``>=1.2,<2`` from 1.0 on). This script rewrites all of
them; ``tests/test_distributions.py`` runs the check.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "core"))
from ptrain._version import compatible_range  # noqa: E402 - the core's own, from its source
VERSION_FILE = REPO / "core" / "ptrain" / "_version.py"
_VERSION = re.compile(r'^__version__ = "([^"]+)"$', re.M)
_PROJECT_VERSION = re.compile(r'^version = "([^"]+)"$', re.M)
#: a quoted requirement (a name, and perhaps a range)
_REQUIREMENT = re.compile(r'"(ptrain-[a-z0-9-]+)(?:>=[^"<]*,<[^"]*)?"')
_NAME = re.compile(r'^name = "([^"]+)"$', re.M)


def plugin_projects() -> list[Path]:
    """The ``pyproject.toml`` of every first-party plugin distribution (the examples of
    third-party plugins under ``examples/plugins`` included: they follow the same ranges)."""
    return sorted(REPO.glob("plugins/*/*/pyproject.toml")) + sorted(
        REPO.glob("examples/plugins/*/pyproject.toml"))


def current_version() -> str:
    return _VERSION.search(VERSION_FILE.read_text()).group(1)


def _with_ranges(text: str, version: str) -> str:
    """``text`` with every requirement on a first-party distribution given the range of
    ``version`` (the ``name = "ptrain-..."`` line is not a requirement and is left alone)."""
    spec = compatible_range(version)
    names = first_party_names()

    def ranged(match: re.Match) -> str:
        name = match.group(1)
        return f'"{name}{spec}"' if name in names else match.group(0)

    return "".join(line if line.startswith("name = ") else _REQUIREMENT.sub(ranged, line)
                   for line in text.splitlines(keepends=True))


def first_party_names() -> set[str]:
    """The distribution name of the core and of every first-party plugin."""
    return {"ptrain-core"} | {_NAME.search(p.read_text()).group(1) for p in plugin_projects()}


def expected_texts(version: str) -> dict[Path, str]:
    """Every file this script writes, as it should read for ``version``."""
    texts = {VERSION_FILE: _VERSION.sub(f'__version__ = "{version}"', VERSION_FILE.read_text())}
    core = REPO / "pyproject.toml"
    texts[core] = _with_ranges(core.read_text(), version)
    for project in plugin_projects():
        text = _PROJECT_VERSION.sub(f'version = "{version}"', project.read_text())
        texts[project] = _with_ranges(text, version)
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", nargs="?", help="the new version, e.g. 0.2.0")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming each file that disagrees")
    args = parser.parse_args(argv)
    if args.check == bool(args.version):
        parser.error("give a version, or --check")
    if args.version and not re.fullmatch(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?", args.version):
        parser.error(f"{args.version!r} is not a release version such as 0.2.0 or 1.0.0rc1")
    version = args.version or current_version()
    stale = [path for path, text in expected_texts(version).items() if path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(REPO)}: not at version {version} (python "
                  f"scripts/set_version.py {version} rewrites it)")
        return 1 if stale else 0
    for path, text in expected_texts(version).items():
        path.write_text(text)
    print(f"version {version} written to {len(stale)} file(s); add a section for it to "
          f"CHANGELOG.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
