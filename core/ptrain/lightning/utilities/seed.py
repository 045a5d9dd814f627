"""Seeding: ``seed_everything`` (ptrain's), and ``isolate_rng``, which puts every random
generator back as it was when its block ends."""

from __future__ import annotations

import contextlib
from typing import Iterator

from ptrain import checkpoint_io
from ptrain.trainer import seed_everything

__all__ = ["isolate_rng", "seed_everything"]


@contextlib.contextmanager
def isolate_rng(include_cuda: bool = True) -> Iterator[None]:
    """Within the block, draw as you like; after it, Python's, NumPy's and torch's generators
    (CUDA's too unless ``include_cuda=False``, for a forked process where CUDA may not start)
    are as they were before it."""
    states = checkpoint_io.capture_rng_states()
    if not include_cuda:
        states.pop("cuda", None)
    try:
        yield
    finally:
        checkpoint_io.restore_rng_states(states)
