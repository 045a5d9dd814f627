"""A job across machines under ptrain's spawn launcher (``--num-nodes`` > 1 with a rendezvous
endpoint): what torch's elastic agent leaves to the program that calls it.

- **Who hosts the rendezvous.** The first machine (the endpoint's address is one of its own)
  hosts the store itself (:class:`RendezvousHost`), and every machine's agent, its own too, is
  a client of it. torch would guess from the host name whether it hosts (a name that resolves
  to 127.0.1.1 guesses wrong), and its store would close with its agent while the other
  machines' agents still close the rendezvous: a C++ warning with a stack on their stderr
  after a job that succeeded. The host keeps the store open until the others said that their
  launcher returned (:func:`say_returned`), for a bounded time.
- **A launcher cut off from the host.** torch's agent then waits in a store read that has no
  timeout (``TCPStore`` ``wait``), for ever; :func:`end_if_agent_blocked` ends the process
  with its worker's error instead.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from datetime import timedelta

from ptrain import rank_errors
from ptrain.errors import PtrainError

#: the store key each other machine's launcher adds 1 to when its agent returned
_RETURNED = "ptrain-launchers/returned"


class RendezvousHost:
    """The rendezvous store of a job across machines, hosted by this (the first) machine at the
    endpoint ``host:port`` (listening on every interface, as torch's store does)."""

    def __init__(self, store):
        self.store = store

    @classmethod
    def start(cls, host: str, port: int, timeout_s: float) -> RendezvousHost | None:
        """The store, listening; ``None`` when another process of this machine took the port
        first (two launchers started together here: that one hosts, this one is a client)."""
        from torch.distributed import TCPStore

        try:
            return cls(TCPStore(host, port, is_master=True, wait_for_workers=False,
                                timeout=timedelta(seconds=timeout_s)))
        except RuntimeError as exc:  # torch's DistNetworkError
            if "EADDRINUSE" in str(exc) or "address already in use" in str(exc).lower():
                return None
            raise

    def close_after_others(self, others: int, within: float) -> None:
        """Keep the store open until ``others`` launchers said they returned, or ``within``
        seconds have passed (a machine that failed may never say it), then close it."""
        deadline = time.monotonic() + within
        while self.store.add(_RETURNED, 0) < others and time.monotonic() < deadline:
            time.sleep(0.05)
        self.store = None  # closes the server


def say_returned(host: str, port: int, within: float) -> None:
    """Tell the hosting machine that this machine's launcher returned; given up after
    ``within`` seconds (the host may be gone: nothing waits for this then)."""
    def tell() -> None:
        from torch.distributed import TCPStore

        try:
            TCPStore(host, port, is_master=False, wait_for_workers=False,
                     timeout=timedelta(seconds=within)).add(_RETURNED, 1)
        except Exception:  # the host has closed: it no longer waits
            pass

    thread = threading.Thread(target=tell, name="ptrain-launcher-returned", daemon=True)
    thread.start()
    thread.join(within)


def end_if_agent_blocked(error_dir: str, returned: threading.Event, grace: float) -> None:
    """(A thread of a machine's launcher.) Once a worker has failed, wait ``grace`` seconds for
    torch's agent to return; then print that worker's error as the CLI would and end this
    process with the CLI's exit code (2 for a usage error, else 1)."""
    while not returned.wait(0.5):
        records = rank_errors.read_records(error_dir)
        if records:
            break
    else:
        return
    if returned.wait(grace):
        return
    error = rank_errors.error_of(records[0])
    usage = isinstance(error, PtrainError)
    print(f"ptrain: {'error: ' if usage else ''}{error}\nptrain: this machine's launcher was "
          f"still waiting on the rendezvous's machine {grace:g} s after its workers ended (it "
          f"can't be reached); exiting.", file=sys.stderr, flush=True)
    shutil.rmtree(error_dir, ignore_errors=True)
    os._exit(2 if usage else 1)


__all__ = ["RendezvousHost", "end_if_agent_blocked", "say_returned"]
