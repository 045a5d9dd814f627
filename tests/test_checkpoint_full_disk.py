"""A disk that fills in the middle of a checkpoint point, under
``--checkpoint-on-write-error warn``: the top-k record names only files that are there at every
checkpoint point (``--ckpt-path best`` finds its file), and once there is room again the folder
holds the record's files and ``last.ckpt``, nothing else: a file pushed out of the top-k is
deleted once what replaces it and a record without it are written, whichever write was refused.

The runs are tests/_checkpoint_full_disk_script.py's, in their own processes (a file-size limit
on the process, the refusal a full disk gives: EFBIG)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = "tests._checkpoint_full_disk_script"


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("limit", [0, 2048], ids=["record-and-last-refused", "last-refused"])
def test_after_a_refused_write_the_record_and_the_files_agree(tmp_path, limit, asynchronous):
    proc = subprocess.run([sys.executable, "-m", SCRIPT, str(tmp_path), str(limit),
                           *(["--async"] if asynchronous else [])],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "File too large (EFBIG)" in output and "Training goes on" in output, output
    checks = json.loads((tmp_path / "checks.json").read_text())
    assert checks and all(not check["missing"] for check in checks), checks
    folder = tmp_path / "version_0" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == [
        "best_k_models.json", "epoch=3-val_metric=1.0.ckpt", "last.ckpt"]
    record = json.loads((folder / "best_k_models.json").read_text())
    assert record["best_k_models"] == {"epoch=3-val_metric=1.0.ckpt": 1.0}
