"""Separate "machines" on one Linux host, for the multi-node tests (issue 37): each node is a
network namespace with its own address on one link the harness makes, so a process in one node
reaches the other only through that address (its 127.0.0.1 is its own, as on real hosts), and
its own host name (a UTS namespace per process tree). Each node's ``/etc/hosts`` (``ip netns
exec`` puts ``/etc/netns/NAME/hosts`` in its place) names every other node, and maps the node's
own name to 127.0.1.1 only, as Debian and Ubuntu install it (and answers the reverse lookups a DNS server
would): a host name that resolves to loopback, the
case where torch's guesses of the address to publish go wrong.

:func:`nodes` makes them and always removes them (every process still inside is killed first);
:func:`unavailable` says why they can't be made here (not Linux, no ``ip``, not root, a kernel or
container that refuses), for a skip with the reason. The names and the subnet carry this
process's id, so that two suites on one machine don't meet.

Nothing here fakes the network: the processes are ordinary ones started under
``ip netns exec``; packets cross a veth pair, and :meth:`Node.cut` takes a node's link down.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: where ``ip netns exec`` finds a namespace's own files for /etc
ETC_NETNS = Path("/etc/netns")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=60)


@dataclass
class Node:
    """One network namespace with one address (``address``) on the link ``device``."""

    name: str  # the namespace's and the host name
    address: str
    device: str

    def command(self, argv: Sequence[str], disks: Mapping[Path, Path] | None = None
                ) -> list[str]:
        """``argv`` run inside this node, under its host name; ``disks`` maps a path to the
        folder this node sees there (bind-mounted in the node's own mount namespace, which
        ``ip netns exec`` makes): a node-local disk at a path every node uses."""
        mounts = "".join(f"mount --bind {shlex.quote(str(own))} {shlex.quote(str(path))} && "
                         for path, own in (disks or {}).items())
        return ["ip", "netns", "exec", self.name, "unshare", "--uts", "--", "sh", "-c",
                mounts + 'hostname "$0" && exec "$@"', self.name, *argv]

    def popen(self, argv: Sequence[str], disks: Mapping[Path, Path] | None = None,
              **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside this node (see :meth:`command`), in its own session (for
        killing its whole group)."""
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(self.command(argv, disks), **kwargs)

    def listens_on(self, port: int) -> bool:
        """Whether a process inside this node listens on TCP ``port``."""
        out = _ip("netns", "exec", self.name, "ss", "-Hltn", f"sport = :{port}",
                  check=False).stdout
        return bool(out.strip())

    def pids(self) -> list[int]:
        """Every process inside this node now."""
        out = _ip("netns", "pids", self.name, check=False).stdout
        return [int(p) for p in out.split()]

    def kill(self) -> None:
        """SIGKILL every process inside this node, all stopped first: the machine is gone at
        once. (Killed one by one, a process could see another die first: torch's spawn gives
        each worker SIGINT when its launcher dies.)"""
        pids = self.pids()
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    def cut(self) -> None:
        """Take this node's link down: its processes live on, but reach no other node."""
        _ip("-n", self.name, "link", "set", self.device, "down")


def unavailable() -> str | None:
    """Why network namespaces can't be made here, or ``None`` when they can."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux's ({sys.platform} has none)"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"the `{tool}` command ({package}) is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root (CI runs as root)"
    probe = f"ptprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@contextmanager
def nodes(count: int = 2) -> Iterator[list[Node]]:
    """``count`` nodes on one link (a veth pair for two, a bridge for more): node ``i`` has the
    address ``10.X.Y.(i+1)`` in a /24 of this process's; on exit every process still inside is
    killed and the nodes are removed."""
    tag = uuid.uuid4().hex[:6]
    subnet = f"10.{200 + os.getpid() % 50}.{int(tag[:2], 16)}"
    made: list[Node] = []
    bridge = f"ptb{tag}"
    try:
        if count > 2:
            _ip("link", "add", bridge, "type", "bridge")
            _ip("link", "set", bridge, "up")
        for i in range(count):
            node = Node(f"pt{tag}n{i}", f"{subnet}.{i + 1}", f"pt{tag}v{i}")
            _ip("netns", "add", node.name)
            made.append(node)
            _ip("-n", node.name, "link", "set", "lo", "up")
        if count == 2:
            a, b = made
            _ip("link", "add", a.device, "netns", a.name, "type", "veth", "peer", "name",
                b.device, "netns", b.name)
        else:
            for node in made:
                outside = f"pt{tag}h{made.index(node)}"
                _ip("link", "add", node.device, "netns", node.name, "type", "veth", "peer",
                    "name", outside)
                _ip("link", "set", outside, "master", bridge)
                _ip("link", "set", outside, "up")
        for node in made:
            _ip("-n", node.name, "addr", "add", f"{node.address}/24", "dev", node.device)
            _ip("-n", node.name, "link", "set", node.device, "up")
            _ip("-n", node.name, "route", "add", "default", "dev", node.device)
            folder = ETC_NETNS / node.name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(
                f"127.0.0.1 localhost\n127.0.1.1 {node.name}\n"
                + "".join(f"{other.address} {other.name}\n" for other in made
                          if other is not node)
                # torch's store looks up its clients as IPv4-mapped IPv6 addresses; with no
                # answer (no DNS server is reachable) it warns at every connection
                + "".join(f"::ffff:{other.address} {other.name}\n" for other in made))
        yield made
    finally:
        for node in made:
            node.kill()
        for node in made:
            _ip("netns", "del", node.name, check=False)
            shutil.rmtree(ETC_NETNS / node.name, ignore_errors=True)
        if count > 2:
            _ip("link", "del", bridge, check=False)


__all__ = ["Node", "nodes", "unavailable"]
