"""A checkpoint that holds pickled code is refused as unsafe, by name, without running it, and
the message's command shows what it would have run."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest
import torch

from ptrain.checkpoint_io import safe_load
from ptrain.errors import CheckpointError


class WritesAFile:
    """Unpickled, it would call os.system and create ``path``."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def torch_saved(path, payload):
    torch.save({"format": "ptrain", "model": {}, "x": payload}, path)


def pickled(protocol):
    def write(path, payload):
        with open(path, "wb") as f:
            pickle.dump({"x": payload}, f, protocol=protocol)
    return write


@pytest.mark.parametrize("write", [torch_saved, pickled(0), pickled(2), pickled(4),
                                   pickled(pickle.HIGHEST_PROTOCOL)],
                         ids=["torch.save", "pickle-0", "pickle-2", "pickle-4", "pickle-highest"])
def test_pickled_code_is_refused_as_unsafe_and_not_run(tmp_path, write):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.ckpt"
    write(path, WritesAFile(marker))
    with pytest.raises(CheckpointError, match="refused as unsafe") as info:
        safe_load(path)
    message = str(info.value)
    assert "corrupt" not in message and str(path) in message
    assert not marker.exists()  # nothing in the file ran
    # the command the message gives shows the call it would have made, and runs nothing either
    command = message.split("without running it: ", 1)[1].replace("python ", f"{sys.executable} ",
                                                                  1)
    shown = subprocess.run(command, shell=True, capture_output=True, text=True)
    assert "system" in shown.stdout, (command, shown.stdout, shown.stderr)
    assert not marker.exists()


def test_a_pickled_callable_is_named(tmp_path):
    path = tmp_path / "print.ckpt"
    torch.save({"format": "ptrain", "hook": print}, path)
    with pytest.raises(CheckpointError, match=r"import and call (builtins\.)?print\b"):
        safe_load(path)


def test_a_read_leaves_the_programs_own_safe_globals_allowed(tmp_path):
    # ptrain allows NumPy's scalar globals around each read; one the program had allowed
    # itself (for its own torch.load of data holding NumPy dtypes, as pytorch-forecasting's
    # checkpoints do) was no longer allowed after any checkpoint read
    import numpy as np

    from ptrain.checkpoint_io import load_weights_only

    path = tmp_path / "numbers.pt"
    torch.save({"x": np.float64(1.5)}, path)
    before = torch.serialization.get_safe_globals()
    try:
        torch.serialization.add_safe_globals([np.dtype])
        assert load_weights_only(path) == {"x": 1.5}
        assert set(torch.serialization.get_safe_globals()) == {*before, np.dtype}
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)
