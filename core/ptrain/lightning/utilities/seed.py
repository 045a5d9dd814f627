"""Seeding: ``seed_everything`` with Lightning's rule for a missing seed, and ``isolate_rng``,
which puts every random generator back as it was when its block ends."""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Iterator

from ptrain import checkpoint_io, seeding

__all__ = ["isolate_rng", "seed_everything"]

#: Where Lightning programs (and the processes they start) find the seed of the last seeding.
LIGHTNING_SEED_VARIABLE = "PL_GLOBAL_SEED"


def seed_everything(seed: int | None = None, workers: bool = False, verbose: bool = True) -> int:
    """Lightning's ``seed_everything``: seed Python's, NumPy's and torch's generators and return
    the seed (:func:`ptrain.seed_everything` does the seeding).

    ``seed=None`` takes the seed of ``PL_GLOBAL_SEED`` (an earlier seeding's, or the process
    that started this one's), else ptrain's ``PTRAIN_GLOBAL_SEED``, else 0, with a warning
    (``verbose``), as Lightning does; ptrain's own ``seed_everything(None)`` draws a random
    seed instead. With ``verbose`` it logs ``Seed set to N``, as Lightning does. The seed is recorded in both variables for the processes started later.
    """
    if seed is None:
        seed = seeding.last_seed(LIGHTNING_SEED_VARIABLE)
    if seed is None:
        seed = seeding.last_seed()
    if seed is None:
        seed = 0
        if verbose:
            warnings.warn("No seed found, seed set to 0", stacklevel=2)
    seed = seeding.seed_everything(seed, workers=workers)
    os.environ[LIGHTNING_SEED_VARIABLE] = str(seed)
    if verbose:
        from ptrain.lightning.utilities.rank_zero import rank_zero_info

        rank_zero_info(f"Seed set to {seed}")
    return seed


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
