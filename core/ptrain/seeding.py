"""Seeding every random generator, and the seed a job's processes share.

:func:`seed_everything` records its seed in the environment (:data:`SEED_VARIABLE`), so the
processes a launcher starts later inherit it; :func:`last_seed` is the one reader of it.
"""

from __future__ import annotations

import os
import random

import torch

from ptrain import script_launch
from ptrain.config import to_seed
from ptrain.errors import ConfigError

#: The seed of the last seed_everything, for the processes this one starts.
SEED_VARIABLE = "PTRAIN_GLOBAL_SEED"


def last_seed(variable: str = SEED_VARIABLE) -> int | None:
    """The seed the last ``seed_everything`` recorded in ``variable`` (by default ptrain's,
    :data:`SEED_VARIABLE`), in this process or in the one that started it; None without one.
    A value that is not an int is a :class:`~ptrain.errors.ConfigError` naming the variable."""
    value = os.environ.get(variable)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{variable}={value!r} is not a seed (an int): set it to the seed, or "
                          f"unset it") from None


def seed_everything(seed: int | None = None, workers: bool = False) -> int:
    """Seed Python's, NumPy's and torch's generators (all devices) and return the seed.

    Call it before the model is built, so that its initial weights are seeded too (or pass
    ``seed`` to the :class:`~ptrain.Trainer`, which calls this when it is made, and make the
    model after it; ``ptrain fit --seed`` does the same). ``seed=None`` takes a random seed and
    prints it, except in the processes the script launcher started, which take rank 0's (it is
    passed to them in the environment, so every rank of the job draws alike). ``workers`` is
    accepted for Lightning's signature: torch already seeds each DataLoader worker's Python,
    NumPy and torch generators from a base seed drawn from the seeded generator, so their draws
    are reproducible either way; under several processes the strategy gives each replica's
    workers seeds of their own (:func:`seed_replica_worker`), with or without it.
    """
    if seed is None and script_launch.is_started_copy():
        seed = last_seed()
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
        print(f"seed_everything: no seed given, using {seed}", flush=True)
    try:
        seed = to_seed(seed)
    except ValueError as exc:
        raise ConfigError(f"seed_everything({seed!r}): {exc}.") from None
    os.environ[SEED_VARIABLE] = str(seed)  # the ranks the script launcher starts use it too
    random.seed(seed)
    torch.manual_seed(seed)
    import numpy as np

    np.random.seed(seed % 2**32)
    return seed


def seed_replica_worker(replica: int, worker_id: int) -> None:
    """A DataLoader ``worker_init_fn``, bound to the process's data-parallel rank
    (``functools.partial(seed_replica_worker, replica)``): seeds the worker's Python, NumPy and
    torch generators from torch's seed for it and ``replica``. Torch's seed (the loader's base
    seed plus ``worker_id``) is the same on every process seeded alike, so without this the
    workers of two ranks draw the same random augmentations; the processes of one replica
    (tensor parallel) read the same batches and keep drawing alike."""
    import numpy as np

    words = np.random.SeedSequence([torch.initial_seed(), replica]).generate_state(4)
    torch.manual_seed((int(words[0]) << 32) | int(words[1]))
    random.seed(int(words[2]))
    np.random.seed(int(words[3]))
