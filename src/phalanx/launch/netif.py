"""Which network interface a node's collectives should bind to (GLOO/NCCL_SOCKET_IFNAME).

The answer is the interface this host reaches the rendezvous host through, from the kernel's
routing table (``ip -o route get``). One case needs care: on the rendezvous host itself the
route to its own address is ``local ... dev lo``, and binding to ``lo`` would make it advertise
127.0.0.1 to the other hosts, which cannot reach it there. For an address of this host's own,
the interface that holds the address is the answer instead (``ip -o addr show``); only an
address that no interface holds (a 127.0.0.N alias) stays on the route's ``lo``.

Every ``ip`` call goes through one seam (``Runner``) so tests feed recorded output.
"""

from __future__ import annotations

import ipaddress
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

Runner = Callable[[list[str]], str]  # argv -> stdout ("" when the command failed)


def run_ip(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout if proc.returncode == 0 else ""


@dataclass(frozen=True)
class Route:
    kind: str  # "unicast", "local", "broadcast", ...: the first word when it names a route type
    dev: str | None


ROUTE_KINDS = frozenset({"unicast", "local", "broadcast", "multicast", "anycast", "unreachable", "blackhole", "prohibit", "throw"})


def parse_route(out: str) -> Route | None:
    """The first route of ``ip -o route get`` output, or None when there is none."""
    words = out.split()
    if not words:
        return None
    kind = words[0] if words[0] in ROUTE_KINDS else "unicast"
    dev = words[words.index("dev") + 1] if "dev" in words[:-1] else None
    return Route(kind, dev)


def interface_holding(addr: str, out: str) -> str | None:
    """The interface that ``ip -o addr show`` output lists with exactly the address ``addr``."""
    want = ipaddress.ip_address(addr)
    for line in out.splitlines():
        words = line.split()
        for family in ("inet", "inet6"):
            if family in words[:-1] and len(words) > 1:
                try:
                    held = ipaddress.ip_interface(words[words.index(family) + 1]).ip
                except ValueError:
                    continue
                if held == want:
                    return words[1].split("@")[0]
    return None


def resolve(host: str) -> str | None:
    """``host`` as an IP address: itself when it is one, else its first address from the resolver."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # IPv4 first, like the rendezvous
    return str(infos[0][4][0]) if infos else None


def interface_for(host: str, run: Runner = run_ip) -> str | None:
    """The interface to bind collectives to for reaching ``host`` (an address or a name), or None
    when this host has no route there or ``ip`` is missing. Never ``lo`` for an address that a
    real interface of this host holds."""
    addr = resolve(host)
    if addr is None:
        return None
    route = parse_route(run(["ip", "-o", "route", "get", addr]))
    if route is None:
        return None
    if route.kind == "local":
        return interface_holding(addr, run(["ip", "-o", "addr", "show"])) or route.dev
    return route.dev
