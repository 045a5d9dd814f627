"""The installed plugins' entry points, read from disk once per installation rather than once per
process.

``importlib.metadata.entry_points()`` opens the ``entry_points.txt`` of every installed
distribution (about 12 ms for 180 distributions here), and most of them provide no plugin. What it
found for ptrain's groups is kept in a small file under the user's cache folder
(``$XDG_CACHE_HOME/ptrain``, else ``~/.cache/ptrain``), valid while the installation is as it
was: the file is keyed by a fingerprint of the folders on ``sys.path`` (see
:func:`fingerprint`). Installing, removing, upgrading or reinstalling a distribution (editable
ones included) changes the fingerprint, and the next process scans again. A cache that can't be
read or written is only slower: the scan's result is used as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from importlib import metadata
from pathlib import Path

#: bump when what a cache file holds changes
_FORMAT = 1
#: cache files kept, the most recently written
_KEPT = 32
_DIST_INFO = re.compile(r"(?P<name>[^-]+)-(?P<version>[^-]+)\.dist-info")

#: (group, entry-point name, its value, distribution name, distribution version)
Row = tuple[str, str, str, str, str]


def entry_points(groups: list[str]) -> list[Row]:
    """Every installed entry point of ``groups``, with the distribution that declares it."""
    key = fingerprint(groups)
    cache = cache_file(key) if key is not None else None
    if cache is not None:
        try:
            return [tuple(row) for row in json.loads(cache.read_text())["rows"]]
        except (OSError, ValueError, KeyError, TypeError):
            pass  # absent or unreadable: scan
    rows = scan(groups)
    if cache is not None:
        _write(cache, rows)
    return rows


def scan(groups: list[str]) -> list[Row]:
    """What :func:`entry_points` returns, read from every distribution's metadata."""
    installed = metadata.entry_points()
    rows = []
    for group in groups:
        for ep in installed.select(group=group):
            rows.append((group, ep.name, ep.value, *distribution_of(ep.dist)))
    return rows


def distribution_of(dist: metadata.Distribution | None) -> tuple[str, str]:
    """The name and version of ``dist``. An installed wheel's ``NAME-VERSION.dist-info`` folder
    says both, with the name's ``-`` written ``_``; else its METADATA file says."""
    if dist is None:
        return "(unknown distribution)", "?"
    folder = getattr(dist, "_path", None)  # a PathDistribution's: where its metadata lies
    match = _DIST_INFO.fullmatch(getattr(folder, "name", ""))
    if match:
        return match["name"].replace("_", "-"), match["version"]
    return dist.metadata["Name"], dist.version


def fingerprint(groups: list[str]) -> str | None:
    """A digest of the installation's state as far as entry points go (``None`` when
    ``sys.path`` holds something other than folders, such as a zip file, whose contents this
    does not follow): for every folder on ``sys.path``, its modification time and the names in
    it, and of each ``.egg-info`` folder in it the modification time and size of its
    ``entry_points.txt``.

    Installers (pip, uv, conda) write a ``.dist-info`` folder whole and replace it whole on an
    upgrade or reinstall, editable installs included, which changes the folder around it: its
    files need not be read (a stat of each costs more than the cache saves). setuptools rewrites
    an ``.egg-info`` folder's files in place, so those are stated."""
    digest = hashlib.sha256(repr((_FORMAT, sys.version, groups)).encode())
    for entry in sys.path:
        folder = entry or os.getcwd()
        try:
            changed = os.stat(folder).st_mtime_ns
            names = sorted(os.listdir(folder))
        except NotADirectoryError:
            return None
        except OSError:  # a sys.path entry that does not exist holds nothing
            continue
        digest.update(f"{folder}\0{changed}\0".encode("utf-8", "surrogateescape"))
        digest.update("\0".join(names).encode("utf-8", "surrogateescape"))
        for name in names:
            if not name.endswith(".egg-info"):
                continue
            try:
                stat = os.stat(os.path.join(folder, name, "entry_points.txt"))
                digest.update(f"{name}\0{stat.st_mtime_ns}\0{stat.st_size}\0".encode(
                    "utf-8", "surrogateescape"))
            except OSError:
                digest.update(f"{name}\0-\0".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def cache_file(key: str) -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "ptrain" / f"entry-points-{key[:32]}.json"


def _write(path: Path, rows: list[Row]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"format": _FORMAT, "rows": rows}))
        os.replace(tmp, path)  # whole or not at all, whatever another process does at once
        # one file per installation state seen (several environments may share the folder):
        # the most recent ones stay
        files = sorted(path.parent.glob("entry-points-*.json"), key=lambda f: f.stat().st_mtime)
        for old in files[:-_KEPT]:
            old.unlink(missing_ok=True)
    except OSError:
        pass  # a cache folder that can't be written: each process scans
