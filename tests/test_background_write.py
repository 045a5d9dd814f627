"""The host memory of background checkpoint writes (ptrain.background_write): a finished
write's copies are the next write's buffers, each copy holds its own step's values, and no copy
shares memory with the tensor it copies."""

from __future__ import annotations

import torch

from ptrain.background_write import BackgroundWrite, HostBuffers, host_copy


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
