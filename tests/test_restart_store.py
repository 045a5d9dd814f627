"""One try of a torchrun job gets keys of its own in a store that outlives it
(:mod:`ptrain.restart_store`), on a real TCPStore with one client per rank."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from ptrain.errors import ConfigError
from ptrain.restart_store import try_prefix

WORLD = 3


@pytest.fixture
def host_store():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    yield store


def client(host_store) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", host_store.port, is_master=False,
                         timeout=timedelta(seconds=30))


def start_ranks(host_store, ranks, results: dict, timeout: float = 30.0) -> list[threading.Thread]:
    def rank_main(rank: int) -> None:
        try:
            results[rank] = try_prefix(client(host_store), rank, WORLD, timeout)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            results[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(rank,), daemon=True) for rank in ranks]
    for thread in threads:
        thread.start()
    return threads


def run_try(host_store) -> dict:
    results: dict = {}
    for thread in start_ranks(host_store, range(WORLD), results):
        thread.join(60)
    return results


def test_every_rank_of_a_try_gets_the_same_prefix_and_the_next_try_another(host_store):
    first = run_try(host_store)
    assert len(set(first.values())) == 1 and all(isinstance(p, str) for p in first.values())
    second = run_try(host_store)
    assert len(set(second.values())) == 1 and all(isinstance(p, str) for p in second.values())
    assert first[0] != second[0]


def test_ranks_that_start_before_rank_0_do_not_settle_on_the_previous_try(host_store):
    """The ranks of the second try first read the first try's published number (rank 0 of the
    second try has not started): they must wait for the new one, not take the old."""
    first = run_try(host_store)[0]
    watcher = client(host_store)
    old_tokens = {rank: watcher.get(f"{first}token/{rank}") for rank in range(1, WORLD)}
    results: dict = {}
    others = start_ranks(host_store, range(1, WORLD), results)
    # wait on the condition that proves they read the old number: they rewrote their tokens there
    watcher.wait([f"{first}token/{rank}" for rank in range(1, WORLD)])
    while any(watcher.get(f"{first}token/{rank}") == old_tokens[rank]
              for rank in range(1, WORLD)):
        threading.Event().wait(0.01)
    assert not results, "a rank settled before rank 0 of its try started"
    leader = start_ranks(host_store, [0], results)
    for thread in others + leader:
        thread.join(60)
    assert set(results) == set(range(WORLD))
    assert len(set(results.values())) == 1 and results[0] != first


def test_rank_0_names_the_ranks_that_never_came(host_store):
    results: dict = {}
    for thread in start_ranks(host_store, [0, 1], results, timeout=1.0):
        thread.join(60)
    assert isinstance(results[0], ConfigError)
    assert "rank 2 of this torchrun try did not start" in str(results[0])
