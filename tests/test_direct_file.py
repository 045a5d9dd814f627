"""DirectFile, the file checkpoints are written into past the page cache: the bytes on the disk
are the bytes written, whatever the pieces' sizes and whether the disk takes direct writes or
refuses them, its CRC-32 is the file's, a write that failed writes nothing more, and a process
forked while it is written does not keep it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings
import zlib
from pathlib import Path

import pytest
import torch

from ptrain import direct_file, private_descriptors
from ptrain.direct_file import CHUNK, DirectFile
from tests.test_replaced_files import closed

SIZES = [0, 1, 4095, 4096, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 4097]


def write_in_pieces(path: Path, data: bytes, piece: int) -> DirectFile:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with DirectFile(fd, checksum=True) as f:
        for start in range(0, len(data), piece):
            assert f.write(memoryview(data)[start:start + piece]) == len(data[start:start + piece])
        assert f.tell() == len(data)
    return f


def assert_disk_threads_end() -> None:
    """The files' threads have been told to end (they may be in their last lines): they do."""
    for thread in threading.enumerate():
        if thread.name == "ptrain-direct-write":
            thread.join(60)  # a bound for a broken build, not a wait for timing
            assert not thread.is_alive()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("piece", [1000, CHUNK + 3])
def test_the_file_holds_the_bytes_written_and_their_crc(tmp_path, size, piece):
    data = os.urandom(size)
    f = write_in_pieces(tmp_path / "f", data, piece)
    assert (tmp_path / "f").read_bytes() == data
    assert f.crc32 == zlib.crc32(data)
    assert f.closed


@pytest.mark.parametrize("piece", [1 << 20, 3 * CHUNK + 1])
def test_more_chunks_than_the_disks_thread_holds_come_out_in_order(tmp_path, piece):
    """Chunks after the first go to the disk on the file's thread, at most QUEUED at once:
    a file of more makes it hand buffers back and take them again."""
    data = os.urandom((direct_file.QUEUED + 3) * CHUNK + 5)
    f = write_in_pieces(tmp_path / "f", data, piece)
    assert (tmp_path / "f").read_bytes() == data and f.crc32 == zlib.crc32(data)
    assert_disk_threads_end()


def test_a_disk_that_takes_direct_writes_gets_them(tmp_path):
    """This machine's disks take O_DIRECT (Linux, ext4): elsewhere the file writes normally,
    which the other tests cover as well."""
    if not direct_file.O_DIRECT:
        pytest.skip("this system has no O_DIRECT (not Linux)")
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    with DirectFile(fd) as f:
        if not f.direct:
            pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT")
        import fcntl

        assert fcntl.fcntl(fd, fcntl.F_GETFL) & direct_file.O_DIRECT


def test_a_direct_write_refused_as_misaligned_falls_back_to_normal_writes(tmp_path, monkeypatch):
    """A chunk no disk's block size divides: the first direct write is refused (EINVAL) and
    that chunk and every later byte are written normally."""
    if not direct_file.O_DIRECT:
        pytest.skip("this system has no O_DIRECT (not Linux)")
    monkeypatch.setattr(direct_file, "CHUNK", 4096 + 100)
    data = os.urandom(3 * (4096 + 100) + 17)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    with DirectFile(fd, checksum=True) as f:
        if not f.direct:
            pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT")
        f.write(data[:5000])
        assert not f.direct
        f.write(data[5000:])
    assert (tmp_path / "f").read_bytes() == data
    assert f.crc32 == zlib.crc32(data)



def test_no_memory_for_the_aligned_buffer_means_normal_writes(tmp_path, monkeypatch):
    """The 8 MiB buffer refused (ENOMEM, a host short of memory): the file is written
    normally, as the contract promises, instead of the checkpoint failing."""
    import errno
    import fcntl

    def refused(*args, **kwargs):
        raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))

    monkeypatch.setattr(direct_file.mmap, "mmap", refused)
    data = os.urandom(CHUNK + 5)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    with DirectFile(fd, checksum=True) as f:
        assert not f.direct and not fcntl.fcntl(fd, fcntl.F_GETFL) & direct_file.O_DIRECT
        f.write(data)
    assert (tmp_path / "f").read_bytes() == data and f.crc32 == zlib.crc32(data)


@pytest.mark.parametrize("size", [1, 3 * CHUNK])
def test_a_file_dropped_unclosed_gives_its_descriptor_and_thread_back(tmp_path, size):
    import gc

    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    f = DirectFile(fd)
    f.write(bytes(size))  # 3 chunks: the disk's thread has started
    del f
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)
    assert_disk_threads_end()

def test_a_failed_write_closes_the_file_without_writing_the_rest(tmp_path):
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    with pytest.raises(ValueError, match="the caller's"):
        with DirectFile(fd) as f:
            direct = f.direct
            f.write(b"x" * 10)  # held in the buffer where writes go directly
            raise ValueError("the caller's")
    assert f.closed
    with pytest.raises(OSError):
        os.fstat(fd)
    assert (tmp_path / "f").stat().st_size == (0 if direct else 10)


def test_a_write_refused_on_the_disks_thread_is_raised_without_holding_it(tmp_path,
                                                                          monkeypatch):
    """A chunk the system refuses on the file's thread (here: ENOSPC, from a stand-in for
    ``os.write`` there) is raised by the file's caller; the error holds no frame of that
    thread, whose buffers (up to 64 MiB) would otherwise stay alive with it."""
    import errno
    import types

    if not direct_file.O_DIRECT:
        pytest.skip("this system has no O_DIRECT (not Linux)")

    class FullDiskOs(types.ModuleType):
        def __getattr__(self, name):
            return getattr(os, name)

    def write(fd, data):
        if threading.current_thread().name == "ptrain-direct-write":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)

    full = FullDiskOs("os")
    full.write = write
    monkeypatch.setattr(direct_file, "os", full)
    monkeypatch.setattr(direct_file, "CHUNK", 4096)
    f = DirectFile(os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT))
    if not f.direct:
        pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT")
    with pytest.raises(OSError) as info:
        with f:
            f.write(bytes(5 * 4096))  # the first chunk here, the rest on the file's thread
    assert info.value.errno == errno.ENOSPC and f.closed
    frames = []
    tb = info.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert "_run" not in frames, frames


def test_torch_save_into_it_loads_back(tmp_path):
    state = {"w": torch.randn(1000, 999), "step": 7}
    with DirectFile(os.open(tmp_path / "f.pt", os.O_WRONLY | os.O_CREAT)) as f:
        torch.save(state, f)
    loaded = torch.load(tmp_path / "f.pt")
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 7


REFUSED = """
import errno, os, resource, sys
from ptrain.direct_file import CHUNK, DirectFile
resource.setrlimit(resource.RLIMIT_FSIZE, (CHUNK + 4096, CHUNK + 4096))
f = DirectFile(os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT))
try:
    with f:
        f.write(bytes(3 * CHUNK))
except OSError as exc:
    print(errno.errorcode[exc.errno], f.direct, f.closed)
"""


def test_a_write_past_the_file_size_limit_raises_the_systems_error(tmp_path):
    """Python ignores SIGXFSZ, so the write that crosses the limit fails with EFBIG, as a
    full disk fails with ENOSPC (tests/test_disk_full.py: the checkpoint's message)."""
    result = subprocess.run([sys.executable, "-c", REFUSED, str(tmp_path / "f")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "EFBIG" and result.stdout.split()[2] == "True"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this system")
def test_a_process_forked_while_a_checkpoint_is_written_does_not_keep_its_file(tmp_path):
    """A DataLoader worker forked while a background save writes (a checkpoint's temporary
    file, opened through private_descriptors) closes its copy of the descriptor at once: a
    persistent worker would otherwise keep the file allocated after a later save replaced it.
    A descriptor opened otherwise is inherited as usual."""
    fd = private_descriptors.opened(lambda: os.open(tmp_path / "ckpt.tmp",
                                                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC))
    other = os.open(tmp_path / "other", os.O_WRONLY | os.O_CREAT)
    with DirectFile(fd) as f:
        f.write(os.urandom(2 * CHUNK + 1))  # its thread writing the second chunk, maybe
        with warnings.catch_warnings():  # the child only looks at its descriptors and exits
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os._exit(0 if closed(fd) and not closed(other) else 1)
        _, status = os.waitpid(pid, 0)
    os.close(other)
    assert os.waitstatus_to_exitcode(status) == 0
    assert closed(fd)  # and here once the file was closed
    assert (tmp_path / "ckpt.tmp").stat().st_size == 2 * CHUNK + 1

