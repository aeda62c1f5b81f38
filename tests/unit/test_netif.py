"""Choosing GLOO/NCCL_SOCKET_IFNAME from recorded ``ip`` output (iproute2 6.1, Debian 12)."""

from __future__ import annotations

import socket

import pytest

from phalanx.launch.netif import Route, interface_for, interface_holding, parse_route

# The rendezvous host (node 0) in a network namespace, and node 1 next to it on the same bridge.
NODE0_ROUTE_TO_SELF = "local 10.200.182.11 dev lo src 10.200.182.11 uid 0 \\    cache <local> \n"
NODE0_ADDRS = (
    "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n"
    "1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever\n"
    "2: eth0    inet 10.200.182.11/24 scope global eth0\\       valid_lft forever preferred_lft forever\n"
    "2: eth0    inet6 fe80::e83f:86ff:feb6:3812/64 scope link tentative \\       valid_lft forever preferred_lft forever\n"
)
NODE1_ROUTE_TO_NODE0 = "10.200.182.11 dev eth0 src 10.200.182.12 uid 0 \\    cache \n"
# A host with a default gateway and IPv6.
HOST_ADDRS = (
    "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n"
    "1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever\n"
    "4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever preferred_lft forever\n"
    "4: eth0    inet6 fd00::2/64 scope global nodad \\       valid_lft forever preferred_lft forever\n"
)
VIA_GATEWAY = "203.0.113.5 via 192.0.2.1 dev eth0 src 192.0.2.2 uid 0 \\    cache \n"
LOOPBACK_ALIAS = "local 127.0.0.2 dev lo src 127.0.0.1 uid 0 \\    cache <local> \n"
OWN_V6 = "local fd00::2 from :: dev lo table local proto kernel src fd00::2 metric 0 pref medium\n"


class FakeIp:
    """Answers ``ip`` commands from recorded output; records what was asked; "" for anything else
    (as the real seam does when ``ip`` fails, e.g. "Network is unreachable")."""

    def __init__(self, answers: dict[tuple[str, ...], str]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: list[str]) -> str:
        self.calls.append(tuple(argv))
        return self.answers.get(tuple(argv), "")


def route(addr: str) -> tuple[str, ...]:
    return ("ip", "-o", "route", "get", addr)


ADDRS = ("ip", "-o", "addr", "show")


def test_rendezvous_host_binds_to_the_interface_holding_its_address_not_lo():
    fake = FakeIp({route("10.200.182.11"): NODE0_ROUTE_TO_SELF, ADDRS: NODE0_ADDRS})
    assert interface_for("10.200.182.11", run=fake) == "eth0"


def test_other_hosts_use_the_routed_interface_without_listing_addresses():
    fake = FakeIp({route("10.200.182.11"): NODE1_ROUTE_TO_NODE0})
    assert interface_for("10.200.182.11", run=fake) == "eth0"
    assert fake.calls == [route("10.200.182.11")]


def test_route_through_a_gateway_names_its_device():
    assert interface_for("203.0.113.5", run=FakeIp({route("203.0.113.5"): VIA_GATEWAY})) == "eth0"


def test_loopback_alias_held_by_no_interface_stays_on_lo():
    # every "host" on 127.0.0.N of one machine: lo is right, and the only choice
    fake = FakeIp({route("127.0.0.2"): LOOPBACK_ALIAS, ADDRS: HOST_ADDRS})
    assert interface_for("127.0.0.2", run=fake) == "lo"


def test_own_ipv6_address():
    fake = FakeIp({route("fd00::2"): OWN_V6, ADDRS: HOST_ADDRS})
    assert interface_for("fd00::2", run=fake) == "eth0"


def test_no_route_or_no_ip_gives_none():
    assert interface_for("10.9.9.9", run=FakeIp({})) is None


def test_a_name_is_resolved_before_asking_for_its_route(monkeypatch):
    answers = [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::2", 0, 0, 0)),
               (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.200.182.11", 0))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **kw: answers if host == "node0" else [])
    fake = FakeIp({route("10.200.182.11"): NODE0_ROUTE_TO_SELF, ADDRS: NODE0_ADDRS})
    assert interface_for("node0", run=fake) == "eth0"
    assert fake.calls[0] == route("10.200.182.11")  # IPv4 first, as the rendezvous resolves it


def test_unresolvable_name_gives_none_without_running_ip(monkeypatch):
    def fail(*args, **kw):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", fail)
    fake = FakeIp({})
    assert interface_for("ghost", run=fake) is None
    assert fake.calls == []


@pytest.mark.parametrize("out, expected", [
    (NODE0_ROUTE_TO_SELF, Route("local", "lo")),
    (VIA_GATEWAY, Route("unicast", "eth0")),
    ("", None),
    ("unreachable 10.0.0.1 uid 0 \\    cache \n", Route("unreachable", None)),
])
def test_parse_route(out, expected):
    assert parse_route(out) == expected


def test_interface_holding_matches_exact_addresses_only():
    assert interface_holding("10.200.182.11", NODE0_ADDRS) == "eth0"
    assert interface_holding("10.200.182.12", NODE0_ADDRS) is None  # same subnet, not ours
    assert interface_holding("::1", NODE0_ADDRS) == "lo"
    assert interface_holding("10.0.0.5", "7: veth1@if6    inet 10.0.0.5/24 scope global veth1\\ ...\n") == "veth1"
