"""A save frees the blocks of the checkpoint it replaces on a thread of its own: the files are
held open while the save replaces or removes them, and closed after. What a reader sees is the
same as before: the new checkpoint at its path, nothing else left in the folder."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch

from ptrain import replaced_files
from ptrain.checkpoint_io import atomic_save
from ptrain.direct_file import on_local_disk

LARGE = replaced_files.LARGE


def on_a_local_disk(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        return on_local_disk(fd)
    finally:
        os.close(fd)


def closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        return exc.errno == errno.EBADF
    return False


def test_a_held_file_keeps_its_bytes_until_released(tmp_path):
    if not on_a_local_disk(tmp_path):
        pytest.skip(f"{tmp_path} is not on a local disk's filesystem: nothing is held there")
    old, new = os.urandom(LARGE), os.urandom(LARGE)
    (tmp_path / "ckpt").write_bytes(old)
    (tmp_path / "new").write_bytes(new)
    held = replaced_files.hold(tmp_path / "ckpt")
    assert len(held) == 1
    os.replace(tmp_path / "new", tmp_path / "ckpt")
    assert (tmp_path / "ckpt").read_bytes() == new
    assert os.pread(held[0], LARGE, 0) == old  # replaced, not yet freed
    replaced_files.release(held)
    replaced_files.wait()
    assert closed(held[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_folders_large_files_are_held_and_small_ones_left(tmp_path):
    if not on_a_local_disk(tmp_path):
        pytest.skip(f"{tmp_path} is not on a local disk's filesystem: nothing is held there")
    folder = tmp_path / "sharded.ckpt"
    (folder / "inner").mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(os.urandom(LARGE))
    (folder / "inner" / "__1_0.distcp").write_bytes(os.urandom(LARGE + 1))
    (folder / "meta.pt").write_bytes(b"small")
    held = replaced_files.hold(folder)
    sizes = sorted(os.fstat(fd).st_size for fd in held)
    replaced_files.release(held)
    replaced_files.wait()
    assert sizes == [LARGE, LARGE + 1]
    assert all(closed(fd) for fd in held)


def test_a_link_in_a_folder_is_not_followed(tmp_path):
    if not on_a_local_disk(tmp_path):
        pytest.skip(f"{tmp_path} is not on a local disk's filesystem: nothing is held there")
    outside = tmp_path / "kept.bin"
    outside.write_bytes(os.urandom(LARGE))
    folder = tmp_path / "sharded.ckpt"
    folder.mkdir()
    (folder / "__0_0.distcp").symlink_to(outside)
    assert replaced_files.hold(folder) == []


def test_off_linux_nothing_is_opened(tmp_path, monkeypatch):
    """macOS's statfs has another layout and Windows has none: neither is asked."""
    (tmp_path / "ckpt").write_bytes(os.urandom(LARGE))
    for platform in ("darwin", "win32"):
        monkeypatch.setattr(sys, "platform", platform)
        assert replaced_files.hold(tmp_path / "ckpt") == []
        assert replaced_files.hold(tmp_path) == []


def test_nothing_is_held_off_a_local_disk_or_where_nothing_is(tmp_path):
    assert replaced_files.hold(tmp_path / "missing") == []
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm (tmpfs) here to try a filesystem that is no local disk's")
    path = shm / f"ptrain-replaced-{os.getpid()}"
    path.write_bytes(os.urandom(LARGE))
    try:
        assert replaced_files.hold(path) == []
    finally:
        path.unlink()


def test_a_save_over_a_checkpoint_leaves_the_new_one_alone_in_the_folder(tmp_path):
    path = tmp_path / "last.ckpt"
    for value in (1.0, 2.0, 3.0):
        atomic_save({"w": torch.full((LARGE // 4,), value)}, path)
    replaced_files.wait()
    assert torch.load(path, weights_only=True)["w"][0] == 3.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    fds = Path("/proc/self/fd")
    if fds.is_dir():  # Linux: no descriptor is left open on a file of the folder
        targets = []
        for fd in fds.iterdir():
            with contextlib.suppress(OSError):  # the listing's own descriptor is gone
                targets.append(os.readlink(fd))
        assert not [t for t in targets if t.startswith(str(tmp_path))]


def test_remove_takes_a_folder_a_file_or_a_link_and_leaves_what_a_link_points_to(tmp_path):
    folder = tmp_path / "epoch=0-step=4.ckpt"
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(os.urandom(LARGE))
    single = tmp_path / "epoch=1-step=8.ckpt"
    single.write_bytes(os.urandom(LARGE))
    link = tmp_path / "last.ckpt"
    link.symlink_to(single.name)
    assert replaced_files.hold(link) == []  # a link's target is not the link's to free
    replaced_files.remove(link)
    assert single.exists() and not link.is_symlink()
    for path in (folder, single, tmp_path / "missing.ckpt"):
        replaced_files.remove(path)
    replaced_files.wait()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this system")
def test_a_process_forked_while_files_are_held_does_not_keep_them(tmp_path):
    """A DataLoader worker forked in the moment a replaced file is held must not keep it
    allocated for its whole life."""
    if not on_a_local_disk(tmp_path):
        pytest.skip(f"{tmp_path} is not on a local disk's filesystem: nothing is held there")
    (tmp_path / "ckpt").write_bytes(os.urandom(LARGE))
    held = replaced_files.hold(tmp_path / "ckpt")
    assert held
    with warnings.catch_warnings():  # the child only looks at its descriptors and exits
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        os._exit(0 if all(closed(fd) for fd in held) else 1)
    _, status = os.waitpid(pid, 0)
    replaced_files.release(held)
    replaced_files.wait()
    assert os.waitstatus_to_exitcode(status) == 0
