"""Fetching a demo's data file once, and the error for data that is neither on disk nor
reachable."""

from __future__ import annotations

import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from ptrain.checkpoint_io import new_file_mode
from ptrain.errors import ModelError


class DataUnavailableError(ModelError, OSError):
    """A demo's data file is not on disk and could not be downloaded. The message names the
    file, the address it comes from and where to put it by hand. Also an :class:`OSError`, as a
    failed download is elsewhere."""


def fetch(url: str, destination: Path, timeout: float = 60.0) -> None:
    """Download ``url`` to ``destination`` (its folder made if missing). The bytes go to a
    temporary file beside it first and are renamed when complete, so an interrupted download
    never leaves a partial file that a later run would take for the data. An unreachable
    address is a :class:`DataUnavailableError`."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{destination.name}.", dir=destination.parent)
    os.fchmod(handle, new_file_mode())  # mkstemp's 0600 would outlive the rename
    try:
        with os.fdopen(handle, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as got:
            while chunk := got.read(1 << 20):
                out.write(chunk)
        os.replace(partial, destination)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise DataUnavailableError(
            f"could not download {url} to {destination} ({reason}). Without network access, "
            f"fetch that file on another machine and put it at {destination.resolve()}; it is "
            f"read from there and never downloaded again.") from exc
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
