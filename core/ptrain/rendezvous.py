"""Checks that bound a job's start-up: where the processes meet is looked at before anything
waits on it, so a rendezvous that can't happen ends with a sentence naming the endpoint.

torch's own waits are not all bounded: a ``TCPStore`` client whose server accepts the
connection but never answers blocks for ever (its timeout covers connecting, not the
handshake), and an unresolvable host is retried until the timeout with a warning per try.
The functions here run before those waits, each within the ``timeout`` it is given, and raise
:class:`~ptrain.errors.ConfigError` (exit 2: the endpoint is the user's input) with what was
found and the fix; ``hint`` names the option or variable the user set.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
import threading
import time
from datetime import timedelta

from ptrain.errors import ConfigError

#: Seconds given to the probe's thread beyond its own timeout before the endpoint is declared
#: silent (the store client's retries may overrun its timeout a little).
_GRACE_S = 2.0


def parse_endpoint(endpoint: str, hint: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``"[v6]:PORT"``) -> ``(host, port)``; anything else is refused."""
    host, sep, port = endpoint.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{hint} {endpoint!r} is not HOST:PORT (e.g. 10.0.0.1:29400, a port "
                          f"from 0 to 65535); give the address and port where the processes "
                          f"meet.")
    return host, int(port)


def resolve(host: str, hint: str) -> list[str]:
    """The addresses ``host`` resolves to; a name that doesn't resolve is refused at once
    (torch would retry it until its timeout)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"the rendezvous host {host!r} ({hint}) does not resolve to an "
                          f"address ({reason}), so no process can reach it; give a name or IP "
                          f"address of the machine that hosts the rendezvous (rank 0's).") from None
    return list(dict.fromkeys(info[4][0] for info in infos))


def is_this_machine(addresses: list[str]) -> bool:
    """Whether one of ``addresses`` belongs to this machine (a socket can be bound to it)."""
    for address in addresses:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((address, 0))
            return True
        except OSError:
            continue
    return False


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) resolves only to loopback addresses: an address
    every machine has for itself, so other machines can't reach this one there."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback
                               for i in infos)


def route_address(host: str) -> str | None:
    """This machine's address that traffic to ``host`` leaves from (the routing table's choice:
    a UDP socket is connected, nothing is sent), or ``None`` when there is no route."""
    try:
        address = socket.getaddrinfo(host, None, proto=socket.IPPROTO_UDP)[0][4][0]
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((address, 9))
            return s.getsockname()[0]
    except (OSError, UnicodeError):
        return None


def interfaces() -> dict[str, list[str]]:
    """This machine's network interfaces and their addresses (Linux; IPv4 primary addresses
    and IPv6 addresses), by name."""
    try:
        import fcntl
        found: dict[str, list[str]] = {name: [] for _, name in socket.if_nameindex()}
    except (ImportError, OSError):  # not a Unix: no interface table to read
        return {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in found:
            try:  # SIOCGIFADDR: the interface's IPv4 address
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
                found[name].append(socket.inet_ntoa(packed[20:24]))
            except OSError:
                pass
    try:
        with open("/proc/net/if_inet6") as table:
            for line in table:
                fields = line.split()
                if len(fields) == 6 and fields[5] in found:
                    found[fields[5]].append(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
    except OSError:
        pass
    return found


def gloo_interface(master_addr: str, across_machines: bool) -> str | None:
    """The interface gloo should use to reach the other processes, when it must be chosen;
    checks a ``GLOO_SOCKET_IFNAME`` the user set.

    gloo binds to the address the host name resolves to, falling back to loopback; where that is
    loopback (Debian and Ubuntu map the host name to 127.0.1.1) it tells the other machines to
    connect to their own 127.0.0.1, and the job waits out its timeout. So when no interface is
    set and the job spans machines, gloo gets the one that faces ``MASTER_ADDR``. ``None``:
    keep gloo's choice (one machine, or ``MASTER_ADDR`` is loopback here: no interface faces
    the others then). A set interface that doesn't exist, or a loopback one across machines,
    raises :class:`ConfigError` naming the interfaces there are."""
    table = interfaces()
    listing = ", ".join(f"{name} ({', '.join(held) or 'no address'})"
                        for name, held in table.items())
    given = os.environ.get("GLOO_SOCKET_IFNAME", "").strip()
    if given:
        for name in given.split(","):
            if table and name not in table:
                raise ConfigError(
                    f"GLOO_SOCKET_IFNAME={given!r} names the interface {name!r}, which this "
                    f"machine does not have; its interfaces: {listing}. Give the one that "
                    f"reaches the other machines, or unset the variable for ptrain to choose "
                    f"the one that faces MASTER_ADDR.")
            held = table.get(name, [])
            if across_machines and held and all(
                    ipaddress.ip_address(a.split("%")[0]).is_loopback for a in held):
                raise ConfigError(
                    f"GLOO_SOCKET_IFNAME={given!r} is the loopback interface, which other "
                    f"machines can't reach, and this job spans machines; give the interface "
                    f"that reaches them (here: {listing}), or unset the variable.")
        return None
    if not across_machines or is_loopback(master_addr):
        return None
    address = route_address(master_addr)
    return next((name for name, held in table.items() if address in held), None) \
        if address else None


def port_is_free(port: int) -> bool:
    """Whether a server could listen on ``port`` on every interface, as torch's store does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def busy_port_error(host: str, port: int, hint: str) -> ConfigError:
    """The error for a rendezvous port that another program already listens on."""
    return ConfigError(
        f"the rendezvous port {port} ({hint}, {host}:{port}) is already in use on this machine "
        f"by another program (or an earlier job still running), so this job can't host its "
        f"rendezvous there; give a free port, or end the program that holds it (e.g. "
        f"`ss -ltnp 'sport = :{port}'` names it).")


def probe_store(host: str, port: int, timeout: float, hint: str) -> None:
    """Connect to the torch store at ``host:port`` as a client and return once it answers; raise
    within ``timeout`` (plus a few seconds) when nothing listens there or what listens does not
    answer as a torch store."""
    from torch.distributed import TCPStore

    deadline = time.monotonic() + timeout
    where = f"{host}:{port} ({hint})"
    # connecting is tried here first: torch's client would log each failed try on stderr
    refused: OSError | None = None
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic())
                                     ).close()
            break
        except OSError as exc:
            refused = exc
        if time.monotonic() >= deadline:
            reason = refused.strerror or str(refused) if refused else "no answer"
            raise ConfigError(
                f"nothing answered at the rendezvous endpoint {where} within {timeout:g} s "
                f"({reason}). Start the machine that hosts the rendezvous first (with the same "
                f"endpoint), check the address, port and firewall, or raise the timeout.")
        time.sleep(0.2)

    outcome: dict[str, BaseException | bool] = {}
    remaining = max(1.0, deadline - time.monotonic())

    def attempt() -> None:
        try:
            TCPStore(host, port, is_master=False, timeout=timedelta(seconds=remaining),
                     wait_for_workers=False)
            outcome["ok"] = True
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = exc

    # the store client's handshake has no timeout of its own: it waits in a thread that is
    # abandoned (a daemon) if the endpoint never answers
    thread = threading.Thread(target=attempt, name="ptrain-rendezvous-probe", daemon=True)
    thread.start()
    thread.join(remaining + _GRACE_S)
    if outcome.get("ok"):
        return
    if thread.is_alive():
        raise ConfigError(
            f"the rendezvous endpoint {where} accepts connections but did not answer as a torch "
            f"rendezvous store within {timeout:g} s: another program listens on that port. "
            f"Give the address and port of the machine that hosts the job's rendezvous, or a "
            f"free port on this machine for it to host.")
    raise ConfigError(
        f"the rendezvous endpoint {where} accepts connections but is not a torch rendezvous "
        f"store ({_first_line(outcome.get('error'))}): another program listens on that port. "
        f"Give the address and port of the machine that hosts the job's rendezvous, or a free "
        f"port on this machine for it to host.")


def translate(exc: BaseException, host: str, port: int, timeout: float,
              hint: str) -> ConfigError | None:
    """The sentence for torch's error ``exc`` from creating or joining the store at
    ``host:port``, or ``None`` when ``exc`` is not about reaching it."""
    text = str(exc)
    if "EADDRINUSE" in text or "address already in use" in text.lower() \
            or getattr(exc, "errno", None) == errno.EADDRINUSE:
        return busy_port_error(host, port, hint)
    if any(word in text for word in ("timed out", "Timed out", "timeout")):
        return ConfigError(
            f"the processes did not meet at the rendezvous endpoint {host}:{port} ({hint}) "
            f"within {timeout:g} s ({_first_line(exc)}). Check that every process is given the "
            f"same endpoint and that rank 0's machine is up and reachable, or raise the "
            f"timeout.")
    return None


def _first_line(error: object) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text.rstrip(".")


__all__ = ["busy_port_error", "gloo_interface", "interfaces", "is_loopback", "is_this_machine",
           "parse_endpoint", "port_is_free", "probe_store", "resolve", "route_address",
           "translate"]
