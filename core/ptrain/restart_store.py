"""Keys of one try of a torchrun job, in a store that outlives the try.

Under torchrun's c10d rendezvous (torch 2.5 on) the agent on the first machine hosts one
TCPStore for the whole life of the job, and the training processes of every try (each restart
after ``--max-restarts``) meet in it under the same keys: torch keeps no prefix per try, and the
restart count it used to keep them apart differs between machines (torch issue 135712). What a
try wrote stays in the store, so a process of the next try can read a dead peer's gloo or NCCL
address and fail with "Connection refused", or take a dead peer's heartbeat for a live one.

:func:`try_prefix` gives the processes of one try a prefix of their own. Every process of the
previous try is gone before the next one starts (the agents stop their workers before they meet
again), but keys cannot say which try wrote them; so the first rank claims a fresh number and
the others prove that they read the live claim:

1. rank 0 takes the next number from a counter in the store and publishes it;
2. every other rank reads the published number, writes a random token under it, and waits for
   the list of tokens rank 0 writes under that number once every rank has written one;
3. a rank whose token is not in that list read the previous try's number: it reads again.

A number is published only by the live rank 0 and the list under it names only live tokens, so
no rank settles on a previous try's keys.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta
from typing import Any

from ptrain.errors import ConfigError

_COUNTER = "ptrain/tries"
_PUBLISHED = "ptrain/try"
#: How long a rank waits for the list under the number it read before it reads the number again.
_RECHECK_S = 0.5


def outlives_tries() -> bool:
    """Whether this process's torchrun agent hosts the store that its next try will meet in too
    (``TORCHELASTIC_USE_AGENT_STORE``, unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` was given
    to torchrun, which makes rank 0 host a new store for each try)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def try_prefix(store: Any, rank: int, world_size: int, timeout: float) -> str:
    """The key prefix that every rank of this try gets, and no rank of another try: call it on
    every rank with a client of the shared store. Raises :class:`ConfigError` when a rank does
    not come within ``timeout`` seconds (rank 0 names the ranks it waited for)."""
    import torch.distributed as dist

    deadline = time.monotonic() + timeout
    if rank == 0:
        number = store.add(_COUNTER, 1)
        base = f"{_PUBLISHED}-{number}"
        store.set(_PUBLISHED, str(number))
        tokens = []
        for peer in range(1, world_size):
            key = f"{base}/token/{peer}"
            try:
                store.wait([key], timedelta(seconds=max(0.1, deadline - time.monotonic())))
            except dist.DistStoreError:
                missing = [str(r) for r in range(peer, world_size)
                           if not store.check([f"{base}/token/{r}"])]
                raise ConfigError(
                    f"rank{'s' if len(missing) > 1 else ''} {', '.join(missing)} of this "
                    f"torchrun try did not start training within {timeout:g} s of rank 0; "
                    f"see their machines' output for why (the agents restart the job if "
                    f"restarts are left).") from None
            tokens.append(store.get(key).decode())
        store.set(f"{base}/tokens", " ".join(tokens))
        return f"{base}/"
    token = uuid.uuid4().hex
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ConfigError(
                f"the ranks of this torchrun try did not all start training within {timeout:g} s "
                f"(rank 0 names those it waited for); see the machines' output for why.")
        try:
            store.wait([_PUBLISHED], timedelta(seconds=max(0.1, remaining)))
        except dist.DistStoreError:
            continue
        base = f"{_PUBLISHED}-{store.get(_PUBLISHED).decode()}"
        store.set(f"{base}/token/{rank}", token)
        try:
            store.wait([f"{base}/tokens"], timedelta(seconds=_RECHECK_S))
        except dist.DistStoreError:
            continue
        if token in store.get(f"{base}/tokens").decode().split():
            return f"{base}/"
        time.sleep(_RECHECK_S / 10)  # the previous try's number: this try's rank 0 is not there yet
