"""The host memory of background checkpoint writes (ptrain.background_write): a finished
write's copies are the next write's buffers, each copy holds its own step's values, no copy
shares memory with the tensor it copies, and the first write's buffers can be made ahead. The
copies of what only an optimizer step changes are made on the writer's thread, before the files,
and a tensor changed before its copy was made fails the save."""

from __future__ import annotations

import threading

import pytest
import torch

from ptrain import ChangedBeforeCopiedError
from ptrain.background_write import BackgroundWrite, DeferredCopies, HostBuffers, host_copy
from tests.conftest import REPO


def test_a_finished_writes_copies_are_the_next_writes_buffers():
    buffers = HostBuffers()
    weights = torch.arange(1000.0)
    state = {"w": weights, "view": weights[:10].view(2, 5), "step": 1}
    written = []

    first = BackgroundWrite(1, buffers)
    copy = host_copy(state, first.memo, buffers)
    assert copy["w"].data_ptr() != weights.data_ptr() and copy["step"] == 1
    first.add(lambda: written.append({k: v.clone() for k, v in copy.items() if k != "step"}))
    assert first.finish() is None

    weights.add_(1)  # the next step
    second = BackgroundWrite(2, buffers)
    again = host_copy(state, second.memo, buffers)
    assert again["w"].data_ptr() == copy["w"].data_ptr()  # reused, not allocated
    assert again["view"].data_ptr() == copy["view"].data_ptr()
    assert torch.equal(again["w"], weights) and torch.equal(again["view"], weights[:10].view(2, 5))
    assert torch.equal(written[0]["w"], torch.arange(1000.0))  # written before the reuse
    second.finish()


def test_a_tensor_of_another_shape_gets_new_memory_and_release_lets_go():
    buffers = HostBuffers()
    write = BackgroundWrite(1, buffers)
    copy = host_copy(torch.zeros(4), write.memo, buffers)
    write.finish()
    write = BackgroundWrite(2, buffers)
    other = host_copy(torch.ones(5), write.memo, buffers)
    assert other.data_ptr() != copy.data_ptr() and torch.equal(other, torch.ones(5))
    write.finish()
    buffers.release()
    write = BackgroundWrite(3, buffers)
    assert host_copy(torch.zeros(4), write.memo, buffers).data_ptr() != copy.data_ptr()
    write.finish()


def _free_buffers(buffers: HostBuffers) -> list[torch.Tensor]:
    buffers._wait()  # the preparing thread's buffers join the free ones
    return [buffer for free in buffers._free.values() for buffer in free]


def test_a_planned_copy_goes_into_a_buffer_made_ahead_of_the_write():
    buffers = HostBuffers()
    weights, moments = torch.arange(1000.0), torch.ones(10, 10)
    every_other = torch.ones(4, 6)[:, ::2]  # not contiguous: left to the copy
    state = {"w": weights, "m": moments, "s": every_other, "again": weights}
    with buffers.planning():
        planned = host_copy(state, {}, buffers)
    assert planned["w"] is weights and planned["s"] is every_other  # recorded, not copied
    made = {buffer.data_ptr() for buffer in _free_buffers(buffers)}
    assert len(made) == 2  # weights once, moments; nothing for the strided view

    weights.add_(1)
    write = BackgroundWrite(1, buffers)
    copy = host_copy(state, write.memo, buffers)
    assert {copy["w"].data_ptr(), copy["m"].data_ptr()} == made
    assert copy["s"].data_ptr() not in made
    assert torch.equal(copy["w"], weights) and torch.equal(copy["m"], moments)
    assert torch.equal(copy["s"], every_other)
    write.finish()


def test_a_planning_that_fails_prepares_nothing():
    buffers = HostBuffers()
    with pytest.raises(KeyError), buffers.planning():
        host_copy(torch.zeros(4), {}, buffers)
        raise KeyError("a strategy's hook failed")
    assert _free_buffers(buffers) == []
    write = BackgroundWrite(1, buffers)  # copies as before
    assert torch.equal(host_copy(torch.ones(3), write.memo, buffers), torch.ones(3))
    write.finish()


def test_a_tensor_made_of_tensors_is_copied_through_the_tensors_inside():
    """torchao's float8 weight under float8 all-gather wraps a tensor and has no memory of its
    own: the copy is the same wrapper around a copy of that tensor."""
    from torchao.float8.float8_training_tensor import LinearMMConfig
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    weight = WeightWithDynamicFloat8CastTensor(torch.arange(6.0).view(2, 3), LinearMMConfig(),
                                               torch.float8_e4m3fn)
    buffers = HostBuffers()
    write = BackgroundWrite(1, buffers)
    copy = host_copy({"w": weight, "again": weight}, write.memo, buffers)
    assert type(copy["w"]) is WeightWithDynamicFloat8CastTensor and copy["again"] is copy["w"]
    assert copy["w"]._tensor.data_ptr() != weight._tensor.data_ptr()
    weight._tensor.add_(1)  # the next step
    assert torch.equal(copy["w"]._tensor, torch.arange(6.0).view(2, 3))
    write.finish()


def test_deferred_copies_are_made_on_the_writers_thread_ahead_of_the_files_queued():
    """The weights and the optimizer's moments are deferred, the running statistics (a buffer
    the forward pass changes) copied at once; the copies are made before a file queued ahead of
    them, and once wait_for_copies returns the step may change the weights."""
    weights, moments, statistics = torch.arange(1000.0), torch.ones(10, 10), torch.zeros(5)
    state = {"w": weights, "view": weights[:10], "m": moments, "stats": statistics}
    write = BackgroundWrite(3, HostBuffers())
    gate, written, copied_on = threading.Event(), [], []
    write.begin_part()
    write.add(gate.wait)  # the writer is busy with an earlier file when the copies come
    write.begin_part()
    deferred = DeferredCopies(iter([("parameter 'w'", weights), ("'exp_avg'", moments)]))
    copy = host_copy(state, write.memo, write.buffers, deferred)
    assert deferred and not DeferredCopies(iter([]))
    assert copy["w"].data_ptr() != weights.data_ptr()
    statistics.add_(1)  # the next forward pass: the buffer was copied on this thread
    assert torch.equal(copy["stats"], torch.zeros(5))
    write.add(lambda: written.append({k: v.clone() for k, v in copy.items()}))
    write.add_copies(deferred)
    waiter = threading.Thread(target=lambda: (write.wait_for_copies(),
                                              copied_on.append(copy["m"].clone())))
    waiter.start()
    gate.set()
    waiter.join()
    weights.add_(1)  # the optimizer step, once the copies are made
    moments.mul_(2)
    assert write.finish() is None
    assert torch.equal(copied_on[0], torch.ones(10, 10))
    assert torch.equal(written[0]["w"], torch.arange(1000.0))
    assert torch.equal(written[0]["view"], torch.arange(10.0))
    assert torch.equal(written[0]["m"], torch.ones(10, 10))
    assert torch.equal(written[0]["stats"], torch.zeros(5))


def test_a_tensor_changed_before_its_deferred_copy_was_made_fails_the_save_and_is_named():
    weights = torch.zeros(8)
    buffers = HostBuffers()
    write = BackgroundWrite(7, buffers)
    write.begin_part()
    deferred = DeferredCopies(iter([("parameter 'net.0.weight'", weights)]))
    host_copy({"w": weights[2:]}, write.memo, buffers, deferred)  # a view: the same memory
    weights.add_(1)  # in place, before the writer's thread got to the copy
    write.add_copies(deferred)
    ran = []
    write.add(lambda: ran.append(True))
    write.wait_for_copies()
    assert write.done()  # a failed first part fails the rest: the step boundary may settle it
    error = write.finish()
    assert isinstance(error, ChangedBeforeCopiedError) and not ran  # no file of it written
    assert "step 7" in str(error) and "'net.0.weight'" in str(error)
    assert "on_before_optimizer_step" in str(error) and "async" in str(error)


@pytest.fixture
def one_rank_mesh(tmp_path):
    """A device mesh of this process alone (a gloo group of one)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1),
                            rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_a_sharded_parameter_changed_before_its_deferred_copy_was_made_fails_the_save(
        one_rank_mesh):
    """A DTensor's shard is copied, but an in-place change through the DTensor (fsdp's and
    zero's parameters) moves the DTensor's version counter, not the shard's."""
    from torch.distributed.tensor import Shard, distribute_tensor

    weights = torch.nn.Parameter(distribute_tensor(torch.zeros(8), one_rank_mesh, [Shard(0)]))
    write = BackgroundWrite(5, HostBuffers())
    write.begin_part()
    deferred = DeferredCopies(iter([("parameter 'w'", weights)]))
    copy = host_copy({"w": weights}, write.memo, write.buffers, deferred)
    assert deferred and type(copy["w"]) is type(weights.data)
    with torch.no_grad():
        weights.add_(1)  # through the DTensor, before the writer's thread got to the copy
    write.add_copies(deferred)
    write.wait_for_copies()
    error = write.finish()
    assert isinstance(error, ChangedBeforeCopiedError) and "'w'" in str(error)


def test_empty_tensors_are_copied_at_once_and_never_taken_for_one_another():
    """Every empty tensor has the address 0: one held by the optimizer (deferred) must not make
    another empty tensor deferred, nor lend it its name."""
    held, other = torch.empty(0), torch.empty(0, 3)
    deferred = DeferredCopies(iter([("parameter 'empty'", held)]))
    assert not deferred.defers(other) and not deferred.defers(held)
    write = BackgroundWrite(1, HostBuffers())
    copy = host_copy({"held": held, "other": other}, write.memo, write.buffers, deferred)
    assert not deferred and copy["other"].shape == (0, 3)
    assert write.finish() is None


def test_what_waited_on_written_parts_runs_in_order_then_the_failed_parts_undo_last_first():
    """Each failed part's continuation puts back what its save changed after the one before:
    the later save's first. A part after a failed one fails with its error; a part nothing
    waited on is the unheard one."""
    write = BackgroundWrite(4, HostBuffers())
    ran: list[tuple[str, BaseException | None]] = []
    refused = OSError("no space left")

    def refuse() -> None:
        raise refused

    for name, write_file in (("top-k", lambda: None), ("last", refuse), ("extra", lambda: None)):
        write.begin_part()
        write.add(write_file)
        write.then(lambda error, name=name: ran.append((name, error)))
    write.begin_part()  # a save nothing waits on
    write.add(lambda: None)
    assert write.finish() is refused
    assert ran == [("top-k", None), ("extra", refused), ("last", refused)]
    assert write.unheard_error is refused


@pytest.mark.slow
@pytest.mark.parametrize("listening", [[0], []], ids=["rank-0-listens", "none-listens"])
def test_under_two_processes_a_failed_write_is_raised_on_every_rank_or_on_none(tmp_path,
                                                                              listening):
    """Which ranks wait on a write is a rank's own choice (``if trainer.is_global_zero:
    trainer.after_checkpoint_write(...)``): its error is unheard on every rank when no rank
    waited on it, and on none when one did, so that no rank raises while another goes on to
    its next collective."""
    import json
    import subprocess
    import sys

    ranks = [subprocess.Popen([sys.executable, "-m", "tests._agreement_ranks", str(rank),
                               str(tmp_path), json.dumps(listening)], cwd=str(REPO))
             for rank in (0, 1)]
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [s["error"] for s in seen] == ["CheckpointWriteError"] * 2
    if listening:
        assert [s["heard"] for s in seen] == [["CheckpointWriteError"], []]
        assert [s["unheard"] for s in seen] == [None, None]
    else:
        assert [s["unheard"] for s in seen] == [
            "could not write checkpoint 'a.ckpt': no space left",
            "rank 0: could not write checkpoint 'a.ckpt': no space left"]
