"""The suite's own parallel runs (tests/parallel.py) and the free ports they depend on."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

import pytest

from phalanx.backends.base import free_port


def test_free_ports_come_from_below_the_ephemeral_range_and_are_bindable():
    """A port-0 listener (gloo's pair sockets, another TCPStore) or an outgoing connection takes
    ephemeral ports: the rendezvous port phalanx hands to torchrun is never one of those."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
        low = int(fh.read().split()[0])
    if low < 11000:
        pytest.skip(f"the ephemeral range starts at {low}: no room below it, free_port takes the kernel's choice")
    ports = [free_port() for _ in range(20)]
    assert all(10000 <= p < low for p in ports), ports
    assert len(set(ports)) > 1, "random: two jobs started at once do not get the same port"
    for port in ports[:3]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


@dataclass
class Item:
    nodeid: str
    fixturenames: list[str] = field(default_factory=list)


def test_files_sharing_a_daemon_must_be_grouped():
    pytest.importorskip("xdist")
    from tests import parallel

    grouped = [Item("tests/web/test_api.py::a", ["demo"]), Item("tests/web/test_browser.py::b", ["demo_env", "demo"]),
               Item("tests/cluster/test_ray.py::c", ["ray_cluster"]), Item("tests/cluster/test_ray.py::d", ["ray_cluster"])]
    parallel.check_groups(grouped)
    assert parallel.scope("tests/web/test_api.py") == parallel.scope("tests/web/test_browser.py") == "demo"
    assert parallel.scope("tests/cluster/test_ray.py") == "tests/cluster/test_ray.py"
    stray = [*grouped, Item("tests/web/test_new.py::e", ["demo"])]
    with pytest.raises(pytest.UsageError, match=r"test_new.py.*GROUPS\['demo'\]"):
        parallel.check_groups(stray)


def test_the_whole_suite_is_grouped_as_its_parallel_run_needs():
    """Collecting the whole suite runs ``check_groups`` as CI's parallel run does: a new test file
    that uses a shared daemon (the private PostgreSQL, moto's S3 ...) and is not in its group fails
    here, in the unit tier, instead of every worker of the full run crashing at its first test."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "tests collected" in done.stdout, (done.stdout + done.stderr)[-2000:]
